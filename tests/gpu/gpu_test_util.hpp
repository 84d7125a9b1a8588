#pragma once
// Shared by the GPU test files (tests/gpu: run on a GPU under label gpu and against the CUDA
// runtime model under label gpu-model): the device guard, the CUDA status check, RAII holders,
// and a stream gate that works on both.

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "../test_util.hpp"
#include "hss/build_info.hpp"
#include "hss/tensor.hpp"

#if HSS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if HSS_CUDA_MODEL
#include "cuda_model.hpp"
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

/// make_tokens's ids (the ones make_rows derives its values from) as int64 token ids.
inline std::vector<int64_t> tokens64(int64_t n, uint64_t seed) {
  const auto t = make_tokens(n, seed);
  return {t.begin(), t.end()};
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

/// Holds a stream closed until open() (or destruction): a host function that blocks until the
/// gate opens, so the stream's later work waits, as behind a kernel that runs for as long as the
/// test wants. A call that returns while its stream is held cannot have waited for that stream
/// on the host. Works on a GPU and on the model. Open gates in the order they were closed: a GPU
/// may run the host functions of all streams on one thread.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) : state_(std::make_shared<State>()) {
    // The host function owns a reference: it may run after the gate object is gone.
    auto* ref = new std::shared_ptr<State>(state_);
    if (cudaLaunchHostFunc(stream, &StreamGate::hold, ref) != cudaSuccess) {
      delete ref;
      ADD_FAILURE() << "cudaLaunchHostFunc failed";
    }
  }
  ~StreamGate() { open(); }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  void open() {
    std::lock_guard lock(state_->mutex);
    state_->open = true;
    state_->opened.notify_all();
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable opened;
    bool open = false;
  };
  static void hold(void* user) {
    const std::unique_ptr<std::shared_ptr<State>> ref(static_cast<std::shared_ptr<State>*>(user));
    std::unique_lock lock((*ref)->mutex);
    (*ref)->opened.wait(lock, [&] { return (*ref)->open; });
  }
  std::shared_ptr<State> state_;
};

/// Returns once a thread the test started is blocked on the host inside hsstore. The model
/// knows; on a GPU this sleeps 200 ms, so a check after it can only pass late, never fail
/// wrongly (the thread is still blocked while the test holds what it waits for).
inline void wait_until_a_thread_blocks() {
#if HSS_CUDA_MODEL
  cuda_model::wait_for_host_waiters(1);
#else
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
#endif
}

/// Device memory holding a copy of `host`, ready for work on any stream: cudaMemcpy runs on the
/// legacy stream, which non-blocking streams do not wait for, so the legacy stream is
/// synchronised too (that waits for no non-blocking stream: a held test stream cannot block it).
inline void upload(DeviceBytes& dev, const void* host, size_t bytes) {
  ASSERT_NE(dev.ptr, nullptr);
  ASSERT_EQ(cudaMemcpy(dev.ptr, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
}

/// Fills device memory with `byte`, ready for work on any stream (as upload()).
inline void fill(void* dev, int byte, size_t bytes) {
  ASSERT_EQ(cudaMemset(dev, byte, bytes), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
}

/// Device bytes read back to the host (the model faults a host dereference of device memory).
inline std::vector<unsigned char> download(const void* dev, size_t bytes) {
  std::vector<unsigned char> out(bytes);
  EXPECT_EQ(cudaMemcpy(out.data(), dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

}  // namespace hss::test

#endif  // HSS_WITH_CUDA
