#pragma once
// RAII holders for the model's own tests (tests/cuda_model/test_*.cpp).

#include <cuda_runtime_api.h>

#include <cstddef>

namespace hss::cuda_model::test {

/// cudaMalloc'd memory, freed at scope exit.
struct DeviceMemory {
  explicit DeviceMemory(size_t n) : bytes(n) {
    if (cudaMalloc(&ptr, n) != cudaSuccess) ptr = nullptr;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() { (void)cudaFree(ptr); }
  void* ptr = nullptr;
  size_t bytes;
};

/// cudaHostAlloc'd memory, freed at scope exit.
struct PinnedMemory {
  PinnedMemory(size_t n, unsigned flags) : bytes(n) {
    if (cudaHostAlloc(&ptr, n, flags) != cudaSuccess) ptr = nullptr;
  }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  ~PinnedMemory() { (void)cudaFreeHost(ptr); }
  void* ptr = nullptr;
  size_t bytes;
};

/// A stream (non-blocking unless asked), destroyed at scope exit.
struct Stream {
  explicit Stream(unsigned flags = cudaStreamNonBlocking) {
    (void)cudaStreamCreateWithFlags(&stream, flags);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { (void)cudaStreamDestroy(stream); }
  cudaStream_t stream = nullptr;
};

/// An event, destroyed at scope exit.
struct Event {
  explicit Event(unsigned flags = cudaEventDisableTiming) {
    (void)cudaEventCreateWithFlags(&event, flags);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { (void)cudaEventDestroy(event); }
  cudaEvent_t event = nullptr;
};

}  // namespace hss::cuda_model::test
