#pragma once
// The store's read side of its backing tiers (tiers/tier_chain.hpp): read-through before a
// retrieve's walk, and coverage counting the values a tier holds. (Write-behind is one call at
// the end of the write pipeline.) Nothing here knows which tiers there are.
//
// Locks: the index mutex is never held across a fetch. Values arrive in a tier's callback,
// possibly under that tier's own read lock (the Redis tier's per-server lock); inserting one
// takes the index mutex briefly (lock order: a tier's read lock, then the index mutex, then the
// pool's free-stack mutex).

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hss/tier_stats.hpp"
#include "store/store_state.hpp"

namespace hss::detail {

class ReadPipeline;

class TierReadThrough {
 public:
  explicit TierReadThrough(StoreState& store) : store_(store) {}

  /// Read-through: from the first chunk whose slots are not all local, up to the first chunk
  /// without KV, fetches the missing (chunk, slot) values from the tiers in order (each tier
  /// asked once, for what the tiers before it did not have) and inserts each into the pool as
  /// it arrives. The walk that follows decides the prefix. Returns the entries inserted.
  /// `kv_answers` (optional): the call's KV answers, which the walk then reuses. `widths`
  /// (optional, per slot, 0: unknown): the cols of the caller's outputs; a tier is asked for
  /// values of that width only (a slot without one: the width of an entry of it this prefix
  /// holds, else any).
  size_t read_through(std::span<const Chunk> chunks, std::span<const Slot> slots,
                      KvAnswers* kv_answers = nullptr, std::span<const int64_t> widths = {});
  /// `local` (the pool's coverage of these chunks and slots) extended by the values some tier
  /// holds (CoverageScope::kAllTiers). Builds no tier names.
  int64_t coverage_with_tiers(std::span<const Chunk> chunks, std::span<const Slot> slots,
                              int64_t local) const;
  /// The same prefix, with the tier each of its chunks is read from (hss/tier_stats.hpp).
  TierCoverage coverage_by_tier(std::span<const Chunk> chunks, std::span<const Slot> slots,
                                int64_t local) const;

 private:
  /// Names "device" the chunks of the pool's prefix `chunks` whose every slot has a device copy
  /// (the device-resident tier). Takes the index lock.
  void name_device_chunks(std::span<const Chunk> chunks, std::span<const Slot> slots,
                          std::vector<std::string>& chunk_tiers) const;
  /// The one walk of both: the prefix's tokens; the tier name of each of its chunks appended to
  /// `chunk_tiers` when given (assigned: "host" for the pool's prefix first).
  int64_t coverage_walk(std::span<const Chunk> chunks, std::span<const Slot> slots, int64_t local,
                        std::vector<std::string>* chunk_tiers) const;

  enum class InsertResult { kInserted, kPresent, kNoRoom };
  /// One fetched value as a READY entry, evicting LRU keys not guarded by `guard` for space.
  InsertResult insert_fetched(const Chunk& chunk, Slot slot, const TierValue& value,
                              uint64_t guard);

  StoreState& store_;
};

}  // namespace hss::detail
