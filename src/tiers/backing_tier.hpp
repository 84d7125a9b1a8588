#pragma once
// The tier seam: what a backing tier implements. A backing tier keeps encoded hidden-state
// values (one per (chunk key, slot)) behind the pool: the local disk tier (tiers/disk/) and the
// Redis/Valkey tier (tiers/remote/) now. The store never talks to a tier directly; it talks to
// the TierChain (tiers/tier_chain.hpp), which asks the tiers in order.
//
// A new tier:
//   adds     tiers/<name>/ (a class implementing BackingTier whose enqueue_write hands its
//            values to the shared write-behind queue, tiers/write_behind.hpp, and supplies the
//            I/O; its tests in tests/tiers/);
//   touches  store/backing_tiers.cpp (one row of kTierMakers: the one place a config becomes
//            the ordered list of tiers), config/config_keys.cpp (its keys, one row each),
//            src/CMakeLists.txt (its folder, one row of the layers);
//   never    the store's write or read pipeline, the index, the pool, or the store's stats (its
//            TierStats row is stats(); anything more it shows itself: add_store_view).
//
// What the chain guarantees a tier:
//   * enqueue_write is called after the entry was published, with the entry's bytes borrowed
//     (owner) or to be copied now (no owner); it must not block on I/O.
//   * contains / fetch_each are called with no store lock held; they may block on I/O, bounded
//     by the tier's own timeout. A value passed to on_value was checked by the tier (the value
//     codec's header and checksum, the MAC when a key is set): the store copies it into the pool
//     as it is.
//   * Only chunks whose KV is present are asked for (coupled eviction stays lazy: a value whose
//     KV is gone is never read; discard tells a tier it may drop one).
//
// Thread safety: every method may be called from many threads at once, except close(), which
// the store calls once, after its last write. What blocks, per tier: docs/design.md, "Tier
// machinery: the shared write-behind queue and the seam" (and its blocking table, "What may run
// concurrently and what may block the host").

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "hss/activation.hpp"
#include "hss/cache_key.hpp"
#include "hss/tensor.hpp"
#include "hss/tier_stats.hpp"
#include "format/row_format.hpp"

namespace hss {
struct HiddenStateStats;
}  // namespace hss

namespace hss::detail {

/// One (chunk, slot) value asked of a tier.
struct TierRequest {
  CacheEngineKey key;
  Slot slot;
  int64_t rows = 0;  ///< expected rows; 0 accepts any
  int64_t cols = 0;  ///< expected cols; 0 accepts any
  /// The most payload bytes the asker can take (a read-through: its pool's), bounding what a
  /// tier reads where `cols` is 0; 0: no bound of the asker's.
  uint64_t max_bytes = 0;
};

/// A checked value. payload stays valid while `owner` lives (or, from fetch_each with no owner,
/// during the callback only).
struct TierValue {
  RowFormat format;  ///< how the payload's rows are encoded (FP8: codes + trailing row scales)
  int64_t rows = 0;
  int64_t cols = 0;
  std::span<const std::byte> payload;
  std::shared_ptr<const void> owner;
};

/// What a write needs besides its bytes.
struct TierWrite {
  CacheEngineKey key;
  Slot slot;
  RowFormat format;  ///< how the payload's rows are encoded (FP8: codes + trailing row scales)
  int64_t rows = 0;
  int64_t cols = 0;
};

class BackingTier {
 public:
  virtual ~BackingTier() = default;

  /// The tier's name in stats, logs and metrics ("disk", "remote"): its HiddenStateStats::tiers
  /// row and the Python metrics' "<name>_<counter>" series take it as it is.
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;

  /// Queues one value (write-behind). `pieces` (in order) make up the payload, whose size must
  /// match the shape in the row format (InvalidArgument otherwise, nothing queued; so does a
  /// format without a wire code). With `owner` null the bytes are
  /// copied now; with an owner the pieces are borrowed and `owner` is held until the write is
  /// done or dropped. `ready`, when given, runs on the tier's own thread before the bytes are
  /// read (it waits for a device copy); false drops the write. Never blocks on I/O. Returns
  /// false when the write was dropped at once (counted).
  virtual bool enqueue_write(const TierWrite& write,
                             std::span<const std::span<const std::byte>> pieces,
                             std::shared_ptr<const void> owner = {},
                             std::function<bool()> ready = {}) = 0;
  /// Counts writes the caller dropped before queueing them (TierStats::dropped_writes).
  virtual void count_dropped(uint64_t writes) noexcept = 0;

  /// Per request, whether the tier holds a value under it (unchecked: a later fetch may still
  /// miss). A tier that cannot answer (down, broken) answers false.
  [[nodiscard]] virtual std::vector<bool> contains(std::span<const TierRequest> requests) = 0;
  /// Streams the checked values: on_value(request index, value) for each hit, in an order of the
  /// tier's choosing. Misses are not reported (and are counted by the tier). on_value must not
  /// call back into the tier.
  virtual void fetch_each(std::span<const TierRequest> requests,
                          const std::function<void(size_t, const TierValue&)>& on_value) = 0;

  /// The KV of these chunks is gone: the tier may drop their values (a shared tier, whose other
  /// readers have their own KV, keeps them). Never blocks on I/O; never throws.
  virtual void discard(std::span<const CacheEngineKey> keys) noexcept { (void)keys; }

  /// Waits until every write queued before the call is done or dropped.
  virtual void flush() = 0;
  /// The store closed: writes queued so far are finished (as flush), later ones are dropped
  /// (counted); reads keep working. Idempotent. The destructor does the same.
  virtual void close() = 0;

  /// The tier's counters in the one shape (TierStats::promotions stays 0: the chain counts it).
  [[nodiscard]] virtual TierStats stats() const = 0;
  /// What the tier shows in the store's stats besides its TierStats row (HiddenStateStats::
  /// tiers), filled by the tier itself: the Redis tier fills HiddenStateStats::remote, the view
  /// kept for its older readers. `promotions`: the chain's count of this tier's promotions. The
  /// store starts from zeros and asks every tier in retrieve order; most tiers add nothing.
  virtual void add_store_view(HiddenStateStats& stats, uint64_t promotions) const {
    (void)stats;
    (void)promotions;
  }
};

}  // namespace hss::detail
