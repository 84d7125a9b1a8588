#include "cuda/cuda_raii.hpp"

#include <algorithm>
#include <cstring>

#include "cuda/cuda_check.hpp"

namespace hss::detail::cuda {

bool event_done(cudaEvent_t event) noexcept {
  if (cudaEventQuery(event) != cudaErrorNotReady) return true;
  (void)cudaGetLastError();
  return false;
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

Stream Stream::create_non_blocking() {
  Stream s;
  HSS_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking));
  return s;
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream old(std::move(*this));
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Stream::~Stream() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Event Event::create() {
  Event e;
  HSS_CUDA_CHECK(cudaEventCreateWithFlags(&e.event_, cudaEventDisableTiming));
  return e;
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event old(std::move(*this));
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
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

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
}

PinnedBuffer PinnedBuffer::allocate(size_t bytes) {
  PinnedBuffer b;
  HSS_CUDA_CHECK(cudaHostAlloc(&b.ptr_, bytes, cudaHostAllocPortable));
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

void MirroredTable::reserve(size_t bytes) {
  if (bytes <= host_.bytes() && bytes <= device_.bytes()) return;
  constexpr size_t kMinBytes = 64 * 1024;
  const size_t capacity = std::max({bytes, 2 * host_.bytes(), kMinBytes});
  // Free before allocating so a table never holds twice its memory.
  host_ = PinnedBuffer();
  device_ = DeviceBuffer();
  host_ = PinnedBuffer::allocate(capacity);
  device_ = DeviceBuffer::allocate(capacity);
}

void* MirroredTable::upload(const void* data, size_t bytes, cudaStream_t stream) {
  reserve(bytes);
  std::memcpy(host_.get(), data, bytes);
  HSS_CUDA_CHECK(
      cudaMemcpyAsync(device_.get(), host_.get(), bytes, cudaMemcpyHostToDevice, stream));
  return device_.get();
}

}  // namespace hss::detail::cuda
