#pragma once
// The read transaction: a pinned walk. Every reader of entries' bytes (a retrieve, single or
// batched, into any output; coverage; an export to a P/D peer) runs one:
//
//   begin (index lock)     StoreState::pin_prefix: the READY prefix of the chunk list for the
//                          slots, each entry pinned (an EntryRef), so nothing the walk found is
//                          freed or rewritten while it is read;
//   finish (no lock)       ReadPipeline::walk_finish: KV presence per chunk, fence waits or
//                          fence ordering (PendingCopies); the prefix may only shrink;
//   read (no lock)         restores, exports: the pinned entries' granules;
//   end (index lock)       StoreState::end_walk: the orphan (KV gone) and failed copies dropped,
//                          the prefix touched in reverse order. A walk that is never ended (a
//                          check failed, coverage) changed nothing;
//   release                the pins go with the PinnedWalk (or with the restore holding them).
//
// A PinnedWalk is used by one thread. Drawn with the write transaction in docs/design.md, "The
// index lock and the write transaction".

#include <cstddef>
#include <cstdint>
#include <memory>
#include <memory_resource>
#include <optional>
#include <span>
#include <vector>

#include "base/heap_resource.hpp"
#include "datapath/data_path.hpp"
#include "index/store_index.hpp"

namespace hss::detail {

/// What a prefix walk found, before anything changed: the pinned entries of the prefix
/// ([chunk][slot] flattened), the chunk whose KV is gone (to drop), the prefix length.
struct PinnedWalk {
  /// The walk's pins: on the heap, or in a batch's arena (retrieve_batch_into's host items,
  /// one allocation for the batch); restore_walks never lets an arena's pins outlive the call.
  using Pins = std::pmr::vector<EntryRef>;
  explicit PinnedWalk(std::pmr::memory_resource* memory = heap_resource())
      : pinned(memory) {}
  PinnedWalk(PinnedWalk&&) = default;
  PinnedWalk& operator=(PinnedWalk&&) = default;
  // A copy's pins would take the process-wide default resource.
  PinnedWalk(const PinnedWalk&) = delete;
  PinnedWalk& operator=(const PinnedWalk&) = delete;
  ~PinnedWalk() = default;

  std::span<const Chunk> chunks;
  size_t slots = 0;
  Pins pinned;
  /// What a walk of a store with a device-resident tier pins besides: made by pin_prefix only
  /// then, so a walk without the tier stays small (a batch of 768 walks stayed under glibc's
  /// 128 KiB mmap threshold: above it, every batch call mapped and faulted in fresh pages).
  struct DeviceCopies {
    explicit DeviceCopies(std::pmr::memory_resource* memory) : pins(memory), failed(memory) {}
    /// The device copies of `pinned` (same index; null where an entry has none).
    Pins pins;
    /// Device copies whose kernel failed, each after its host entry (pairs): end_walk drops them.
    Pins failed;
  };
  std::unique_ptr<DeviceCopies> device;  // null: the store has no device-resident tier

  /// The device copies pinned with `pinned` (empty without a device-resident tier).
  [[nodiscard]] bool has_device_pins() const { return device && !device->pins.empty(); }
  int64_t hits = 0;
  std::optional<size_t> orphan;       // KV gone here: drop the key, prefix ends here
  std::optional<size_t> failed_copy;  // a device copy into this chunk failed: drop it
  int64_t prefix_tokens = 0;
  std::vector<FenceRef> fences;  // distinct unlanded fences of the prefix (no host wait)
  bool any_fence = false;  // a pinned entry carries a fence (device path): walk_finish checks

  [[nodiscard]] const Entry& entry(int64_t chunk, size_t slot) const {
    return *pinned[static_cast<size_t>(chunk) * slots + slot];
  }
  [[nodiscard]] int64_t cols(size_t slot) const { return hits == 0 ? 0 : entry(0, slot).cols; }
};

/// What the walk does about a chunk whose device copy is still in flight:
///   kWaitOnHost     host outputs, exports: wait for the copy; a failed one ends the prefix.
///   kOrderOnDevice  device outputs: no host wait; the restore orders itself after the entries'
///                   fences on the device (PinnedWalk::fences); cached failure flags end the
///                   prefix.
///   kQuery          coverage(): no host wait and no ordering; the copy counts as there unless a
///                   non-blocking query says it failed (a restore would get its rows).
enum class PendingCopies { kWaitOnHost, kOrderOnDevice, kQuery };

}  // namespace hss::detail
