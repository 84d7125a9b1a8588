// The simulated asynchronous data path (src/sim_data_path.hpp) against the DevicePath ordering
// contract (src/data_path.hpp): stream order, no host waits, per-caller-stream independence, the
// staging budget, keep-alive lifetimes, pointer checks, output dtypes and teardown with work in
// flight. No test depends on timing: held streams are released explicitly, and a thread that must
// block is observed through wait_for_host_waiters().

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "data_path.hpp"
#include "hss/error.hpp"
#include "hss/kernels/convert.hpp"
#include "sim_data_path.hpp"

namespace hss::detail {
namespace {

using kernels::ElemType;
using kernels::GatherSegment;
using kernels::OutputView;
using kernels::SourceView;
using kernels::WriteSegment;

constexpr int64_t kRows = 4;
constexpr int64_t kCols = 8;
constexpr int64_t kElems = kRows * kCols;

/// "Device" float32 rows with values base + i.
float* device_rows(SimDataPath& sim, float base, int device = 0) {
  auto* rows = static_cast<float*>(sim.allocate(kElems * sizeof(float), device));
  for (int64_t i = 0; i < kElems; ++i) rows[i] = base + static_cast<float>(i);
  return rows;
}

/// One segment covering the whole source into `dst` (the "pool").
std::vector<WriteSegment> whole(void* dst, ElemType type) {
  return {WriteSegment{dst, 0, 0, kElems, type}};
}

SimDataPath::Options manual(uint64_t staging = uint64_t{1} << 30) {
  SimDataPath::Options o;
  o.staging_bytes = staging;
  return o;
}

TEST(SimDataPath, StoreOnAHeldStreamReturnsAtOnceAndLandsInOrderWhenReleased) {
  SimDataPath sim(manual());
  const Stream s = sim.create_stream();
  float* src = device_rows(sim, 1.0f);
  std::vector<float> pool(kElems, 0.0f);
  sim.hold(s);
  const FenceRef fence = sim.store({src, ElemType::kFloat32, kCols, kCols}, 0,
                                   whole(pool.data(), ElemType::kFloat32), s);
  EXPECT_FALSE(fence->ready());
  EXPECT_EQ(pool[5], 0.0f);  // nothing ran
  EXPECT_EQ(sim.queued(s), 1u);
  // The caller's next step overwrites its source on the same stream: the store read it first.
  sim.launch(s, [src] { std::memset(src, 0, kElems * sizeof(float)); });
  sim.release(s);
  EXPECT_TRUE(fence->ready());
  EXPECT_TRUE(fence->wait());
  for (int64_t i = 0; i < kElems; ++i) ASSERT_EQ(pool[static_cast<size_t>(i)], 1.0f + i);
  EXPECT_EQ(src[5], 0.0f);
  EXPECT_EQ(sim.host_waits(), 0u);
}

TEST(SimDataPath, CastStoreGathersOnTheCallerStreamAndCopiesOnItsCopyStream) {
  SimDataPath sim(manual());
  const Stream s = sim.create_stream();
  auto* src = static_cast<uint16_t*>(sim.allocate(kElems * 2));
  for (int64_t i = 0; i < kElems; ++i) src[i] = kernels::float_to_bf16(static_cast<float>(i));
  std::vector<float> pool(kElems, -1.0f);
  sim.hold(s);
  const FenceRef fence = sim.store({src, ElemType::kBFloat16, kCols, kCols}, 0,
                                   whole(pool.data(), ElemType::kFloat32), s);
  EXPECT_EQ(sim.staging_in_flight(), static_cast<uint64_t>(kElems * 4));
  EXPECT_FALSE(fence->ready());
  sim.release(s);
  EXPECT_TRUE(fence->ready());
  EXPECT_EQ(sim.staging_in_flight(), 0u);
  for (int64_t i = 0; i < kElems; ++i)
    ASSERT_EQ(pool[static_cast<size_t>(i)], static_cast<float>(i));
}

TEST(SimDataPath, TwoStreamsOneHeldTheOtherProceeds) {
  SimDataPath sim(manual());
  const Stream a = sim.create_stream();
  const Stream b = sim.create_stream();
  float* src_a = device_rows(sim, 100.0f);
  float* src_b = device_rows(sim, 200.0f);
  std::vector<float> pool_a(kElems, 0.0f), pool_b(kElems, 0.0f);
  sim.hold(a);
  const FenceRef fa = sim.store({src_a, ElemType::kFloat32, kCols, kCols}, 0,
                                whole(pool_a.data(), ElemType::kFloat32), a);
  // B's store and its restore of B's rows run although A's work is queued.
  const FenceRef fb = sim.store({src_b, ElemType::kFloat32, kCols, kCols}, 0,
                                whole(pool_b.data(), ElemType::kFloat32), b);
  EXPECT_TRUE(fb->ready());
  EXPECT_FALSE(fa->ready());
  auto* out = static_cast<float*>(sim.allocate(kElems * 4));
  const GatherSegment seg{pool_b.data(), 0, kElems, ElemType::kFloat32};
  const FenceRef after[] = {fb};
  sim.restore({&seg, 1}, {out, kCols, kCols, ElemType::kFloat32}, 0, b, after, nullptr);
  EXPECT_EQ(out[3], 203.0f);
  EXPECT_EQ(sim.host_waits(), 0u);
  sim.release(a);
  EXPECT_TRUE(fa->ready());
  EXPECT_EQ(pool_a[3], 103.0f);
}

TEST(SimDataPath, RestoreWaitsOnTheDeviceForAFenceOfAnotherStreamNeverOnTheHost) {
  SimDataPath sim(manual());
  const Stream a = sim.create_stream();
  const Stream b = sim.create_stream();
  float* src = device_rows(sim, 7.0f);
  std::vector<float> pool(kElems, 0.0f);
  sim.hold(a);
  const FenceRef fence = sim.store({src, ElemType::kFloat32, kCols, kCols}, 0,
                                   whole(pool.data(), ElemType::kFloat32), a);
  auto* out = static_cast<float*>(sim.allocate(kElems * 4));
  const GatherSegment seg{pool.data(), 0, kElems, ElemType::kFloat32};
  auto pins = std::make_shared<int>(1);
  std::weak_ptr<int> watch = pins;
  const FenceRef after[] = {fence};
  sim.restore({&seg, 1}, {out, kCols, kCols, ElemType::kFloat32}, 0, b, after, std::move(pins));
  // Returned at once; B is blocked behind A's fence on the device.
  EXPECT_EQ(sim.queued(b), 2u);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(sim.restores_in_flight(), 1u);
  EXPECT_EQ(sim.release_finished(), 0u);
  EXPECT_FALSE(watch.expired());  // the pins live while the restore may still read the pool
  sim.release(a);
  EXPECT_EQ(out[1], 8.0f);  // the data became visible in order
  EXPECT_EQ(sim.release_finished(), 1u);
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(sim.restores_in_flight(), 0u);
  EXPECT_EQ(sim.host_waits(), 0u);
}

TEST(SimDataPath, StagingBeyondTheBudgetWaitsOnTheHostAndIsCounted) {
  // Each cast store stages kElems float32 = 128 bytes; the budget holds one.
  SimDataPath sim(manual(/*staging=*/200));
  const Stream s = sim.create_stream();
  auto* src = static_cast<uint16_t*>(sim.allocate(kElems * 2));
  for (int64_t i = 0; i < kElems; ++i) src[i] = kernels::float_to_bf16(static_cast<float>(i));
  std::vector<float> pool1(kElems, 0.0f), pool2(kElems, 0.0f);
  sim.hold(s);
  const FenceRef f1 = sim.store({src, ElemType::kBFloat16, kCols, kCols}, 0,
                                whole(pool1.data(), ElemType::kFloat32), s);
  EXPECT_EQ(sim.staging_waits(), 0u);
  FenceRef f2;
  std::thread second([&] {
    f2 = sim.store({src, ElemType::kBFloat16, kCols, kCols}, 0,
                   whole(pool2.data(), ElemType::kFloat32), s);
  });
  sim.wait_for_host_waiters(1);  // the second store is blocked on the budget
  EXPECT_EQ(sim.staging_waits(), 1u);
  sim.release(s);
  second.join();
  sim.flush();
  EXPECT_TRUE(f1->ready());
  EXPECT_TRUE(f2->ready());
  EXPECT_EQ(pool2[9], 9.0f);
  EXPECT_EQ(sim.staging_waits(), 1u);
}

TEST(SimDataPath, StagingWithinTheBudgetNeverWaits) {
  SimDataPath sim(manual(/*staging=*/1024));
  const Stream s = sim.create_stream();
  auto* src = static_cast<uint16_t*>(sim.allocate(kElems * 2));
  std::vector<std::vector<float>> pools(8, std::vector<float>(kElems));
  sim.hold(s);
  for (auto& pool : pools) {
    (void)sim.store({src, ElemType::kBFloat16, kCols, kCols}, 0,
                    whole(pool.data(), ElemType::kFloat32), s);
  }
  EXPECT_EQ(sim.staging_in_flight(), 8u * kElems * 4);
  EXPECT_EQ(sim.staging_waits(), 0u);
  sim.release(s);
}

TEST(SimDataPath, PointerChecksNameTheArgument) {
  SimDataPath::Options o;
  o.devices = 2;
  SimDataPath sim(o);
  void* on0 = sim.allocate(64, 0);
  void* on1 = sim.allocate(64, 1);
  std::vector<float> host(16);
  EXPECT_NO_THROW(sim.check_pointer(on0, true, 0, "hidden_states"));
  EXPECT_NO_THROW(sim.check_pointer(static_cast<char*>(on1) + 60, true, 1, "out"));
  EXPECT_NO_THROW(sim.check_pointer(host.data(), false, 0, "out"));
  try {
    sim.check_pointer(on1, true, 0, "hidden_states");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_states"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("device 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sim.check_pointer(host.data(), true, 0, "out"), InvalidArgument);
  EXPECT_THROW(sim.check_pointer(on0, false, 0, "out"), InvalidArgument);
  EXPECT_THROW(sim.check_pointer(on0, true, 2, "out"), InvalidArgument);
}

TEST(SimDataPath, RestoreWritesEveryOutputDType) {
  SimDataPath sim(manual());
  const Stream s = sim.create_stream();
  std::vector<float> pool(kElems);
  for (int64_t i = 0; i < kElems; ++i) pool[static_cast<size_t>(i)] = 1.0f + 1.0f / 3.0f * i;
  const GatherSegment seg{pool.data(), 0, kElems, ElemType::kFloat32};
  auto* bf = static_cast<uint16_t*>(sim.allocate(kElems * 2));
  auto* f16 = static_cast<uint16_t*>(sim.allocate(kElems * 2));
  sim.restore({&seg, 1}, {bf, kCols, kCols, ElemType::kBFloat16}, 0, s, {}, nullptr);
  sim.restore({&seg, 1}, {f16, kCols, kCols, ElemType::kFloat16}, 0, s, {}, nullptr);
  for (int64_t i = 0; i < kElems; ++i) {
    ASSERT_EQ(bf[i], kernels::float_to_bf16(pool[static_cast<size_t>(i)]));
    ASSERT_EQ(f16[i], kernels::float_to_f16(pool[static_cast<size_t>(i)]));
  }
}

TEST(SimDataPath, DestructionWithWorkInFlightRunsItFirst) {
  // A delay makes every operation still queued when the path dies; the destructor must run them
  // (ASan: nothing writes freed memory) and release the restores' keep-alives.
  std::vector<float> pool(kElems * 16, 0.0f);
  std::weak_ptr<int> watch;
  {
    SimDataPath::Options o;
    o.delay = std::chrono::milliseconds(20);
    SimDataPath sim(o);
    const Stream s = sim.create_stream();
    auto* src = static_cast<uint16_t*>(sim.allocate(kElems * 2));
    for (int64_t i = 0; i < kElems; ++i) src[i] = kernels::float_to_bf16(2.0f);
    for (int k = 0; k < 16; ++k) {
      (void)sim.store({src, ElemType::kBFloat16, kCols, kCols}, 0,
                      whole(pool.data() + k * kElems, ElemType::kFloat32), s);
    }
    auto pins = std::make_shared<int>(3);
    watch = pins;
    auto* out = static_cast<float*>(sim.allocate(kElems * 4));
    const GatherSegment seg{pool.data(), 0, kElems, ElemType::kFloat32};
    sim.restore({&seg, 1}, {out, kCols, kCols, ElemType::kFloat32}, 0, s, {}, std::move(pins));
  }
  EXPECT_TRUE(watch.expired());
  for (float v : pool) ASSERT_EQ(v, 2.0f);
}

TEST(SimDataPath, FlushWaitsForDelayedWork) {
  SimDataPath::Options o;
  o.delay = std::chrono::milliseconds(5);
  SimDataPath sim(o);
  const Stream s = sim.create_stream();
  float* src = device_rows(sim, 3.0f);
  std::vector<float> pool(kElems, 0.0f);
  const FenceRef fence = sim.store({src, ElemType::kFloat32, kCols, kCols}, 0,
                                   whole(pool.data(), ElemType::kFloat32), s);
  sim.flush();
  EXPECT_TRUE(fence->ready());
  EXPECT_EQ(pool[2], 5.0f);
}

TEST(SimDataPath, FactoryHookSubstitutesThePath) {
  Config config;
  SimDataPath* made = nullptr;
  {
    ScopedDevicePathFactory hook([&](const Config& c) {
      SimDataPath::Options o;
      o.staging_bytes = static_cast<uint64_t>(c.hidden_state_staging_bytes);
      auto path = std::make_unique<SimDataPath>(o);
      made = path.get();
      return path;
    });
    auto path = DevicePath::create(config);
    EXPECT_EQ(path.get(), made);
  }
  // Without the hook this CPU-only process has no device path.
#if !HSS_WITH_CUDA
  EXPECT_EQ(DevicePath::create(config), nullptr);
#endif
}

}  // namespace
}  // namespace hss::detail
