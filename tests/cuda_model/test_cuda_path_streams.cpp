// The CUDA path's copy streams and the default streams (label model). A store's device-to-host
// copies run on a copy stream paired with the caller's stream, so that one caller never queues
// behind another's copies. cudaStreamPerThread is one handle for every thread but names a stream
// per host thread: each thread gets a copy stream of its own, which goes once the thread has
// exited. nullptr and cudaStreamLegacy name the one legacy stream: one copy stream. The model
// counts the streams hsstore creates and destroys (cuda_model::counters) and gives every host
// thread its own per-thread default stream, as CUDA does.

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "cuda_model.hpp"
#include "gpu/gpu_test_util.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"

namespace hss {
namespace {

using test::DeviceBytes;
using test::tokens64;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 64;
constexpr int64_t kRows = 2 * kChunk;

std::vector<float> rows_of(const std::vector<int64_t>& tokens) {
  const std::vector<int32_t> t32(tokens.begin(), tokens.end());
  return test::make_rows(t32, 0, 0, kCols);
}

/// True once everything queued on `stream` (as the calling thread names it) has run, polled for
/// at most `limit`: never a host wait that could hang the test.
bool finishes_within(cudaStream_t stream, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status != cudaErrorNotReady) return status == cudaSuccess;
    (void)cudaGetLastError();  // the query's cudaErrorNotReady
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

class CopyStreams : public ::testing::Test {
 protected:
  void SetUp() override { HSS_REQUIRE_DEVICE(); }

  TensorView device_rows(const std::vector<float>& rows) {
    buffers_.push_back(std::make_unique<DeviceBytes>(rows.size() * 4));
    test::upload(*buffers_.back(), rows.data(), rows.size() * 4);
    return {buffers_.back()->ptr, DType::kFloat32, kRows, kCols, 0, Device::kCuda, 0};
  }
  MutableTensorView device_out() {
    buffers_.push_back(std::make_unique<DeviceBytes>(static_cast<size_t>(kRows * kCols) * 4));
    test::fill(buffers_.back()->ptr, 0, buffers_.back()->bytes);
    return {buffers_.back()->ptr, DType::kFloat32, kRows, kCols, 0, Device::kCuda, 0};
  }
  static void expect_stored(HiddenStateStore& store, const std::vector<int64_t>& tokens,
                            const std::vector<float>& want) {
    const auto got = store.retrieve_hidden_states(tokens);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(std::memcmp(got->data(), want.data(), got->bytes()), 0);
  }

  std::vector<std::unique_ptr<DeviceBytes>> buffers_;
};

TEST_F(CopyStreams, TwoThreadsOnCudaStreamPerThreadGetCopyStreamsOfTheirOwn) {
  // Thread A's per-thread stream is held (a long kernel), so its copy stream waits for A's
  // gather. Thread B, on its own per-thread stream, stores and restores meanwhile: its copies
  // must not queue behind A's.
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(test::store_config(kChunk, kCols, 64), db);
  const auto ta = tokens64(kRows, 41), tb = tokens64(kRows, 42);
  const auto want_a = rows_of(ta), want_b = rows_of(tb);
  const TensorView rows_a = device_rows(want_a), rows_b = device_rows(want_b);
  const MutableTensorView out_b = device_out();
  const cuda_model::Counters before = cuda_model::counters();

  std::shared_ptr<test::StreamGate> gate_a;
  std::promise<void> a_stored, a_release;
  std::thread a([&] {
    gate_a = std::make_shared<test::StreamGate>(cudaStreamPerThread);
    StoreOptions so;
    so.stream = cudaStreamPerThread;
    EXPECT_EQ(store.store_hidden_states(ta, rows_a, so), (StoreResult{2, 2}));
    a_stored.set_value();
    a_release.get_future().wait();
    EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  });
  a_stored.get_future().wait();
  bool b_landed = false;
  std::thread b([&] {
    StoreOptions so;
    so.stream = cudaStreamPerThread;
    RetrieveOptions ro;
    ro.stream = cudaStreamPerThread;
    EXPECT_EQ(store.store_hidden_states(tb, rows_b, so), (StoreResult{2, 2}));
    EXPECT_EQ(store.retrieve_hidden_states_into(tb, out_b, ro), kRows);
    b_landed = finishes_within(cudaStreamPerThread, std::chrono::seconds(10));
  });
  b.join();
  EXPECT_TRUE(b_landed) << "thread B's copies queued behind thread A's held stream";
  EXPECT_EQ(cuda_model::counters().streams_created - before.streams_created, 2u);

  gate_a->open();
  a_release.set_value();
  a.join();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got_b = test::download(out_b.data, want_b.size() * 4);
  EXPECT_EQ(std::memcmp(got_b.data(), want_b.data(), got_b.size()), 0);
  expect_stored(store, ta, want_a);
  expect_stored(store, tb, want_b);
}

TEST_F(CopyStreams, AThreadsCopyStreamGoesOnceTheThreadHasExited) {
  // Threads come and go (a server's request threads): each one's copy stream is destroyed at the
  // next new thread's first store after it exited, so they never pile up.
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(test::store_config(kChunk, kCols, 64), db);
  constexpr int kThreads = 4;
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<float>> want;
  std::vector<TensorView> rows;
  for (int i = 0; i < kThreads; ++i) {
    tokens.push_back(tokens64(kRows, 50 + static_cast<uint64_t>(i)));
    want.push_back(rows_of(tokens.back()));
    rows.push_back(device_rows(want.back()));
  }
  const cuda_model::Counters before = cuda_model::counters();
  for (int i = 0; i < kThreads; ++i) {
    std::thread([&, i] {
      StoreOptions so;
      so.stream = cudaStreamPerThread;
      EXPECT_EQ(store.store_hidden_states(tokens[i], rows[i], so), (StoreResult{2, 2}));
    }).join();
  }
  const cuda_model::Counters after = cuda_model::counters();
  EXPECT_EQ(after.streams_created - before.streams_created, static_cast<uint64_t>(kThreads));
  EXPECT_EQ(after.streams_destroyed - before.streams_destroyed,
            static_cast<uint64_t>(kThreads - 1));
  store.flush();
  for (int i = 0; i < kThreads; ++i) expect_stored(store, tokens[i], want[i]);
}

TEST_F(CopyStreams, TheLegacyStreamHasOneCopyStreamWhicheverHandleNamesIt) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(test::store_config(kChunk, kCols, 64), db);
  const auto t1 = tokens64(kRows, 61), t2 = tokens64(kRows, 62);
  const auto want1 = rows_of(t1), want2 = rows_of(t2);
  const TensorView rows1 = device_rows(want1), rows2 = device_rows(want2);
  const cuda_model::Counters before = cuda_model::counters();
  StoreOptions so;
  so.stream = nullptr;
  EXPECT_EQ(store.store_hidden_states(t1, rows1, so), (StoreResult{2, 2}));
  so.stream = cudaStreamLegacy;
  EXPECT_EQ(store.store_hidden_states(t2, rows2, so), (StoreResult{2, 2}));
  EXPECT_EQ(cuda_model::counters().streams_created - before.streams_created, 1u);
  store.flush();
  expect_stored(store, t1, want1);
  expect_stored(store, t2, want2);
}

}  // namespace
}  // namespace hss
