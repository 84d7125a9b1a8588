#pragma once
// Counters of one backing tier (the local disk tier, the Redis/Valkey tier), in one shape
// for every tier: HiddenStateStats::tiers lists them in the order a retrieve asks them.
// A plain value: safe to copy and read from any thread.

#include <cstdint>
#include <string>
#include <vector>

#include "hss/detail/stats_fields.hpp"

namespace hss {

struct TierStats {
  std::string name;  ///< the tier's name: "device" (device-resident tier), "disk" (local files), "remote" (Redis/Valkey)
  uint64_t hits = 0;       ///< (chunk, slot) values fetched and checked
  uint64_t misses = 0;     ///< values asked for and not returned (absent, down, corrupt)
  uint64_t corrupt_values = 0;          ///< present but failing a check (also in misses)
  uint64_t unauthenticated_values = 0;  ///< failing the MAC (also in corrupt_values and misses)
  uint64_t bytes_read = 0;              ///< payload bytes of the hits
  uint64_t promotions = 0;  ///< values a retrieve copied into the pool (read-through)
  uint64_t writes_enqueued = 0;
  uint64_t writes_done = 0;  ///< written (a server acknowledged, a file landed)
  uint64_t bytes_written = 0;
  uint64_t dropped_writes = 0;  ///< over the queue budget, the tier down or failing, closed
  uint64_t errors = 0;          ///< I/O and connection failures, timeouts, error replies
  uint64_t queue_bytes = 0;     ///< payload bytes waiting to be written now
  uint64_t entries_held = 0;    ///< values the tier holds, where it knows (a shared server: 0)
  uint64_t bytes_held = 0;      ///< their payload bytes, where it knows (a shared server: 0)
  /// How the tier reads its values now. The disk tier: "direct" (O_DIRECT, no page cache) or
  /// "buffered" (through the page cache: direct reads off, or the directory refused O_DIRECT at
  /// its probe or at a read, after which it stays "buffered"). Empty for a tier without the
  /// choice (the remote tier).
  std::string read_mode;
  /// Values the tier dropped for its own room while the pool kept them (the `device` tier: device
  /// copies dropped for device-pool pressure, their host entries stay); 0 for the other tiers.
  uint64_t evictions = 0;
};

/// TierStats's fields, each once, in the order stats() reports them (hss/detail/stats_fields.hpp).
template <detail::MaybeConst<TierStats> Self, class Visit>
constexpr void for_each_field(Self& s, Visit&& visit) {
  visit("name", s.name);
  visit("hits", s.hits);
  visit("misses", s.misses);
  visit("corrupt_values", s.corrupt_values);
  visit("unauthenticated_values", s.unauthenticated_values);
  visit("bytes_read", s.bytes_read);
  visit("promotions", s.promotions);
  visit("writes_enqueued", s.writes_enqueued);
  visit("writes_done", s.writes_done);
  visit("bytes_written", s.bytes_written);
  visit("dropped_writes", s.dropped_writes);
  visit("errors", s.errors);
  visit("queue_bytes", s.queue_bytes);
  visit("entries_held", s.entries_held);
  visit("bytes_held", s.bytes_held);
  visit("read_mode", s.read_mode);
  visit("evictions", s.evictions);
}

/// What HiddenStateStore::coverage_by_tier found: the prefix coverage(..., kAllTiers)
/// counts, and which tier holds each of its chunks. Values a tier holds are unchecked (as
/// coverage's), so a retrieve may still stop short where one turns out corrupt.
struct TierCoverage {
  int64_t tokens = 0;  ///< == coverage(chunks, slots, CoverageScope::kAllTiers)
  /// One per chunk of that prefix, in order: "device" when every slot has a device copy (the
  /// device-resident tier), "host" when the pool holds every slot, else the name
  /// of the last tier in retrieve order that a read-through would promote one of its slots from
  /// ("disk", "remote"): the slowest read the chunk needs.
  std::vector<std::string> chunk_tiers;
};

}  // namespace hss
