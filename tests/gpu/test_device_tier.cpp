// The device-resident hot tier (hidden_state_device_cache_size), on a GPU and on the CUDA runtime
// model: device stores keep a device copy and write the pool through; device restores on the
// tier's device read resident chunks device to device in the same gather as pool chunks;
// pressure drops device copies only; stats().tiers' `device` row; coverage_by_tier; threads; two
// devices (suite DeviceTierTwoDevices: restores onto the other device read the pool). The faults
// are the model's (tests/cuda_model/test_device_tier_faults.cpp).

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpu_test_util.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"

#if !HSS_WITH_CUDA

TEST(DeviceTier, RequiresACudaBuild) {
  GTEST_SKIP() << "built without CUDA (HSS_ENABLE_CUDA=OFF): " << hss::runtime_info().reason;
}

#else

namespace hss {
namespace {

using test::DeviceBytes;
using test::StreamHolder;
using test::tokens64;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 64;
constexpr uint64_t kChunkBytes = kChunk * kCols * 4;

std::vector<float> rows_of(const std::vector<int64_t>& tokens) {
  const std::vector<int32_t> t32(tokens.begin(), tokens.end());
  return test::make_rows(t32, 0, 0, kCols);
}

/// A pool of 64 float32 chunks and a device tier of `device_chunks` of them (0: off).
Config tier_config(int64_t device_chunks, int64_t device = -1) {
  Config c = test::store_config(kChunk, kCols, 64);
  c.hidden_state_device_cache_size =
      static_cast<double>(device_chunks * static_cast<int64_t>(kChunkBytes)) /
      static_cast<double>(1ULL << 30);
  c.hidden_state_device = device;
  return c;
}

/// The `device` row of stats().tiers, or none.
std::optional<TierStats> device_row(const HiddenStateStore& store) {
  for (const TierStats& t : store.stats().tiers) {
    if (t.name == "device") return t;
  }
  return std::nullopt;
}

class DeviceTier : public ::testing::Test {
 protected:
  void SetUp() override { HSS_REQUIRE_DEVICE(); }

  void* device_copy(const void* host, size_t bytes, int device = 0) {
    (void)cudaSetDevice(device);
    buffers_.push_back(std::make_unique<DeviceBytes>(bytes));
    test::upload(*buffers_.back(), host, bytes);
    (void)cudaSetDevice(0);
    return buffers_.back()->ptr;
  }
  TensorView device_rows(const std::vector<float>& rows, int device = 0) {
    return {device_copy(rows.data(), rows.size() * 4, device),
            DType::kFloat32,
            static_cast<int64_t>(rows.size()) / kCols,
            kCols,
            0,
            Device::kCuda,
            device};
  }
  MutableTensorView device_out(int64_t rows, int device = 0) {
    (void)cudaSetDevice(device);
    buffers_.push_back(std::make_unique<DeviceBytes>(static_cast<size_t>(rows * kCols) * 4));
    test::fill(buffers_.back()->ptr, 0, buffers_.back()->bytes);
    (void)cudaSetDevice(0);
    return {buffers_.back()->ptr, DType::kFloat32, rows, kCols, 0, Device::kCuda, device};
  }
  static std::vector<float> read(const MutableTensorView& out) {
    const auto bytes = test::download(out.data, static_cast<size_t>(out.rows * out.cols) * 4);
    std::vector<float> v(bytes.size() / 4);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  }
  /// Restores `tokens` into a fresh device buffer on `device`; the rows written and the buffer.
  std::pair<int64_t, std::vector<float> > restore_on_device(HiddenStateStore& store,
                                                            const std::vector<int64_t>& tokens,
                                                            int device = 0) {
    const MutableTensorView out = device_out(static_cast<int64_t>(tokens.size()), device);
    (void)cudaSetDevice(device);  // the stream on the output's device
    StreamHolder s;
    (void)cudaSetDevice(0);
    RetrieveOptions ro;
    ro.stream = s.stream;
    const int64_t rows = store.retrieve_hidden_states_into(tokens, out, ro);
    EXPECT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
    return {rows, read(out)};
  }

  std::vector<std::unique_ptr<DeviceBytes> > buffers_;
};

TEST_F(DeviceTier, OffByDefaultTheStatsHaveNoDeviceRow) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(0), db);
  const auto t = tokens64(2 * kChunk, 1);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(rows_of(t))).written, 2);
  EXPECT_FALSE(device_row(store).has_value());
  const auto chunks = db.process_tokens(std::span<const int64_t>(t));
  EXPECT_EQ(store.coverage_by_tier(chunks, std::vector<Slot>{Slot{}}).chunk_tiers,
            (std::vector<std::string>{"host", "host"}));
}

