#include "tiers/remote/store_remote.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <new>
#include <string>

#include "format/dtype_codes.hpp"
#include "hss/error.hpp"

namespace hss::detail {

std::vector<std::span<const std::byte>> entry_pieces(const Entry& entry, const BlockPool& pool) {
  std::vector<std::span<const std::byte>> pieces;
  pieces.reserve(entry.blocks.size());
  uint64_t left = entry.payload_bytes();
  const uint64_t block_bytes = pool.granule_bytes();
  for (const uint32_t id : entry.blocks) {
    if (left == 0) break;
    const uint64_t n = std::min(left, block_bytes);
    pieces.emplace_back(pool.block_address(id), static_cast<size_t>(n));
    left -= n;
  }
  return pieces;
}

void fill_entry(const Entry& entry, const BlockPool& pool, std::span<const std::byte> payload) {
  if (payload.size() != entry.payload_bytes()) {
    throw InvalidArgument("payload of " + std::to_string(payload.size()) +
                          " bytes for an entry of " + std::to_string(entry.payload_bytes()));
  }
  size_t at = 0;
  const uint64_t block_bytes = pool.granule_bytes();
  for (const uint32_t id : entry.blocks) {
    if (at == payload.size()) break;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(payload.size() - at, block_bytes));
    std::memcpy(pool.block_address(id), payload.data() + at, n);
    at += n;
  }
}

namespace {

// A queued write's hold on an entry: keeps its granules and counts them against the pin budget.
struct EntryPin {
  EntryPin(EntryRef e, std::atomic<uint64_t>& counter, uint64_t n)
      : entry(std::move(e)), pinned(counter), bytes(n) {}
  ~EntryPin() { pinned.fetch_sub(bytes, std::memory_order_relaxed); }
  EntryPin(const EntryPin&) = delete;
  EntryPin& operator=(const EntryPin&) = delete;

  EntryRef entry;
  std::atomic<uint64_t>& pinned;
  uint64_t bytes;
};

}  // namespace

void StoreRemote::write_behind(const CacheEngineKey& key, const EntryRef& entry,
                               const BlockPool& pool) noexcept {
  if (!tier_) return;
  const uint64_t bytes = entry->payload_bytes();
  bool pin = false, owned = false;
  try {
    const RemoteWrite write{key,
                            std::string(to_string(entry->slot.kind)),
                            entry->slot.layer_idx,
                            to_dtype(entry->storage),
                            entry->rows,
                            entry->cols};
    uint64_t pinned = pinned_bytes_.load(std::memory_order_relaxed);
    while (pinned + bytes <= pin_budget_) {
      if (pinned_bytes_.compare_exchange_weak(pinned, pinned + bytes,
                                              std::memory_order_relaxed)) {
        pin = true;
        break;
      }
    }
    if (pin) {
      auto owner = std::make_shared<EntryPin>(entry, pinned_bytes_, bytes);
      owned = true;  // the pin's bytes go back with the owner, whatever happens below
      std::function<bool()> ready;
      if (entry->fence) ready = [fence = entry->fence] { return fence->wait(); };
      (void)tier_->enqueue_write(write, entry_pieces(*entry, pool), std::move(owner),
                                 std::move(ready));
    } else if (!entry->fence || (entry->fence->ready() && entry->fence->landed())) {
      (void)tier_->enqueue_write(write, entry_pieces(*entry, pool));  // copied now
    } else {
      tier_->count_dropped(1);
    }
  } catch (const std::bad_alloc&) {
    // Best effort, as a full queue is: the entry is stored locally; the write is dropped and
    // counted, never an exception out of a store that already published its rows.
    if (pin && !owned) pinned_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    tier_->count_dropped(1);
  }
}

RemoteStats StoreRemote::stats() const {
  if (!tier_) return {};
  RemoteStats s = tier_->stats();
  s.read_through_chunks = read_through_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace hss::detail
