#pragma once
// The hidden-state store's side of the remote tier: how a pool entry becomes a write-behind
// value (its blocks borrowed, no copy on the caller's thread) and how a fetched value fills a
// fresh entry. The store keeps the policy (when to write, when to read through); this file keeps
// the byte plumbing out of hidden_state_store.cpp.
//
// Thread safety: free functions over the caller's objects; StoreRemote may be used from many
// threads at once (RemoteTier's rules apply: fetch/contains block on the network, bounded by the
// timeout; write_behind never does).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "pool/block_pool.hpp"
#include "hss/remote_stats.hpp"
#include "tiers/remote/remote_tier.hpp"
#include "index/store_index.hpp"

namespace hss::detail {

/// The entry's payload as pieces of its blocks, in order (entries fill whole blocks but the last).
[[nodiscard]] std::vector<std::span<const std::byte>> entry_pieces(const Entry& entry,
                                                                   const BlockPool& pool);
/// Copies a fetched payload into the entry's blocks (sizes must match: InvalidArgument).
void fill_entry(const Entry& entry, const BlockPool& pool, std::span<const std::byte> payload);

class StoreRemote {
 public:
  /// No tier when the config has no URL; ConfigError when it has one but the build has no tier.
  /// `pin_budget_bytes`: how much of the pool queued writes may keep from eviction (see
  /// write_behind).
  StoreRemote(const Config& config, uint64_t pin_budget_bytes)
      : pin_budget_(pin_budget_bytes), tier_(RemoteTier::create(config)) {}

  [[nodiscard]] bool enabled() const { return tier_ != nullptr; }

  /// Queues a published entry under its slot's remote key (no-op without a tier). While the
  /// bytes pinned by queued writes stay within the pin budget, the tier borrows the entry's
  /// granules (no copy on this thread; the entry cannot be evicted until sent) and waits for its
  /// device copy (fence) before reading; a failed copy drops the write. Beyond the budget (the
  /// writer lags behind the stores) a host entry is copied into the queue now, so the pool stays
  /// evictable, and a device entry whose copy is still in flight is dropped (counted) rather than
  /// waited for. Never throws: out of memory drops the write (counted), as a full queue does.
  void write_behind(const CacheEngineKey& key, const EntryRef& entry,
                    const BlockPool& pool) noexcept;

  [[nodiscard]] std::vector<std::optional<RemoteValue>> fetch(
      std::span<const RemoteRequest> requests) {
    return tier_->fetch(requests);
  }
  void fetch_each(std::span<const RemoteRequest> requests,
                  const std::function<void(size_t, const RemoteValue&)>& on_value) {
    tier_->fetch_each(requests, on_value);
  }
  [[nodiscard]] std::vector<bool> contains(std::span<const RemoteRequest> requests) {
    return tier_->contains(requests);
  }
  void count_read_through(uint64_t entries) {
    read_through_.fetch_add(entries, std::memory_order_relaxed);
  }
  void flush() {
    if (tier_) tier_->flush();
  }
  [[nodiscard]] RemoteStats stats() const;

 private:
  const uint64_t pin_budget_;
  std::atomic<uint64_t> pinned_bytes_{0};  // before tier_: outlives the pins the queue holds
  std::unique_ptr<RemoteTier> tier_;
  std::atomic<uint64_t> read_through_{0};
};

}  // namespace hss::detail