TEST_F(DeviceTier, ADeviceStoreIsResidentAndItsRestoreReadsItDeviceToDevice) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(8), db);
  const auto t = tokens64(3 * kChunk, 2);
  const auto want = rows_of(t);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(want)).written, 3);
  auto row = device_row(store);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->entries_held, 3u);
  EXPECT_EQ(row->bytes_held, 3 * kChunkBytes);
  const auto [rows, got] = restore_on_device(store, t);
  EXPECT_EQ(rows, 3 * kChunk);
  EXPECT_EQ(got, want);
  row = device_row(store);
  EXPECT_EQ(row->hits, 3u);
  EXPECT_EQ(row->errors, 0u);
  const auto chunks = db.process_tokens(std::span<const int64_t>(t));
  EXPECT_EQ(store.coverage_by_tier(chunks, std::vector<Slot>{Slot{}}).chunk_tiers,
            (std::vector<std::string>{"device", "device", "device"}));
  store.check_invariants();
}

TEST_F(DeviceTier, TheHostPoolGetsEveryDeviceStoreWriteThrough) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(8), db);
  const auto t = tokens64(2 * kChunk, 3);
  const auto want = rows_of(t);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(want)).written, 2);
  const auto got = store.retrieve_hidden_states(t);  // a host output reads the pool
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->bytes(), want.size() * 4);
  EXPECT_EQ(std::memcmp(got->data(), want.data(), got->bytes()), 0);
  EXPECT_EQ(device_row(store)->hits, 0u);
}

TEST_F(DeviceTier, OneRestoreMixesResidentAndPoolChunksInOneLaunch) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(8), db);
  const auto t = tokens64(4 * kChunk, 4);
  const auto want = rows_of(t);
  // Chunks 0-1 from a device tensor (resident), 2-3 from a host tensor (pool only).
  const std::vector<int64_t> head(t.begin(), t.begin() + 2 * kChunk);
  const std::vector<float> head_rows(want.begin(), want.begin() + 2 * kChunk * kCols);
  ASSERT_EQ(store.store_hidden_states(head, device_rows(head_rows)).written, 2);
  ASSERT_EQ(store.store_hidden_states(t, test::view_of(want, kCols)).written, 2);
  store.flush();
  const auto chunks = db.process_tokens(std::span<const int64_t>(t));
  EXPECT_EQ(store.coverage_by_tier(chunks, std::vector<Slot>{Slot{}}).chunk_tiers,
            (std::vector<std::string>{"device", "device", "host", "host"}));
  const uint64_t launches = store.stats().device_launches;
  const auto [rows, got] = restore_on_device(store, t);
  EXPECT_EQ(rows, 4 * kChunk);
  EXPECT_EQ(got, want);
  EXPECT_EQ(store.stats().device_launches - launches, 1u);  // one gather for both kinds
  EXPECT_EQ(device_row(store)->hits, 2u);
}

TEST_F(DeviceTier, AMixedRestoreThroughTheCopyEnginesReadsBothKinds) {
  ChunkedTokenDatabase db(kChunk, false);
  Config c = tier_config(8);
  c.tuning.restore_impl = RestoreImpl::kCopyEngine;
  HiddenStateStore store(c, db);
  const auto t = tokens64(4 * kChunk, 16);
  const auto want = rows_of(t);
  const std::vector<int64_t> head(t.begin(), t.begin() + 2 * kChunk);
  const std::vector<float> head_rows(want.begin(), want.begin() + 2 * kChunk * kCols);
  ASSERT_EQ(store.store_hidden_states(head, device_rows(head_rows)).written, 2);
  ASSERT_EQ(store.store_hidden_states(t, test::view_of(want, kCols)).written, 2);
  store.flush();
  const auto [rows, got] = restore_on_device(store, t);
  EXPECT_EQ(rows, 4 * kChunk);
  EXPECT_EQ(got, want);
  EXPECT_EQ(device_row(store)->hits, 2u);
}

