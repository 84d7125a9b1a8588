#include "datapath/cuda/cuda_raii.hpp"

#include <algorithm>
#include <cstring>

#include "hss/kernels/cuda_check.hpp"

namespace hss::detail::cuda {

cudaPointerAttributes pointer_attributes(const void* p) noexcept {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();
    attributes = cudaPointerAttributes{};
    attributes.type = cudaMemoryTypeUnregistered;
  }
  return attributes;
}

EventStatus query_event(cudaEvent_t event, cudaError_t* error) noexcept {
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaSuccess) return EventStatus::kDone;
  (void)cudaGetLastError();
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
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) {
    (void)cudaSetDevice(previous_);
  }
}

OwnedStream OwnedStream::create_non_blocking() {
  OwnedStream s;
  HSS_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking));
  return s;
}

OwnedStream::~OwnedStream() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Event Event::create(bool blocking_sync) {
  Event e;
  const unsigned flags = cudaEventDisableTiming | (blocking_sync ? cudaEventBlockingSync : 0u);
  HSS_CUDA_CHECK(cudaEventCreateWithFlags(&e.event_, flags));
  return e;
}

Event::~Event() {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
}

DeviceBuffer DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer b;
  HSS_CUDA_CHECK(cudaMalloc(&b.ptr_, bytes));
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
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
  if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
}

PinnedTable PinnedTable::allocate(size_t bytes) {
  PinnedTable t;
  t.host_ = PinnedBuffer::allocate(bytes);
  HSS_CUDA_CHECK(cudaHostGetDevicePointer(&t.device_, t.host_.get(), 0));
  return t;
}

}  // namespace hss::detail::cuda
