#pragma once
// The ordered chain of backing tiers behind the pool (tiers/backing_tier.hpp): the one object
// the store's pipelines talk to about tiers. The store keeps the policy of *when* (write-behind
// after a store publishes, read-through before a retrieve's walk, coverage that counts tiers);
// the chain keeps *how*: which tier is asked in which order, how a pool entry is lent to a
// tier's write queue, the counters in one shape.
//
//   write-behind   every published entry goes to every tier (as LMCache puts to every backend):
//                  the entry's granules are lent (no copy on the caller's thread) within a pin
//                  budget shared by the tiers, copied into the tier's queue beyond it.
//   read-through   tier 0 is asked for every missing value, tier 1 for those tier 0 did not
//                  have, and so on: the first tier holding a value serves it (promotion).
//   coverage       a value counts when any tier says it holds it.
//
// Thread safety: every method may be called from many threads at once, except close (once, by
// the store's close) and the destructor. write_behind never blocks; fetch_each and contains
// block on the tiers' I/O (each bounded by its tier's timeout); no store lock is held by callers.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "hss/tier_stats.hpp"
#include "index/store_index.hpp"
#include "pool/block_pool.hpp"
#include "tiers/backing_tier.hpp"

namespace hss::detail {

class TierChain {
 public:
  /// `tiers` in the order a retrieve asks them (empty: no tier, every call a no-op).
  /// `pin_budget_bytes`: how many pool bytes queued writes may keep from eviction (write_behind).
  TierChain(std::vector<std::unique_ptr<BackingTier>> tiers, uint64_t pin_budget_bytes);
  /// Closes the tiers (each finishes or drops what it queued) before the pool goes.
  ~TierChain();
  TierChain(const TierChain&) = delete;
  TierChain& operator=(const TierChain&) = delete;

  [[nodiscard]] bool empty() const noexcept { return tiers_.empty(); }
  [[nodiscard]] size_t size() const noexcept { return tiers_.size(); }

  /// Queues a published entry to every tier. While the bytes pinned by queued writes stay
  /// within the pin budget, a tier borrows the entry's granules (the entry cannot be evicted
  /// until written) and waits for its device copy (fence) before reading; a failed copy drops
  /// the write. Beyond the budget (the writers lag behind the stores) a host entry is copied into
  /// the tier's queue now, so the pool stays evictable, and a device entry whose copy is still
  /// in flight is dropped (counted) rather than waited for. Never throws: out of memory drops
  /// the write (counted), as a full queue does.
  void write_behind(const CacheEngineKey& key, const EntryRef& entry,
                    const BlockPool& pool) noexcept;

  /// Read-through over the tiers in order. `promote(i, value)` copies a value into the pool and
  /// says whether it did (false: the pool had no room, or the slot was filled meanwhile); a
  /// request answered by a tier is not asked of the next, promoted or not. Returns the values
  /// promoted (counted per tier in TierStats::promotions).
  size_t fetch_each(std::span<const TierRequest> requests,
                    const std::function<bool(size_t, const TierValue&)>& promote);
  /// Per request, whether some tier holds it (a later tier is asked only the rest).
  [[nodiscard]] std::vector<bool> contains(std::span<const TierRequest> requests);
  /// Per request, the chain index of the first tier that holds it (the one a read-through would
  /// promote it from), or kNotHeld; asked as contains() asks (a later tier only the rest). What
  /// coverage's "which tier holds each chunk" is built from.
  static constexpr int32_t kNotHeld = -1;
  [[nodiscard]] std::vector<int32_t> locate(std::span<const TierRequest> requests);
  /// The KV of these chunks is gone: every tier may drop their values (tiers/backing_tier.hpp).
  void discard(std::span<const CacheEngineKey> keys) noexcept;

  /// Waits until every tier has finished or dropped what was queued before the call.
  void flush();
  /// Every tier stops taking writes after finishing what it queued. Idempotent.
  void close();

  /// One TierStats per tier, in chain order.
  [[nodiscard]] std::vector<TierStats> stats() const;
  /// Tier `t` (chain order), for what only its kind has (store/backing_tiers.cpp).
  [[nodiscard]] const BackingTier& tier(size_t t) const { return *tiers_.at(t); }
  /// Values tier `t` served that a retrieve copied into the pool.
  [[nodiscard]] uint64_t promotions(size_t t) const {
    return promotions_[t].load(std::memory_order_relaxed);
  }

 private:
  void write_to(BackingTier& tier, const TierWrite& write, const EntryRef& entry,
                const BlockPool& pool) noexcept;

  const uint64_t pin_budget_;
  std::atomic<uint64_t> pinned_bytes_{0};  // before tiers_: outlives the pins their queues hold
  std::vector<std::unique_ptr<BackingTier>> tiers_;
  std::unique_ptr<std::atomic<uint64_t>[]> promotions_;  // one per tier
};

}  // namespace hss::detail
