// The store on the simulated asynchronous device path (src/sim_data_path.hpp, installed through
// ScopedDevicePathFactory): device-input stores on a blocked caller stream return at once and
// become visible in stream order, independent streams do not wait for each other, the staging
// budget is a counted host wait, and a store torn down with copies in flight is clean (ASan).

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "data_path.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"
#include "sim_data_path.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using detail::SimDataPath;
using test::make_rows;
using test::make_tokens;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;

class SimStoreTest : public ::testing::Test {
 protected:
  void make_store(SimDataPath::Options options, int64_t pool_chunks = 64) {
    config_ = test::store_config(kChunk, kCols, pool_chunks);
    detail::ScopedDevicePathFactory hook([&](const Config&) {
      auto path = std::make_unique<SimDataPath>(options);
      sim_ = path.get();
      return path;
    });
    store_ = std::make_unique<HiddenStateStore>(config_, db_);
    ASSERT_NE(sim_, nullptr);
    ASSERT_TRUE(store_->stats().device_path);
  }

  /// The rows of (tokens, layer) copied into simulated device memory, as a device view.
  TensorView device_rows(const std::vector<int32_t>& tokens, int64_t layer = 0) {
    const auto rows = make_rows(tokens, 0, layer, kCols);
    void* data = sim_->allocate(rows.size() * sizeof(float));
    std::memcpy(data, rows.data(), rows.size() * sizeof(float));
    return {data, DType::kFloat32, static_cast<int64_t>(tokens.size()), kCols, 0, Device::kCuda, 0};
  }

  TensorView device_rows_bf16(const std::vector<int32_t>& tokens) {
    const auto rows = test::to_bf16(make_rows(tokens, 0, 0, kCols));
    void* data = sim_->allocate(rows.size() * sizeof(uint16_t));
    std::memcpy(data, rows.data(), rows.size() * sizeof(uint16_t));
    return {data, DType::kBFloat16, static_cast<int64_t>(tokens.size()), kCols, 0, Device::kCuda,
            0};
  }

  StoreOptions on(Stream stream, int64_t layer = 0) {
    StoreOptions o;
    o.layer_idx = layer;
    o.stream = stream;
    return o;
  }

  void expect_retrieves(const std::vector<int32_t>& tokens, int64_t layer = 0) {
    RetrieveOptions o;
    o.layer_idx = layer;
    const auto got = store_->retrieve_hidden_states(tokens, o);
    ASSERT_TRUE(got.has_value());
    const auto want = make_rows(tokens, 0, layer, kCols);
    ASSERT_EQ(got->rows(), static_cast<int64_t>(tokens.size()));
    ASSERT_EQ(std::memcmp(got->data(), want.data(), got->bytes()), 0);
  }

  Config config_;
  ChunkedTokenDatabase db_{kChunk, false};
  SimDataPath* sim_ = nullptr;  // owned by the store
  std::unique_ptr<HiddenStateStore> store_;
};

TEST_F(SimStoreTest, StoreOnABlockedStreamReturnsAtOnceAndLandsWhenReleased) {
  make_store({});
  const Stream s = sim_->create_stream();
  const auto tokens = make_tokens(4 * kChunk, 1);
  const TensorView rows = device_rows(tokens);
  sim_->hold(s);
  (void)store_->store_hidden_states(tokens, rows, on(s));
  EXPECT_GT(sim_->queued(s), 0u);  // nothing ran: the GPU is busy
  EXPECT_EQ(sim_->host_waits(), 0u);
  // The engine's next step overwrites its tensor on the same stream.
  void* data = const_cast<void*>(rows.data);
  sim_->launch(s, [data] { std::memset(data, 0, 4 * kChunk * kCols * sizeof(float)); });
  sim_->release(s);
  expect_retrieves(tokens);
  EXPECT_EQ(sim_->host_waits(), 0u);
}

TEST_F(SimStoreTest, TwoStreamsOneBlockedTheOtherStoresAndRetrievesWithoutWaiting) {
  make_store({});
  const Stream a = sim_->create_stream();
  const Stream b = sim_->create_stream();
  const auto ta = make_tokens(2 * kChunk, 2);
  const auto tb = make_tokens(2 * kChunk, 3);
  sim_->hold(a);
  (void)store_->store_hidden_states(ta, device_rows(ta), on(a));
  (void)store_->store_hidden_states(tb, device_rows(tb), on(b));
  expect_retrieves(tb);  // B's copies landed although A's are queued
  EXPECT_EQ(sim_->host_waits(), 0u);
  sim_->release(a);
  expect_retrieves(ta);
}

TEST_F(SimStoreTest, CastStagingBeyondTheBudgetIsACountedHostWait) {
  SimDataPath::Options o;
  o.staging_bytes = kChunk * kCols * 4 * 2;  // one two-chunk cast store fits, not two
  make_store(o);
  const Stream s = sim_->create_stream();
  const auto t1 = make_tokens(2 * kChunk, 4);
  const auto t2 = make_tokens(2 * kChunk, 5);
  const TensorView r1 = device_rows_bf16(t1);
  const TensorView r2 = device_rows_bf16(t2);
  sim_->hold(s);
  (void)store_->store_hidden_states(t1, r1, on(s));
  EXPECT_EQ(sim_->staging_waits(), 0u);
  std::thread second([&] { (void)store_->store_hidden_states(t2, r2, on(s)); });
  sim_->wait_for_host_waiters(1);
  EXPECT_EQ(sim_->staging_waits(), 1u);
  sim_->release(s);
  second.join();
  expect_retrieves(t1);
  expect_retrieves(t2);
}

TEST_F(SimStoreTest, DeviceOutputRetrieveWritesTheRows) {
  make_store({});
  const Stream s = sim_->create_stream();
  const auto tokens = make_tokens(3 * kChunk, 6);
  (void)store_->store_hidden_states(tokens, device_rows(tokens), on(s));
  auto* out = static_cast<float*>(sim_->allocate(tokens.size() * kCols * sizeof(float)));
  RetrieveOptions ro;
  ro.stream = s;
  const MutableTensorView view{
      out, DType::kFloat32, static_cast<int64_t>(tokens.size()), kCols, 0, Device::kCuda, 0};
  EXPECT_EQ(store_->retrieve_hidden_states_into(tokens, view, ro),
            static_cast<int64_t>(tokens.size()));
  store_->flush();
  const auto want = make_rows(tokens, 0, 0, kCols);
  EXPECT_EQ(std::memcmp(out, want.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(sim_->restores_in_flight(), 0u);
}

TEST_F(SimStoreTest, DestructionWithCopiesInFlightIsClean) {
  SimDataPath::Options o;
  o.delay = std::chrono::milliseconds(10);
  make_store(o, /*pool_chunks=*/8);
  const Stream s = sim_->create_stream();
  for (uint64_t seed = 10; seed < 16; ++seed) {  // more than the pool: evictions meanwhile
    const auto tokens = make_tokens(2 * kChunk, seed);
    (void)store_->store_hidden_states(tokens, device_rows_bf16(tokens), on(s));
  }
  store_.reset();  // copies still queued: they must land before the pool goes (ASan)
  SUCCEED();
}

}  // namespace
}  // namespace hss
