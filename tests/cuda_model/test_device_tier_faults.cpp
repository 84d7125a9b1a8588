// The device-resident hot tier's faults on the CUDA runtime model: its allocation failing at
// construction (the store runs without it, counted), a failed launch of its kernel (the device
// copies are lost, the pool serves), a copy failing mid-run (the context is lost: nothing stale is
// served), a device lost after the store. The values: tests/gpu/test_device_tier.cpp.

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cuda_model.hpp"
#include "gpu/gpu_test_util.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"

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

struct ResetDevicesAfter {
  ~ResetDevicesAfter() {
    for (int d = 0; d < cuda_model::device_count(); ++d) {
      (void)cudaSetDevice(d);
      (void)cudaDeviceReset();
    }
    (void)cudaSetDevice(0);
    (void)cudaGetLastError();
    cuda_model::clear_faults();
  }
};

class DeviceTierFaults : public ::testing::Test {
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
  std::pair<int64_t, std::vector<float>> restore_on_device(HiddenStateStore& store,
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

  std::vector<std::unique_ptr<DeviceBytes>> buffers_;
};

TEST_F(DeviceTierFaults, AFailedAllocationAtConstructionLeavesTheStoreWithoutTheTierCounted) {
  ChunkedTokenDatabase db(kChunk, false);
  Config c = tier_config(0);
  c.hidden_state_block_bytes = 64 << 10;
  c.hidden_state_device_cache_size = 32.0;  // more than the model's 16 GiB of device memory
  HiddenStateStore store(c, db);
  const auto row = device_row(store);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->errors, 1u);
  EXPECT_EQ(row->entries_held, 0u);
  const auto t = tokens64(2 * kChunk, 12);
  const auto want = rows_of(t);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(want)).written, 2);
  const auto [rows, got] = restore_on_device(store, t);
  EXPECT_EQ(rows, 2 * kChunk);
  EXPECT_EQ(got, want);
  EXPECT_EQ(device_row(store)->hits, 0u);
}

TEST_F(DeviceTierFaults, ATierSmallerThanAGranuleOfThePoolIsOffCounted) {
  ChunkedTokenDatabase db(kChunk, false);
  Config c = tier_config(0);
  c.hidden_state_device_cache_size = 128.0 / static_cast<double>(1ULL << 30);  // 128 bytes
  HiddenStateStore store(c, db);  // the pool's granule is 256 bytes
  const auto row = device_row(store);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->errors, 1u);
  const auto t = tokens64(kChunk, 21);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(rows_of(t))).written, 1);
  EXPECT_EQ(device_row(store)->entries_held, 0u);
}

TEST_F(DeviceTierFaults, APoolThatIsNotPageLockedLeavesTheStoreWithoutTheTier) {
  ChunkedTokenDatabase db(kChunk, false);
  cuda_model::fail_allocation(0);  // the pool's cudaHostAlloc: the pool falls back to pageable
  HiddenStateStore store(tier_config(8), db);
  cuda_model::clear_faults();
  ASSERT_FALSE(store.stats().pinned);
  const auto row = device_row(store);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->errors, 1u);
  const auto t = tokens64(2 * kChunk, 17);
  const auto want = rows_of(t);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(want)).written, 2);
  const auto [rows, got] = restore_on_device(store, t);
  EXPECT_EQ(rows, 2 * kChunk);
  EXPECT_EQ(got, want);
}

TEST_F(DeviceTierFaults, WithoutPeerAccessARestoreOntoAnotherDeviceReadsThePool) {
  ASSERT_EQ(cuda_model::device_count(), 2) << "run with HSS_CUDA_MODEL_DEVICES=2 (ctest sets it)";
  struct PeerSupportBack {
    ~PeerSupportBack() { cuda_model::set_peer_access_supported(true); }
  } back;
  (void)cudaSetDevice(1);
  (void)cudaDeviceReset();  // drops access an earlier test enabled
  (void)cudaSetDevice(0);
  cuda_model::set_peer_access_supported(false);
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(8, 0), db);
  const auto t = tokens64(2 * kChunk, 18);
  const auto want = rows_of(t);
  ASSERT_EQ(store.store_hidden_states(t, device_rows(want)).written, 2);
  const auto [rows, got] = restore_on_device(store, t, 1);
  EXPECT_EQ(rows, 2 * kChunk);
  EXPECT_EQ(got, want);
  EXPECT_EQ(device_row(store)->hits, 0u);
  // With peer access the same restore reads the copies (a new store asks CUDA afresh).
  cuda_model::set_peer_access_supported(true);
  HiddenStateStore peered(tier_config(8, 0), db);
  ASSERT_EQ(peered.store_hidden_states(t, device_rows(want)).written, 2);
  const auto [rows2, got2] = restore_on_device(peered, t, 1);
  EXPECT_EQ(rows2, 2 * kChunk);
  EXPECT_EQ(got2, want);
  EXPECT_EQ(device_row(peered)->hits, 2u);
}