TEST_F(DeviceTier, ACallOnACapturingStreamIsRefusedAndTheTierIsUnchanged) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(8), db);
  const auto t = tokens64(2 * kChunk, 18);
  const auto want = rows_of(t);
  const TensorView src = device_rows(want);
  ASSERT_EQ(store.store_hidden_states(t, src).written, 2);
  const MutableTensorView out = device_out(2 * kChunk);
  const auto other = tokens64(2 * kChunk, 19);
  StreamHolder s;
  CUDA_OK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeGlobal));
  StoreOptions so;
  so.stream = s.stream;
  RetrieveOptions ro;
  ro.stream = s.stream;
  EXPECT_THROW((void)store.store_hidden_states(other, src, so), Error);
  EXPECT_THROW((void)store.retrieve_hidden_states_into(t, out, ro), Error);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s.stream, &graph), cudaSuccess);  // the capture stayed valid
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  const auto row = device_row(store);
  EXPECT_EQ(row->entries_held, 2u);
  EXPECT_EQ(row->hits, 0u);
  EXPECT_EQ(row->errors, 0u);
  const auto [rows, got] = restore_on_device(store, t);  // and serves as before
  EXPECT_EQ(rows, 2 * kChunk);
  EXPECT_EQ(got, want);
}

TEST_F(DeviceTier, AnFp8DeviceCopyRestoresAsThePoolsEntryDoes) {
  // FP8 storage: the device copy holds the codes and row scales the pool holds, so a restore from
  // it equals the restore of the same entry from the pool (tier off), element for element.
  const auto t = tokens64(2 * kChunk, 20);
  const auto want = rows_of(t);
  const TensorView src = device_rows(want);
  std::vector<float> restored[2];
  for (const int tier_chunks : {8, 0}) {
    ChunkedTokenDatabase db(kChunk, false);
    Config c = tier_config(tier_chunks);
    c.hidden_state_storage_dtype = StorageDType::kFp8E4M3;
    HiddenStateStore store(c, db);
    ASSERT_EQ(store.store_hidden_states(t, src).written, 2);
    const auto [rows, got] = restore_on_device(store, t);
    EXPECT_EQ(rows, 2 * kChunk);
    restored[tier_chunks == 0 ? 1 : 0] = got;
    if (tier_chunks != 0) {
      EXPECT_EQ(device_row(store)->hits, 2u);
    }
  }
  EXPECT_EQ(restored[0], restored[1]);
  EXPECT_NE(restored[0], std::vector<float>(want.size(), 0.0f));
}

TEST_F(DeviceTier, DevicePoolPressureDropsOnlyDeviceCopiesOfTheLeastRecentKeys) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(2), db);
  const auto a = tokens64(2 * kChunk, 5), b = tokens64(2 * kChunk, 6);
  const auto rows_a = rows_of(a), rows_b = rows_of(b);
  ASSERT_EQ(store.store_hidden_states(a, device_rows(rows_a)).written, 2);
  ASSERT_EQ(store.store_hidden_states(b, device_rows(rows_b)).written, 2);  // a's copies go
  const auto row = device_row(store);
  EXPECT_EQ(row->evictions, 2u);
  EXPECT_EQ(row->entries_held, 2u);
  EXPECT_EQ(store.stats().hs_evictions, 0u);
  EXPECT_EQ(store.num_cached_chunks(), 4u);
  const auto ca = db.process_tokens(std::span<const int64_t>(a));
  const auto cb = db.process_tokens(std::span<const int64_t>(b));
  EXPECT_EQ(store.coverage_by_tier(ca, std::vector<Slot>{Slot{}}).chunk_tiers,
            (std::vector<std::string>{"host", "host"}));
  EXPECT_EQ(store.coverage_by_tier(cb, std::vector<Slot>{Slot{}}).chunk_tiers,
            (std::vector<std::string>{"device", "device"}));
  // a still restores onto the device, from the pool.
  const auto [rows, got] = restore_on_device(store, a);
  EXPECT_EQ(rows, 2 * kChunk);
  EXPECT_EQ(got, rows_a);
  EXPECT_EQ(device_row(store)->hits, 0u);
}

TEST_F(DeviceTier, AStoreWhoseOwnKeysFillTheDevicePoolKeepsTheRestOnTheHostOnly) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(2), db);
  const auto t = tokens64(3 * kChunk, 7);
  const auto want = rows_of(t);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(want)).written, 3);
  EXPECT_EQ(device_row(store)->entries_held, 2u);
  EXPECT_EQ(device_row(store)->evictions, 0u);  // the call's own keys are never dropped for it
  const auto [rows, got] = restore_on_device(store, t);
  EXPECT_EQ(rows, 3 * kChunk);
  EXPECT_EQ(got, want);
  EXPECT_EQ(device_row(store)->hits, 2u);
}

