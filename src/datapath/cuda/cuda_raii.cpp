#include "datapath/cuda/cuda_raii.hpp"

#include <cudaTypedefs.h>  // PFN_cuEventQuery: a type only, libcuda is not linked

#include <algorithm>
#include <cstring>

#include "hss/kernels/cuda_check.hpp"

namespace hss::detail::cuda {
namespace {

/// The driver API's cuEventQuery. The driver has no last-error slot: a query that finds the work
/// still running returns CUDA_ERROR_NOT_READY and records nothing, where the runtime's
/// cudaEventQuery writes cudaErrorNotReady over the error an engine left pending on the thread
/// (hsstore's polls run on the engine's threads, every store and restore: hss/kernels/
/// cuda_check.hpp). Resolved once through the runtime (binaries load without a driver, so
/// libcuda is not linked); null where the driver does not offer it: the runtime's query then.
PFN_cuEventQuery_v2000 driver_event_query() noexcept {
#if CUDART_VERSION >= 12050  // cudaGetDriverEntryPointByVersion
  static const PFN_cuEventQuery_v2000 query = []() -> PFN_cuEventQuery_v2000 {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuEventQuery", &fn, 12000, cudaEnableDefault, &found);
    clear_own_error(status);
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) return nullptr;
    return reinterpret_cast<PFN_cuEventQuery_v2000>(fn);
  }();
  return query;
#else
  return nullptr;
#endif
}

}  // namespace

cudaPointerAttributes pointer_attributes(const void* p) noexcept {
  cudaPointerAttributes attributes{};
  if (const cudaError_t status = cudaPointerGetAttributes(&attributes, p); status != cudaSuccess) {
    clear_own_error(status);
    attributes = cudaPointerAttributes{};
    attributes.type = cudaMemoryTypeUnregistered;
  }
  return attributes;
}

EventStatus query_event(cudaEvent_t event, cudaError_t* error) noexcept {
  if (const PFN_cuEventQuery_v2000 query = driver_event_query()) {
    const CUresult r = query(event);  // a cudaEvent_t is a CUevent
    if (r == CUDA_SUCCESS) return EventStatus::kDone;
    if (r == CUDA_ERROR_NOT_READY) return EventStatus::kPending;
    // Failed: the runtime's query below names the error in the runtime's terms.
  }
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaSuccess) return EventStatus::kDone;
  clear_own_error(status);
  if (status == cudaErrorNotReady) return EventStatus::kPending;
  if (error != nullptr) *error = status;
  return EventStatus::kFailed;
}

DeviceGuard::DeviceGuard(int device) {
  HSS_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) HSS_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  if (const cudaError_t status = cudaGetDevice(&current); status != cudaSuccess) {
    clear_own_error(status);
    return;
  }
  if (current != previous_) clear_own_error(cudaSetDevice(previous_));
}

OwnedStream OwnedStream::create_non_blocking() {
  OwnedStream s;
  HSS_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking));
  return s;
}

OwnedStream::~OwnedStream() {
  if (stream_ != nullptr) clear_own_error(cudaStreamDestroy(stream_));
}

Event Event::create(bool blocking_sync) {
  Event e;
  const unsigned flags = cudaEventDisableTiming | (blocking_sync ? cudaEventBlockingSync : 0u);
  HSS_CUDA_CHECK(cudaEventCreateWithFlags(&e.event_, flags));
  return e;
}

Event::~Event() {
  if (event_ != nullptr) clear_own_error(cudaEventDestroy(event_));
}

DeviceBuffer DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer b;
  HSS_CUDA_CHECK(cudaMalloc(&b.ptr_, bytes));
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) clear_own_error(cudaFree(ptr_));
}

PinnedBuffer PinnedBuffer::allocate(size_t bytes) {
  PinnedBuffer b;
  HSS_CUDA_CHECK(cudaHostAlloc(&b.ptr_, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  b.bytes_ = bytes;
  return b;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    PinnedBuffer old(std::move(*this));
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) clear_own_error(cudaFreeHost(ptr_));
}

PinnedTable PinnedTable::allocate(size_t bytes) {
  PinnedTable t;
  t.host_ = PinnedBuffer::allocate(bytes);
  HSS_CUDA_CHECK(cudaHostGetDevicePointer(&t.device_, t.host_.get(), 0));
  return t;
}

}  // namespace hss::detail::cuda
