// The DevicePath contract (src/datapath/data_path.hpp) of the CUDA path itself, below the store: stream
// order, no host waits, independence of caller streams, the staging budget, keep-alive lifetimes,
// fences, output dtypes and teardown with work in flight. On a GPU (label gpu) and on the CUDA
// runtime model (label gpu-model). The "pool" here is page-locked device-mapped memory, as the
// store's pool is.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "datapath/data_path.hpp"
#include "gpu_test_util.hpp"
#include "hss/error.hpp"
#include "hss/kernels/convert.hpp"

#if !HSS_WITH_CUDA

TEST(DevicePathContract, RequiresACudaBuild) {
  GTEST_SKIP() << "built without CUDA (HSS_ENABLE_CUDA=OFF): " << hss::runtime_info().reason;
}

#else

namespace hss::detail {
namespace {

using kernels::ElemType;
using kernels::GatherSegment;
using kernels::WriteSegment;
using test::DeviceBytes;
using test::StreamGate;
using test::StreamHolder;

constexpr int64_t kRows = 4;
constexpr int64_t kCols = 8;
constexpr int64_t kElems = kRows * kCols;

/// Page-locked, device-mapped host memory (what the store's pool is), freed at scope exit.
struct PinnedBytes {
  explicit PinnedBytes(size_t n) : bytes(n) {
    if (cudaHostAlloc(&ptr, n, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
      ptr = nullptr;
    }
    if (ptr != nullptr) std::memset(ptr, 0, n);
  }
  PinnedBytes(const PinnedBytes&) = delete;
  PinnedBytes& operator=(const PinnedBytes&) = delete;
  ~PinnedBytes() { (void)cudaFreeHost(ptr); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
  void* ptr = nullptr;
  size_t bytes;
};

class DevicePathContract : public ::testing::Test {
 protected:
  void SetUp() override { HSS_REQUIRE_DEVICE(); }

  void make_path(int64_t staging_bytes = int64_t{1} << 30) {
    Config c;
    c.tuning.staging_bytes = staging_bytes;
    path_ = DevicePath::create(c);
    ASSERT_NE(path_, nullptr);
  }
  /// float32 rows base + i in device memory.
  void* device_rows(float base) {
    std::vector<float> rows(kElems);
    for (int64_t i = 0; i < kElems; ++i)
      rows[static_cast<size_t>(i)] = base + static_cast<float>(i);
    return device_copy(rows.data(), rows.size() * 4);
  }
  void* device_copy(const void* host, size_t bytes) {
    buffers_.push_back(std::make_unique<DeviceBytes>(bytes));
    test::upload(*buffers_.back(), host, bytes);
    return buffers_.back()->ptr;
  }
  void* device_zeros(size_t bytes) {
    buffers_.push_back(std::make_unique<DeviceBytes>(bytes));
    test::fill(buffers_.back()->ptr, 0, bytes);
    return buffers_.back()->ptr;
  }
  static std::vector<WriteSegment> whole(void* dst, ElemType type) {
    return {WriteSegment{dst, 0, 0, kElems, type}};
  }

  std::vector<std::unique_ptr<DeviceBytes> > buffers_;
  std::unique_ptr<DevicePath> path_;  // declared last: goes first
};

TEST_F(DevicePathContract, AStoreOnAHeldStreamReturnsAtOnceAndLandsInOrderWhenReleased) {
  make_path();
  StreamHolder s;
  void* src = device_rows(1.0f);
  PinnedBytes pool(kElems * 4);
  StreamGate gate(s.stream);
  const FenceRef fence = path_->store({src, ElemType::kFloat32, kCols, kCols}, 0,
                                      whole(pool.ptr, ElemType::kFloat32), s.stream);
  EXPECT_FALSE(fence->ready());
  EXPECT_FALSE(fence->landed());
  EXPECT_EQ(pool.as<float>()[5], 0.0f);  // nothing ran
  // The caller's next step overwrites its source on the same stream: the store read it first.
  ASSERT_EQ(cudaMemsetAsync(src, 0, kElems * 4, s.stream), cudaSuccess);
  gate.open();
  EXPECT_TRUE(fence->wait());
  EXPECT_TRUE(fence->landed());
  EXPECT_TRUE(fence->error().empty());
  for (int64_t i = 0; i < kElems; ++i) ASSERT_EQ(pool.as<float>()[i], 1.0f + i);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(test::download(src, 4), std::vector<unsigned char>(4, 0));
}

TEST_F(DevicePathContract, ACastStoreWidensIntoThePool) {
  make_path();
  StreamHolder s;
  std::vector<uint16_t> bits(kElems);
  for (int64_t i = 0; i < kElems; ++i) bits[static_cast<size_t>(i)] = kernels::float_to_bf16(i);
  void* src = device_copy(bits.data(), bits.size() * 2);
  PinnedBytes pool(kElems * 4);
  StreamGate gate(s.stream);
  const FenceRef fence = path_->store({src, ElemType::kBFloat16, kCols, kCols}, 0,
                                      whole(pool.ptr, ElemType::kFloat32), s.stream);
  EXPECT_FALSE(fence->ready());
  gate.open();
  EXPECT_TRUE(fence->wait());
  for (int64_t i = 0; i < kElems; ++i) ASSERT_EQ(pool.as<float>()[i], static_cast<float>(i));
}

TEST_F(DevicePathContract, WithOneStreamHeldAnotherStoresAndRestoresOnItsOwn) {
  make_path();
  StreamHolder a, b;
  void* src_a = device_rows(100.0f);
  void* src_b = device_rows(200.0f);
  PinnedBytes pool_a(kElems * 4), pool_b(kElems * 4);
  StreamGate gate(a.stream);
  const FenceRef fa = path_->store({src_a, ElemType::kFloat32, kCols, kCols}, 0,
                                   whole(pool_a.ptr, ElemType::kFloat32), a.stream);
  // b's store and its restore of b's rows run although a's work is queued.
  const FenceRef fb = path_->store({src_b, ElemType::kFloat32, kCols, kCols}, 0,
                                   whole(pool_b.ptr, ElemType::kFloat32), b.stream);
  EXPECT_TRUE(fb->wait());
  EXPECT_FALSE(fa->ready());
  void* out = device_zeros(kElems * 4);
  const GatherSegment seg{pool_b.ptr, 0, kElems, ElemType::kFloat32};
  const FenceRef after[] = {fb};
  path_->restore({&seg, 1}, {out, kCols, kCols, ElemType::kFloat32}, 0, b.stream, after, nullptr);
  ASSERT_EQ(cudaStreamSynchronize(b.stream), cudaSuccess);
  float got = 0;
  ASSERT_EQ(cudaMemcpy(&got, static_cast<float*>(out) + 3, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, 203.0f);
  gate.open();
  EXPECT_TRUE(fa->wait());
  EXPECT_EQ(pool_a.as<float>()[3], 103.0f);
}

TEST_F(DevicePathContract, ARestoreWaitsOnTheDeviceForAnotherStreamsFenceAndHoldsItsPins) {
  make_path();
  StreamHolder a, b;
  void* src = device_rows(7.0f);
  PinnedBytes pool(kElems * 4);
  void* out = device_zeros(kElems * 4);
  auto pins = std::make_shared<int>(1);
  std::weak_ptr<int> watch = pins;
  {
    StreamGate gate(a.stream);
    const FenceRef fence = path_->store({src, ElemType::kFloat32, kCols, kCols}, 0,
                                        whole(pool.ptr, ElemType::kFloat32), a.stream);
    const GatherSegment seg{pool.ptr, 0, kElems, ElemType::kFloat32};
    const FenceRef after[] = {fence};
    path_->restore({&seg, 1}, {out, kCols, kCols, ElemType::kFloat32}, 0, b.stream, after,
                   std::move(pins));
    // Returned at once; b is held behind a's fence on the device.
    EXPECT_EQ(path_->restores_in_flight(), 1u);
    EXPECT_EQ(path_->release_finished(), 0u);
    EXPECT_FALSE(watch.expired());  // the pins live while the restore may still read the pool
  }
  ASSERT_EQ(cudaStreamSynchronize(b.stream), cudaSuccess);
  float got = 0;
  ASSERT_EQ(cudaMemcpy(&got, static_cast<float*>(out) + 1, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, 8.0f);  // the data became visible in order
  EXPECT_EQ(path_->release_finished(), 1u);
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(path_->restores_in_flight(), 0u);
}

TEST_F(DevicePathContract, StagingBeyondTheBudgetWaitsOnTheHostAndIsCounted) {
  // Each cast store stages kElems float32 = 128 bytes; the budget holds one.
  make_path(/*staging_bytes=*/200);
  StreamHolder s;
  std::vector<uint16_t> bits(kElems);
  for (int64_t i = 0; i < kElems; ++i) bits[static_cast<size_t>(i)] = kernels::float_to_bf16(i);
  void* src = device_copy(bits.data(), bits.size() * 2);
  PinnedBytes pool1(kElems * 4), pool2(kElems * 4);
  StreamGate gate(s.stream);
  const FenceRef f1 = path_->store({src, ElemType::kBFloat16, kCols, kCols}, 0,
                                   whole(pool1.ptr, ElemType::kFloat32), s.stream);
  EXPECT_EQ(path_->staging_waits(), 0u);
  FenceRef f2;
  std::atomic<bool> done{false};
  std::thread second([&] {
    f2 = path_->store({src, ElemType::kBFloat16, kCols, kCols}, 0,
                      whole(pool2.ptr, ElemType::kFloat32), s.stream);
    done = true;
  });
  test::wait_until_a_thread_blocks();  // the second store waits for the budget
  EXPECT_FALSE(done.load());
  gate.open();
  second.join();
  EXPECT_EQ(path_->staging_waits(), 1u);
  path_->flush();
  EXPECT_TRUE(f1->landed());
  EXPECT_TRUE(f2->landed());
  EXPECT_EQ(pool2.as<float>()[9], 9.0f);
}

TEST_F(DevicePathContract, StagingWithinTheBudgetNeverWaits) {
  // Eight cast stores of 128 staging bytes each, with their stream held: 1 KiB in flight, which
  // the budget holds. A store that waited here would never return (the stream is held).
  make_path(/*staging_bytes=*/1024);
  StreamHolder s;
  void* src = device_zeros(kElems * 2);
  std::vector<std::unique_ptr<PinnedBytes> > pools;
  {
    StreamGate gate(s.stream);
    for (int i = 0; i < 8; ++i) {
      pools.push_back(std::make_unique<PinnedBytes>(kElems * 4));
      (void)path_->store({src, ElemType::kBFloat16, kCols, kCols}, 0,
                         whole(pools.back()->ptr, ElemType::kFloat32), s.stream);
    }
    EXPECT_EQ(path_->staging_waits(), 0u);
  }
  path_->flush();
}

TEST_F(DevicePathContract, RestoreWritesEveryOutputDType) {
  make_path();
  StreamHolder s;
  PinnedBytes pool(kElems * 4);
  for (int64_t i = 0; i < kElems; ++i) pool.as<float>()[i] = 1.0f + 1.0f / 3.0f * i;
  const GatherSegment seg{pool.ptr, 0, kElems, ElemType::kFloat32};
  void* bf = device_zeros(kElems * 2);
  void* f16 = device_zeros(kElems * 2);
  path_->restore({&seg, 1}, {bf, kCols, kCols, ElemType::kBFloat16}, 0, s.stream, {}, nullptr);
  path_->restore({&seg, 1}, {f16, kCols, kCols, ElemType::kFloat16}, 0, s.stream, {}, nullptr);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  const auto got_bf = test::download(bf, kElems * 2), got_f16 = test::download(f16, kElems * 2);
  for (int64_t i = 0; i < kElems; ++i) {
    uint16_t b = 0, h = 0;
    std::memcpy(&b, got_bf.data() + 2 * i, 2);
    std::memcpy(&h, got_f16.data() + 2 * i, 2);
    ASSERT_EQ(b, kernels::float_to_bf16(pool.as<float>()[i]));
    ASSERT_EQ(h, kernels::float_to_f16(pool.as<float>()[i]));
  }
}

TEST_F(DevicePathContract, DestructionWithWorkInFlightWaitsForItAndDropsThePins) {
  // The path dies while its stream is held: the destructor must wait for every queued copy and
  // restore (ASan: nothing writes freed memory) and release the restores' keep-alives.
  PinnedBytes pool(kElems * 16 * 4);
  std::weak_ptr<int> watch;
  make_path();
  StreamHolder s;
  std::vector<uint16_t> bits(kElems, kernels::float_to_bf16(2.0f));
  void* src = device_copy(bits.data(), bits.size() * 2);
  auto gate = std::make_unique<StreamGate>(s.stream);
  std::vector<FenceRef> fences;
  for (int k = 0; k < 16; ++k) {
    fences.push_back(path_->store({src, ElemType::kBFloat16, kCols, kCols}, 0,
                                  whole(pool.as<float>() + k * kElems, ElemType::kFloat32),
                                  s.stream));
  }
  auto pins = std::make_shared<int>(3);
  watch = pins;
  void* out = device_zeros(kElems * 4);
  const GatherSegment seg{pool.ptr, 0, kElems, ElemType::kFloat32};
  // Ordered after the first store's copy, as the store's read path orders a restore after the
  // fences of the entries it reads: unordered, the restore would read the granules the copy
  // stream is still writing (a race ThreadSanitizer reports on the CUDA model).
  path_->restore({&seg, 1}, {out, kCols, kCols, ElemType::kFloat32}, 0, s.stream,
                 {&fences.front(), 1}, std::move(pins));
  std::thread opener([&] {
    test::wait_until_a_thread_blocks();  // the destructor waits for the held stream
    gate->open();
  });
  path_.reset();
  opener.join();
  EXPECT_TRUE(watch.expired());
  for (int64_t i = 0; i < 16 * kElems; ++i) ASSERT_EQ(pool.as<float>()[i], 2.0f) << i;
}

TEST_F(DevicePathContract, FlushWaitsForEveryCopyAndRestore) {
  make_path();
  StreamHolder s;
  void* src = device_rows(3.0f);
  PinnedBytes pool(kElems * 4);
  auto gate = std::make_unique<StreamGate>(s.stream);
  const FenceRef fence = path_->store({src, ElemType::kFloat32, kCols, kCols}, 0,
                                      whole(pool.ptr, ElemType::kFloat32), s.stream);
  std::thread opener([&] {
    test::wait_until_a_thread_blocks();  // flush waits for the held stream
    gate->open();
  });
  path_->flush();
  opener.join();
  EXPECT_TRUE(fence->landed());
  EXPECT_EQ(pool.as<float>()[2], 5.0f);
}

TEST_F(DevicePathContract, ADeviceIndexTheProcessDoesNotSeeOrMixedStorageTypesAreRefused) {
  make_path();
  StreamHolder s;
  void* src = device_rows(1.0f);
  PinnedBytes pool(kElems * 4);
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_THROW((void)path_->store({src, ElemType::kFloat32, kCols, kCols}, count,
                                  whole(pool.ptr, ElemType::kFloat32), s.stream),
               InvalidArgument);
  // The store plans one storage type per call: anything else is a bug of the caller's.
  const std::vector<WriteSegment> mixed = {
      {pool.ptr, 0, 0, kCols, ElemType::kFloat32},
      {pool.as<float>() + kCols, 0, kCols, kCols, ElemType::kFloat16}};
  EXPECT_THROW((void)path_->store({src, ElemType::kFloat32, kCols, kCols}, 0, mixed, s.stream),
               Error);
  EXPECT_EQ(path_->launches(), 0u);
}

TEST_F(DevicePathContract, ManyFencesInFlightAreTrackedAndAllLand) {
  // More stores in flight than the path's first pruning threshold of its fence list (64): the
  // prune at the 65th finds none settled and must keep them all. 96, not more: each store queues
  // about four operations on the held copy stream, and a driver whose queue fills blocks the
  // enqueueing thread (this one) until the stream moves.
  constexpr int kStores = 96;
  make_path();
  StreamHolder s;
  void* src = device_rows(4.0f);
  std::vector<std::unique_ptr<PinnedBytes> > pools;
  std::vector<FenceRef> fences;
  {
    StreamGate gate(s.stream);
    // Should a store block on a full queue anyway, another thread opens the gate after 30 s: the
    // test then fails instead of hanging.
    std::mutex m;
    std::condition_variable cv;
    bool stored = false, opened_late = false;
    std::thread watchdog([&] {
      std::unique_lock lock(m);
      if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return stored; })) {
        opened_late = true;
        gate.open();
      }
    });
    for (int i = 0; i < kStores; ++i) {
      pools.push_back(std::make_unique<PinnedBytes>(kElems * 4));
      fences.push_back(path_->store({src, ElemType::kFloat32, kCols, kCols}, 0,
                                    whole(pools.back()->ptr, ElemType::kFloat32), s.stream));
      if (i % 32 == 31) path_->poll();  // never waits: the stream is held
    }
    {
      std::lock_guard lock(m);
      stored = true;
    }
    cv.notify_all();
    watchdog.join();
    EXPECT_FALSE(opened_late) << "a store blocked on the held stream for 30 s";
    if (!opened_late) {
      EXPECT_FALSE(fences.back()->landed());
    }
  }
  path_->flush();
  for (size_t i = 0; i < fences.size(); ++i) {
    ASSERT_TRUE(fences[i]->landed()) << i;
    ASSERT_EQ(pools[i]->as<float>()[kElems - 1], 4.0f + kElems - 1) << i;
  }
}

TEST_F(DevicePathContract, PointerChecksNameTheArgument) {
  make_path();
  DeviceBytes on0(64);
  std::vector<float> host(16);
  EXPECT_NO_THROW(path_->check_pointer(on0.ptr, true, 0, "hidden_states"));
  EXPECT_NO_THROW(path_->check_pointer(host.data(), false, 0, "out"));
  try {
    path_->check_pointer(host.data(), true, 0, "out");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("out.data is not memory of CUDA device 0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(path_->check_pointer(on0.ptr, false, 0, "out"), InvalidArgument);
}

}  // namespace
}  // namespace hss::detail

#endif  // HSS_WITH_CUDA
