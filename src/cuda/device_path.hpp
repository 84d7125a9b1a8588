#pragma once
// The CUDA data path (data_path.hpp's DevicePath for CUDA builds).
//
// Store, per call and per staging round (a round fills at most one staging buffer):
//   caller's stream: upload tile table -> gather_cast kernel (rows -> staging, cast) -> `gathered`
//   copy stream:     wait `gathered` -> one D2H cudaMemcpyAsync per run of adjacent segments ->
//                    slot `done`; after the last round: the call's fence event.
// The caller may overwrite its source as soon as the call returns (its later work on its stream
// runs after the kernel). A staging buffer is reused once its `done` event completed.
//
// Restore: one launch on the caller's stream reads the pool through its device mapping
// (cudaHostAllocMapped + UVA: a pool address is a device address) and writes the output. Three
// implementations, chosen once by HSS_RESTORE_IMPL (kernel, cub, memcpy); docs/kernels.md.
//
// Device memory is bounded: kMaxStagingSlots x kStagingSlotBytes of staging per device plus the
// upload tables (tile descriptors; a few MiB at most for very large calls).
//
// Thread-safe: every method may be called from many threads at once.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cuda/cuda_raii.hpp"
#include "cuda/slot_pool.hpp"
#include "data_path.hpp"

namespace hss::detail::cuda {

inline constexpr size_t kStagingSlotBytes = size_t{64} << 20;
inline constexpr size_t kMaxStagingSlots = 4;  // 256 MiB of staging per device at most
inline constexpr size_t kMaxRestoreSlots = 16;

enum class RestoreImpl { kKernel, kCub, kMemcpy };

/// Parses HSS_RESTORE_IMPL; unknown values log a warning and give kKernel.
[[nodiscard]] RestoreImpl restore_impl_from_env();
[[nodiscard]] const char* to_string(RestoreImpl impl);

struct StagingSlot {
  DeviceBuffer staging;
  MirroredTable tiles;
  Event gathered;  // recorded on the caller's stream after the gather kernel
};

struct RestoreSlot {
  MirroredTable table;
  DeviceBuffer cub_temp;
  std::shared_ptr<const void> keep_alive;  // pool entries the enqueued restore still reads
};

/// Resources of one device, created on its first use.
struct DeviceState {
  explicit DeviceState(int index);
  int index;
  Stream copy_stream;  // one per device, named "hss/copy/<index>"
  SlotPool<StagingSlot> staging;
  SlotPool<RestoreSlot> restores;
};

/// The call's fence: an event recorded on the copy stream after its last D2H copy.
class EventFence final : public CopyFence {
 public:
  EventFence() : event_(Event::create()) {}
  [[nodiscard]] bool wait() noexcept override;
  [[nodiscard]] bool ready() noexcept override;
  [[nodiscard]] std::string error() const override;
  [[nodiscard]] cudaEvent_t event() const { return event_.get(); }

 private:
  Event event_;
  mutable std::mutex mutex_;
  std::string error_;
};

class CudaDevicePath final : public DevicePath {
 public:
  explicit CudaDevicePath(RestoreImpl restore_impl);
  ~CudaDevicePath() override;

  [[nodiscard]] std::shared_ptr<CopyFence> store(const kernels::SourceView& src, int device_index,
                                                 std::span<const kernels::WriteSegment> segments,
                                                 void* stream) override;
  /// Returns once enqueued; `keep_alive` (the pinned entries) is released after the restore has
  /// read the pool, checked lazily by later calls and flush(). Null keep_alive: block instead.
  void restore(std::span<const kernels::GatherSegment> segments, const kernels::OutputView& out,
               int device_index, void* stream, std::shared_ptr<const void> keep_alive) override;
  void flush() override;

  [[nodiscard]] RestoreImpl restore_impl() const { return restore_impl_; }

 private:
  DeviceState& device(int index);
  /// One staging round starting at segments[next] (element `consumed` of it). Advances both.
  void store_round(DeviceState& dev, const kernels::SourceView& src,
                   std::span<const kernels::WriteSegment> segments, size_t& next, int64_t& consumed,
                   cudaStream_t stream);
  void restore_kernel(RestoreSlot& slot, std::span<const kernels::GatherSegment> segments,
                      const kernels::OutputView& out, cudaStream_t stream);
  void restore_cub(RestoreSlot& slot, std::span<const kernels::GatherSegment> segments,
                   const kernels::OutputView& out, cudaStream_t stream);
  void restore_memcpy(std::span<const kernels::GatherSegment> segments,
                      const kernels::OutputView& out, cudaStream_t stream);
  /// The pool is not device-mapped (pinned allocation failed): widen on the host, copy H2D.
  void restore_from_pageable(std::span<const kernels::GatherSegment> segments,
                             const kernels::OutputView& out, cudaStream_t stream);
  void release_finished_restores();

  const RestoreImpl restore_impl_;
  std::mutex mutex_;  // guards devices_ (the vector; each state is thread-safe)
  std::vector<std::unique_ptr<DeviceState>> devices_;
};

}  // namespace hss::detail::cuda
