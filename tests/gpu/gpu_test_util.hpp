#pragma once
// Shared by the GPU test files: the device guard, the CUDA status check and two RAII holders.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "../test_util.hpp"
#include "hss/build_info.hpp"
#include "hss/tensor.hpp"

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

/// n random token ids (seeded).
inline std::vector<int64_t> tokens_of(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = static_cast<int64_t>(rng() % 50000);
  return t;
}

/// rows x cols random finite values of `dtype` (seeded) at row stride `stride` elements (0: cols),
/// after `offset` bytes of padding (0x5a bytes fill the padding and the gaps between rows).
inline std::vector<unsigned char> random_rows(DType dtype, int64_t rows, int64_t cols,
                                              uint32_t seed, int64_t stride = 0,
                                              size_t offset = 0) {
  if (stride == 0) stride = cols;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  const size_t esize = element_size(dtype);
  std::vector<unsigned char> out(offset + static_cast<size_t>(rows * stride) * esize, 0x5a);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float f = dist(rng);
      write_as(dtype, f, out.data() + offset + static_cast<size_t>(r * stride + c) * esize);
    }
  }
  return out;
}

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