TEST_F(DeviceTier, ARestoreOfASlotNotHeldRestoresNothing) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(8), db);
  const auto t = tokens64(2 * kChunk, 22);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(rows_of(t))).written, 2);  // layer 0
  const MutableTensorView out = device_out(2 * kChunk);
  StreamHolder s;
  RetrieveOptions ro;
  ro.stream = s.stream;
  ro.layer_idx = 1;  // the keys are there, this slot is not
  EXPECT_EQ(store.retrieve_hidden_states_into(t, out, ro), 0);
  EXPECT_EQ(device_row(store)->hits, 0u);
}

TEST_F(DeviceTier, EvictingAKeyDropsItsDeviceCopyToo) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(8), db);
  const auto t = tokens64(2 * kChunk, 8);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(rows_of(t))).written, 2);
  store.flush();  // a key whose copies are in flight is busy
  ASSERT_TRUE(store.evict_one_lru());
  store.flush();
  EXPECT_EQ(device_row(store)->entries_held, 1u);
  ASSERT_TRUE(store.evict_one_lru());
  store.flush();
  EXPECT_EQ(device_row(store)->entries_held, 0u);
  EXPECT_EQ(device_row(store)->bytes_held, 0u);
}

TEST_F(DeviceTier, ConcurrentStoresAndRestoresUnderPressureServeExactRows) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(4), db);
  constexpr int kThreads = 4;
  std::vector<std::vector<int64_t> > tokens;
  std::vector<std::vector<float> > rows;
  std::vector<TensorView> srcs;
  for (int i = 0; i < kThreads; ++i) {
    tokens.push_back(tokens64(2 * kChunk, 100 + static_cast<uint64_t>(i)));
    rows.push_back(rows_of(tokens.back()));
    srcs.push_back(device_rows(rows.back()));
  }
  std::vector<MutableTensorView> outs;
  for (int i = 0; i < kThreads; ++i) outs.push_back(device_out(2 * kChunk));
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      StreamHolder s;
      StoreOptions so;
      so.stream = s.stream;
      RetrieveOptions ro;
      ro.stream = s.stream;
      for (int round = 0; round < 5; ++round) {
        (void)store.store_hidden_states(tokens[static_cast<size_t>(i)],
                                        srcs[static_cast<size_t>(i)], so);
        const int64_t n = store.retrieve_hidden_states_into(tokens[static_cast<size_t>(i)],
                                                            outs[static_cast<size_t>(i)], ro);
        (void)cudaStreamSynchronize(s.stream);
        const auto got = read(outs[static_cast<size_t>(i)]);
        if (n != 2 * kChunk || got != rows[static_cast<size_t>(i)]) ++wrong[static_cast<size_t>(i)];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(kThreads, 0));
  store.flush();
  store.check_invariants();
  EXPECT_LE(device_row(store)->entries_held, 4u);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  (void)cudaGetLastError();
  return n;
}

class DeviceTierTwoDevices : public DeviceTier {
 protected:
  void SetUp() override {
    DeviceTier::SetUp();
    if (device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  }
};

TEST_F(DeviceTierTwoDevices, ARestoreOntoAnotherDeviceReadsTheCopiesWherePeerAccessIsAllowed) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(8, 0), db);
  const auto t = tokens64(2 * kChunk, 9);
  const auto want = rows_of(t);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(want)).written, 2);
  const auto [rows, got] = restore_on_device(store, t, 1);
  EXPECT_EQ(rows, 2 * kChunk);
  EXPECT_EQ(got, want);
  int peer = 0;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&peer, 1, 0), cudaSuccess);
  // Device 1's gather reads device 0's copies where it may; otherwise the pool serves it.
  EXPECT_EQ(device_row(store)->hits, peer != 0 ? 2u : 0u);
}

TEST_F(DeviceTierTwoDevices, AStoreFromAnotherDeviceKeepsNoDeviceCopy) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(8, 1), db);  // the tier lives on device 1
  const auto t = tokens64(2 * kChunk, 10);
  const auto want = rows_of(t);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(want, 0)).written, 2);
  EXPECT_EQ(device_row(store)->entries_held, 0u);
  ASSERT_EQ(store
                .store_hidden_states(tokens64(2 * kChunk, 11),
                                     device_rows(rows_of(tokens64(2 * kChunk, 11)), 1))
                .written,
            2);
  EXPECT_EQ(device_row(store)->entries_held, 2u);
  const auto [rows, got] = restore_on_device(store, tokens64(2 * kChunk, 11), 1);
  EXPECT_EQ(rows, 2 * kChunk);
  EXPECT_EQ(got, rows_of(tokens64(2 * kChunk, 11)));
  EXPECT_EQ(device_row(store)->hits, 2u);
}

}  // namespace
}  // namespace hss

#endif  // HSS_WITH_CUDA
