#pragma once
// Owning wrappers for the CUDA objects of the device path. Constructors throw hss::Error (via
// HSS_CUDA_CHECK); destructors never throw and ignore errors, since they also run at process exit
// after the runtime has shut down (cudaErrorCudartUnloading) and on a device that has failed (an
// error they ignore is taken out of the thread's last-error slot: clear_own_error).
// Not synchronised: each object has one owner.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <thread>
#include <utility>

#include "datapath/cuda/capture_mode.hpp"
#include "hss/kernels/cuda_check.hpp"

namespace hss::detail::cuda {

/// What CUDA knows of `p`. An unregistered pointer (pageable memory) reads
/// cudaMemoryTypeUnregistered; so does one CUDA cannot describe (CUDA before 11 failed the call
/// for pageable memory; its error is taken out of the thread's last-error slot).
[[nodiscard]] cudaPointerAttributes pointer_attributes(const void* p) noexcept;

/// Where the work an event captured stands: still running, landed, or failed (any error but
/// cudaErrorNotReady: it will never land; a sticky error means the device is lost).
enum class EventStatus : uint8_t { kPending, kDone, kFailed };
/// Queries `event` without blocking; on kFailed `*error` (when given) says why. Through the
/// driver's cuEventQuery, which records nothing in the thread's last-error slot: the runtime's
/// cudaEventQuery writes cudaErrorNotReady there, over an error the engine left pending (PyTorch's
/// CUDAStream::query clears it afterwards, the engine's error with it). Only when the work failed
/// (or the driver's query is not available) does the runtime's query run, its error taken out of
/// the slot again (clear_own_error).
[[nodiscard]] EventStatus query_event(cudaEvent_t event, cudaError_t* error = nullptr) noexcept;
/// True once nothing more will run for `event`'s work: it landed or failed (a slot may be
/// reused; a failure surfaces at the next checked call).
[[nodiscard]] inline bool event_finished(cudaEvent_t event) noexcept {
  return query_event(event) != EventStatus::kPending;
}

/// Runs fn() on a short-lived thread whose current device is `device`, and waits for it: what fn
/// creates belongs to that device, while the calling thread's current device stays as it was and
/// no other device gets a context (CUDA 12 and later initialise a device's context in
/// cudaSetDevice, so switching the caller's device and back would open one on the device it
/// returns to). Rethrows what fn throws.
template <typename Fn>
void run_on_device(int device, Fn&& fn) {
  std::exception_ptr failure;
  std::thread helper([&] {
    try {
      const RelaxedCaptureMode relaxed;  // capture_mode.hpp
      HSS_CUDA_CHECK(cudaSetDevice(device));
      fn();
    } catch (...) {
      failure = std::current_exception();
    }
  });
  helper.join();
  if (failure) std::rethrow_exception(failure);
}

/// Makes `device` current for the scope and restores the caller's device afterwards, so the
/// library never leaves an engine thread on another device. Switches only when the device
/// differs: a call from a thread already on the tensors' device touches no other device.
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
class OwnedStream {
 public:
  OwnedStream() = default;
  [[nodiscard]] static OwnedStream create_non_blocking();
  OwnedStream(OwnedStream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  OwnedStream& operator=(OwnedStream&&) = delete;  // set once, at creation
  ~OwnedStream();
  [[nodiscard]] cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

/// A timing-free event (cheaper to record and query). `blocking_sync` events are for the host to
/// wait on: cudaEventSynchronize then sleeps instead of spinning a core.
class Event {
 public:
  Event() = default;
  [[nodiscard]] static Event create(bool blocking_sync = false);
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&&) = delete;  // set once, at creation
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
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;  // set once, at creation
  ~DeviceBuffer();
  [[nodiscard]] void* get() const { return ptr_; }
  [[nodiscard]] size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// Page-locked, portable, device-mapped host memory.
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

/// A fixed-capacity descriptor table (kernel tiles, cub pointer arrays) in page-locked,
/// device-mapped host memory: the host writes it, the kernel reads it through its device address,
/// with no upload and no allocation after creation. The owner (a slot) guarantees the previous
/// reader has finished (the slot's event) before the table is rewritten.
class PinnedTable {
 public:
  PinnedTable() = default;
  [[nodiscard]] static PinnedTable allocate(size_t bytes);
  [[nodiscard]] void* host() const { return host_.get(); }
  [[nodiscard]] void* device() const { return device_; }
  [[nodiscard]] size_t bytes() const { return host_.bytes(); }

 private:
  PinnedBuffer host_;
  void* device_ = nullptr;
};

}  // namespace hss::detail::cuda