TEST_F(DeviceTierFaults, ADeviceCopyWhoseKernelFailsIsDroppedAndItsEntryServedFromThePool) {
  ResetDevicesAfter reset;
  ChunkedTokenDatabase db(kChunk, false);
  Config c = tier_config(8);
  c.tuning.store_impl = StoreImpl::kMapped;  // the pool's kernel, then the copies', one stream
  auto store = std::make_unique<HiddenStateStore>(c, db);
  const auto t = tokens64(2 * kChunk, 23);
  const auto want = rows_of(t);
  const TensorView src = device_rows(want);
  const auto chunks = db.process_tokens(std::span<const int64_t>(t));
  StreamHolder s, other;
  StoreOptions so;
  so.stream = s.stream;
  DeviceBytes a(64), b(64);
  cuda_model::set_manual(true);
  ASSERT_EQ(store->store_hidden_states(t, src, so).written, 2);
  // Run the caller's stream up to the pool's fence (the first kernel and its records), and let
  // the store see it landed (coverage queries the fences without waiting).
  const auto kernels_run = [&] {
    size_t n = 0;
    for (const std::string& op : cuda_model::history(s.stream)) n += op.rfind("kernel", 0) == 0;
    return n;
  };
  while (kernels_run() < 1 && cuda_model::step()) {
  }
  for (int i = 0; i < 2; ++i) (void)cuda_model::step();  // the launch slot's and fence's records
  EXPECT_EQ(store->coverage(chunks, std::vector<int64_t>{0}), 2 * kChunk);
  // Then the context is lost before the device copies' kernel runs: their fence fails.
  cuda_model::fail_copy(0);
  (void)cudaMemcpyAsync(b.ptr, a.ptr, 64, cudaMemcpyDeviceToDevice, other.stream);
  cuda_model::set_manual(false);
  (void)cudaDeviceSynchronize();
  (void)cudaGetLastError();
  store->flush();  // the fences' outcomes are known now
  // A host retrieve serves the pool's rows and drops the failed device copies, counted.
  const auto host = store->retrieve_hidden_states(t);
  ASSERT_TRUE(host.has_value());
  EXPECT_EQ(std::memcmp(host->data(), want.data(), host->bytes()), 0);
  const auto row = device_row(*store);
  EXPECT_EQ(row->errors, 2u);
  store.reset();
}

TEST_F(DeviceTierFaults, AFailedLaunchLosesTheDeviceCopiesOnlyCounted) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(tier_config(8), db);
  const auto t = tokens64(2 * kChunk, 13);
  const auto want = rows_of(t);
  const TensorView src = device_rows(want);
  // The single store's gather into staging is launch 0; the device copies' kernel launch 1.
  cuda_model::fail_launch(1);
  ASSERT_EQ(store.store_hidden_states(t, src).written, 2);
  cuda_model::clear_faults();
  (void)cudaGetLastError();
  const auto row = device_row(store);
  EXPECT_EQ(row->errors, 2u);
  EXPECT_EQ(row->entries_held, 0u);
  const auto [rows, got] = restore_on_device(store, t);
  EXPECT_EQ(rows, 2 * kChunk);
  EXPECT_EQ(got, want);
  const auto host = store.retrieve_hidden_states(t);
  ASSERT_TRUE(host.has_value());
  EXPECT_EQ(std::memcmp(host->data(), want.data(), host->bytes()), 0);
}

TEST_F(DeviceTierFaults, AStickyErrorMidRunServesNothingStale) {
  ResetDevicesAfter reset;
  ChunkedTokenDatabase db(kChunk, false);
  auto store = std::make_unique<HiddenStateStore>(tier_config(8), db);
  const auto t = tokens64(2 * kChunk, 14);
  const TensorView src = device_rows(rows_of(t));
  const MutableTensorView out = device_out(2 * kChunk);
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;
  {
    test::StreamGate gate(s.stream);
    cuda_model::fail_copy(0);  // the pool's copy fails when it runs: the context is lost
    EXPECT_EQ(store->store_hidden_states(t, src, so).written, 2);
  }
  EXPECT_NE(cudaDeviceSynchronize(), cudaSuccess);
  // Neither the pool nor the device copies serve the chunks (the device copies' kernel ran
  // after the failure on a lost context, so their fence failed too).
  RetrieveOptions ro;
  ro.stream = s.stream;
  store->flush();
  EXPECT_EQ(store->retrieve_hidden_states_into(t, out, ro), 0);
  EXPECT_FALSE(store->retrieve_hidden_states(t).has_value());
  store->check_invariants();
  store.reset();
}

TEST_F(DeviceTierFaults, ADeviceLostAfterTheStoreServesNoDeviceCopy) {
  ResetDevicesAfter reset;
  ChunkedTokenDatabase db(kChunk, false);
  auto store = std::make_unique<HiddenStateStore>(tier_config(8), db);
  const auto t = tokens64(2 * kChunk, 15);
  const auto want = rows_of(t);
  ASSERT_EQ(store->store_hidden_states(t, device_rows(want)).written, 2);
  const MutableTensorView out = device_out(2 * kChunk);
  store->flush();
  // The device is lost mid-run (a copy of the engine's own faults it): every later device call
  // fails; the restore reports it and serves nothing, and the pool still serves host outputs.
  DeviceBytes a(64), b(64);
  cuda_model::fail_copy(0);
  (void)cudaMemcpy(b.ptr, a.ptr, 64, cudaMemcpyDeviceToDevice);
  (void)cudaDeviceSynchronize();
  ASSERT_NE(cuda_model::sticky_error(0), cudaSuccess);
  (void)cudaGetLastError();
  RetrieveOptions ro;
  EXPECT_THROW((void)store->retrieve_hidden_states_into(t, out, ro), Error);
  EXPECT_EQ(device_row(*store)->hits, 0u);
  const auto host = store->retrieve_hidden_states(t);
  ASSERT_TRUE(host.has_value());
  EXPECT_EQ(std::memcmp(host->data(), want.data(), host->bytes()), 0);
  store.reset();
}

}  // namespace
}  // namespace hss
