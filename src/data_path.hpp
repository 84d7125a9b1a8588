#pragma once
// How bytes move between callers' tensors and the pool. The store plans the work as segments
// (kernels/hss/kernels/layout.hpp); the host path (host_data_path.cpp) and the CUDA path
// (cuda/device_path.cpp + kernels/*.cu) carry them out with the same per-element functions.

#include <memory>
#include <span>
#include <string>

#include "hss/kernels/layout.hpp"

namespace hss::detail {

/// Host path: converts and copies synchronously on the calling thread.
void host_store(const kernels::SourceView& src, std::span<const kernels::WriteSegment> segments);
void host_restore(std::span<const kernels::GatherSegment> segments, const kernels::OutputView& out);

/// Completion of the device-to-host copies of one store call, shared by the entries it wrote.
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  /// Blocks until the copies have landed. False when the device work failed; error() says why.
  [[nodiscard]] virtual bool wait() noexcept = 0;
  [[nodiscard]] virtual bool ready() noexcept = 0;
  [[nodiscard]] virtual std::string error() const = 0;
};

/// The CUDA data path of one store (per-device copy streams, staging buffers).
/// Thread-safe: store/restore may be called from many threads at once.
class DevicePath {
 public:
  virtual ~DevicePath() = default;

  /// nullptr when the build has no CUDA or the process found no device.
  [[nodiscard]] static std::unique_ptr<DevicePath> create();

  /// One gather/cast kernel on `stream` reads every segment's rows from the device tensor `src`
  /// into a staging buffer; async copies on the device's copy stream move them into the pool.
  /// Returns at once. Throws hss::Error (with the CUDA error string) when enqueueing fails.
  [[nodiscard]] virtual std::shared_ptr<CopyFence> store(
      const kernels::SourceView& src, int device_index,
      std::span<const kernels::WriteSegment> segments, void* stream) = 0;

  /// One batched gather kernel on `stream` reads the segments from the (device-mapped) pool and
  /// writes the float32 prefix into `out` (device or host memory). Returns once enqueued;
  /// `keep_alive` (the pinned entries being read) is held until the kernel has read the pool, so
  /// no eviction can hand those blocks to another store meanwhile. Null: blocks until done.
  virtual void restore(std::span<const kernels::GatherSegment> segments,
                       const kernels::OutputView& out, int device_index, void* stream,
                       std::shared_ptr<const void> keep_alive) = 0;

  /// Waits for every copy issued so far.
  virtual void flush() = 0;
};

}  // namespace hss::detail
