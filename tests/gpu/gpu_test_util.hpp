#pragma once
// Shared by the GPU test files: the device guard, the CUDA status check and two RAII holders.

#include <gtest/gtest.h>

#include <cstddef>

#include "hss/build_info.hpp"

#if HSS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

/// Skips the test, with the reason, when no CUDA device is usable in this process.
#define HSS_REQUIRE_DEVICE()                                     \
  do {                                                           \
    const ::hss::RuntimeInfo& info_ = ::hss::runtime_info();     \
    if (!info_.device_available) {                               \
      GTEST_SKIP() << "no usable CUDA device: " << info_.reason; \
    }                                                            \
  } while (0)

#if HSS_WITH_CUDA

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

namespace hss::test {

/// Device memory of n bytes, freed at scope exit (ptr is null when the allocation failed).
struct DeviceBytes {
  explicit DeviceBytes(size_t n) : bytes(n) {
    if (cudaMalloc(&ptr, n) != cudaSuccess) ptr = nullptr;
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() { (void)cudaFree(ptr); }
  void* ptr = nullptr;
  size_t bytes;
};

/// A non-blocking stream of the test's own, destroyed at scope exit.
struct StreamHolder {
  StreamHolder() { (void)cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); }
  StreamHolder(const StreamHolder&) = delete;
  StreamHolder& operator=(const StreamHolder&) = delete;
  ~StreamHolder() { (void)cudaStreamDestroy(stream); }
  cudaStream_t stream = nullptr;
};

}  // namespace hss::test

#endif  // HSS_WITH_CUDA
