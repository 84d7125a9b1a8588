#pragma once
// Owning wrappers for the CUDA objects of the device path. Constructors throw hss::Error (via
// HSS_CUDA_CHECK); destructors never throw and ignore errors, since they also run at process exit
// after the runtime has shut down (cudaErrorCudartUnloading) and on a device that has failed.
// Not synchronised: each object has one owner.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

namespace hss::detail::cuda {

/// True when the work captured by `event` has finished (or failed: the failure surfaces at the next
/// checked call). cudaErrorNotReady is also written to the thread's last-error slot; it is
/// cleared here so that HSS_CUDA_CHECK_LAUNCH after a query does not report it.
[[nodiscard]] bool event_done(cudaEvent_t event) noexcept;

/// Makes `device` current for the scope and restores the caller's device afterwards, so the
/// library never leaves an engine thread on another device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// A stream that does not synchronise with the legacy default stream: the library's copies never
/// stall an engine's default-stream work, and ordering is explicit through events.
class Stream {
 public:
  Stream() = default;
  [[nodiscard]] static Stream create_non_blocking();
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept;
  ~Stream();
  [[nodiscard]] cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

/// A timing-free event (cheaper to record and query).
class Event {
 public:
  Event() = default;
  [[nodiscard]] static Event create();
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&& other) noexcept;
  ~Event();
  [[nodiscard]] cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

/// cudaMalloc'd device memory. Freeing calls cudaFree, which synchronises the device: buffers are
/// allocated once and reused, never freed on the hot path.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  [[nodiscard]] static DeviceBuffer allocate(size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();
  [[nodiscard]] void* get() const { return ptr_; }
  [[nodiscard]] size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// Page-locked, portable host memory (async H2D sources).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  [[nodiscard]] static PinnedBuffer allocate(size_t bytes);
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  ~PinnedBuffer();
  [[nodiscard]] void* get() const { return ptr_; }
  [[nodiscard]] size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// A table (kernel tile descriptors, cub pointer arrays) built on the host and uploaded with one
/// async H2D copy. The caller guarantees the previous upload's consumers have finished (the slot
/// pool's event), so the pinned side may be rewritten. Grows geometrically, rarely.
class MirroredTable {
 public:
  /// Copies `bytes` from `data` into the pinned side and enqueues the upload on `stream`.
  /// Returns the device copy.
  [[nodiscard]] void* upload(const void* data, size_t bytes, cudaStream_t stream);

 private:
  void reserve(size_t bytes);
  PinnedBuffer host_;
  DeviceBuffer device_;
};

}  // namespace hss::detail::cuda
