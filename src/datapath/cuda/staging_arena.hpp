#pragma once
// The staging of one device (device_path.hpp): the device memory a device store gathers the
// caller's rows into (cast or not) before their copy to the pool, and the page-locked descriptor
// table the gather kernel reads its tiles from. A store round leases a byte range of the one and
// a tile range of the other, sized for that round, so the budget
// (hidden_state_staging_bytes, Config::tuning.staging_bytes) counts bytes in flight: small stores
// take little, and the host waits only when a round's bytes (or tiles) do not fit beside those in
// flight.
//
// A round's states (records are a fixed pool, created with the arena):
//
//   free --acquire()--> leased --record(copy stream)--> in flight --`done` event finished--> free
//                         |                                          (reclaimed by the next
//                         +--lease dropped without record: the streams     acquire or synchronize)
//                            it touched are synchronised first, then free
//
// acquire() waits on the host (and says so) only when nothing fits: it waits for the oldest
// round in flight, reclaims what finished, and tries again. Ranges are first-fit in a sorted list
// of free ranges whose capacity is reserved up front, so giving back never allocates.
// Thread-safe; one mutex, held for the range bookkeeping and non-blocking event queries only.

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "datapath/cuda/cuda_raii.hpp"
#include "hss/kernels/layout.hpp"

namespace hss::detail::cuda {

/// Free ranges of [0, capacity) in `unit`s, first fit. Not synchronised (StagingArena's mutex).
class RangeAllocator {
 public:
  RangeAllocator(size_t capacity, size_t max_ranges);
  /// The offset of a free range of `n` (> 0) or SIZE_MAX when none fits.
  [[nodiscard]] size_t allocate(size_t n);
  /// Gives [offset, offset + n) back, merging with its neighbours. Never allocates.
  void release(size_t offset, size_t n) noexcept;
  [[nodiscard]] size_t capacity() const { return capacity_; }

 private:
  struct Range {
    size_t offset, size;
  };
  size_t capacity_;
  std::vector<Range> free_;  // sorted by offset, disjoint, not adjacent
};

class StagingArena {
 public:
  /// `bytes` of device staging, descriptors for `tiles` tiles, `rounds` round records. Allocates
  /// everything now (the caller's device must be current).
  StagingArena(size_t bytes, size_t tiles, size_t rounds);
  /// Waits for every round in flight (best effort: errors are left to the next checked call).
  ~StagingArena();
  StagingArena(const StagingArena&) = delete;
  StagingArena& operator=(const StagingArena&) = delete;

  struct Round;

  /// One round's ranges while a store enqueues it.
  class Lease {
   public:
    Lease(StagingArena& arena, Round& round) : arena_(arena), round_(round) {}
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    /// The round's staging (16-byte aligned) and its descriptor table, host and device views.
    [[nodiscard]] unsigned char* staging() const;
    [[nodiscard]] kernels::WriteSegment* tiles_host() const;
    [[nodiscard]] const kernels::WriteSegment* tiles_device() const;
    /// Recorded on the caller's stream after the gather; the copy stream waits for it.
    [[nodiscard]] cudaEvent_t gathered() const;
    /// Work using the round is (about to be) enqueued on `stream`.
    void touch(cudaStream_t stream);
    /// Ends the round: `copy_stream` is ordered after every use of its ranges.
    void record(cudaStream_t copy_stream);

   private:
    StagingArena& arena_;
    Round& round_;
    cudaStream_t touched_[2] = {nullptr, nullptr};
    int touched_count_ = 0;
    bool recorded_ = false;
  };

  /// Leases `bytes` of staging and `tiles` descriptors. Waits on the host while they do not fit
  /// beside the rounds in flight, setting *waited. hss::Error when they could never fit.
  [[nodiscard]] std::unique_ptr<Lease> acquire(size_t bytes, size_t tiles, bool* waited);

  /// Waits for every round in flight and frees them.
  void synchronize() noexcept;

  [[nodiscard]] size_t bytes() const { return bytes_.capacity(); }

  /// Staging ranges are multiples of this (and start on such a boundary): the kernels' vector
  /// plan depends on the staging address modulo 16 only.
  static constexpr size_t kAlign = 16;

 private:
  void reclaim_locked() noexcept;
  void free_locked(Round& round) noexcept;

  DeviceBuffer staging_;
  PinnedTable table_;
  std::vector<std::unique_ptr<Round>> rounds_;
  std::mutex mutex_;
  RangeAllocator bytes_;  // sizes and capacity multiples of kAlign: offsets stay aligned
  RangeAllocator tiles_;
  std::vector<Round*> idle_;         // records neither leased nor in flight (capacity: all)
  std::vector<Round*> in_flight_;    // recorded, oldest first (capacity: all)
  std::condition_variable changed_;  // a lease was recorded or given back
};

}  // namespace hss::detail::cuda
