// The CUDA path against the CUDA runtime model, where a test needs what only the model shows
// (label model): which stream carried which operation, how many launch slots and how much
// staging a call took, what it allocated or loaded, and manual scheduling, which makes "no host
// wait" exact (nothing runs unless a host wait needs it). tests/gpu holds the rules a GPU can
// check too.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "datapath/cuda/device_path.hpp"
#include "cuda_model.hpp"
#include "gpu/gpu_test_util.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/token_database.hpp"

namespace hss {
namespace {

using test::DeviceBytes;
using test::StreamHolder;
using test::tokens64;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 64;

/// Manual scheduling for the test's scope: nothing runs unless a host wait needs it.
struct ManualScheduling {
  ManualScheduling() { cuda_model::set_manual(true); }
  ~ManualScheduling() { cuda_model::set_manual(false); }
};

std::vector<float> rows_of(const std::vector<int64_t>& tokens, int64_t layer = 0) {
  const std::vector<int32_t> t32(tokens.begin(), tokens.end());
  return test::make_rows(t32, 0, layer, kCols);
}

Config small_config(int64_t pool_chunks = 64) {
  return test::store_config(kChunk, kCols, pool_chunks);
}

class CudaPath : public ::testing::Test {
 protected:
  void SetUp() override { HSS_REQUIRE_DEVICE(); }

  void* device_copy(const void* host, size_t bytes) {
    buffers_.push_back(std::make_unique<DeviceBytes>(bytes));
    test::upload(*buffers_.back(), host, bytes);
    return buffers_.back()->ptr;
  }
  TensorView device_rows(const std::vector<int64_t>& tokens, DType dtype = DType::kFloat32) {
    const auto rows = rows_of(tokens);
    if (dtype == DType::kFloat32) {
      return {device_copy(rows.data(), rows.size() * 4),
              dtype,
              static_cast<int64_t>(tokens.size()),
              kCols,
              0,
              Device::kCuda,
              0};
    }
    const auto bits = dtype == DType::kBFloat16 ? test::to_bf16(rows) : test::to_f16(rows);
    return {device_copy(bits.data(), bits.size() * 2),
            dtype,
            static_cast<int64_t>(tokens.size()),
            kCols,
            0,
            Device::kCuda,
            0};
  }
  MutableTensorView device_out(int64_t rows) {
    buffers_.push_back(std::make_unique<DeviceBytes>(static_cast<size_t>(rows * kCols) * 4));
    test::fill(buffers_.back()->ptr, 0, buffers_.back()->bytes);
    return {buffers_.back()->ptr, DType::kFloat32, rows, kCols, 0, Device::kCuda, 0};
  }

  std::vector<std::unique_ptr<DeviceBytes>> buffers_;
};

TEST_F(CudaPath, ABatchLeasesOnlyTheLaunchSlotsItFills) {
  // One launch slot, manual scheduling: a batch's one launch takes the slot, and a second lease
  // for no work would wait on the host for that very launch.
  Config c = small_config();
  c.tuning.launch_slots = 1;
  ChunkedTokenDatabase db(kChunk, false);
  const auto t = tokens64(2 * kChunk, 1);
  const auto host_rows = rows_of(t);
  const TensorView rows = device_rows(t);
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;
  RetrieveOptions ro;
  ro.stream = s.stream;
  const MutableTensorView out = device_out(2 * kChunk);
  {
    HiddenStateStore store(c, db);
    ManualScheduling manual;
    const StoreItem items[] = {{t, rows, so}};
    EXPECT_EQ(store.store_batch(items)[0], (StoreResult{2, 2}));
    EXPECT_EQ(store.stats().launch_waits, 0u);
    store.flush();
    EXPECT_TRUE(store.retrieve_hidden_states(t).has_value());
  }
  HiddenStateStore store(c, db);
  ASSERT_EQ(store.store_hidden_states(t, test::view_of(host_rows, kCols)), (StoreResult{2, 2}));
  {
    ManualScheduling manual;
    const RetrieveItem reads[] = {{t, out, ro}};
    EXPECT_EQ(store.retrieve_batch_into(reads)[0], 2 * kChunk);
    EXPECT_EQ(store.stats().launch_waits, 0u);
    ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  }
  const auto got = test::download(out.data, 2 * kChunk * kCols * 4);
  EXPECT_EQ(std::memcmp(got.data(), host_rows.data(), got.size()), 0);
}

TEST_F(CudaPath, TheStagingBudgetCountsBytesNotRounds) {
  // Manual scheduling: nothing runs, so every cast store's staging stays in flight.
  ChunkedTokenDatabase db(kChunk, false);
  const auto one_chunk = [&](uint64_t seed) { return tokens64(kChunk, seed); };
  std::vector<std::vector<int64_t>> tokens;
  std::vector<TensorView> rows;
  for (uint64_t i = 0; i < 40; ++i) {
    tokens.push_back(one_chunk(100 + i));
    rows.push_back(device_rows(tokens.back(), DType::kBFloat16));  // 4 KiB of float32 staging each
  }
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;
  {
    // The default budget (1 GiB): 32 small casting stores in flight, no host wait.
    HiddenStateStore store(small_config(), db);
    ManualScheduling manual;
    for (size_t i = 0; i < 32; ++i) {
      ASSERT_EQ(store.store_hidden_states(tokens[i], rows[i], so), (StoreResult{1, 1}));
    }
    EXPECT_EQ(store.stats().staging_waits, 0u);
    store.flush();
  }
  // A budget of 40 KiB holds ten of them; the eleventh waits (once) for the oldest.
  Config c = small_config();
  c.tuning.staging_bytes = 40 << 10;
  HiddenStateStore store(c, db);
  ManualScheduling manual;
  for (size_t i = 0; i < 10; ++i) (void)store.store_hidden_states(tokens[i], rows[i], so);
  EXPECT_EQ(store.stats().staging_waits, 0u);
  (void)store.store_hidden_states(tokens[10], rows[10], so);
  EXPECT_EQ(store.stats().staging_waits, 1u);
  store.flush();
  for (size_t i = 0; i < 11; ++i) {
    const auto got = store.retrieve_hidden_states(tokens[i]);
    ASSERT_TRUE(got.has_value()) << i;
    const auto want = rows_of(tokens[i]);
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ(got->data()[k], kernels::bf16_to_float(kernels::float_to_bf16(want[k]))) << i;
    }
  }
}

TEST_F(CudaPath, Fp8StorageRunsOnTheDevicePathItsKernelsQuantiseAndDequantise) {
  // A store that finds a device takes FP8 storage: the caller's stream carries the quantising
  // gather (never the PCIe copy), and a device restore the dequantising gather. make_rows' values
  // are multiples of 1/8 in [-16, 16): E4M3 holds each row's within amax / 28.
  for (StorageDType storage : {StorageDType::kFp8E4M3, StorageDType::kFp8E5M2}) {
    Config c = small_config();
    c.hidden_state_storage_dtype = storage;
    ChunkedTokenDatabase db(kChunk, false);
    HiddenStateStore store(c, db);
    ASSERT_TRUE(store.stats().device_path);
    const auto t = tokens64(2 * kChunk, 9);
    StreamHolder s;
    StoreOptions so;
    so.stream = s.stream;
    ASSERT_EQ(store.store_hidden_states(t, device_rows(t), so), (StoreResult{2, 2}));
    store.flush();
    const std::string quantise = storage == StorageDType::kFp8E4M3
                                     ? "kernel gather_quantise<f32,e4m3>"
                                     : "kernel gather_quantise<f32,e5m2>";
    bool quantised = false;
    for (const std::string& op : cuda_model::history(s.stream)) {
      EXPECT_EQ(op.find("cudaMemcpy"), std::string::npos) << op;
      quantised = quantised || op.find(quantise) != std::string::npos;
    }
    EXPECT_TRUE(quantised) << quantise;

    DeviceBytes out(static_cast<size_t>(2 * kChunk * kCols) * 4);
    ASSERT_NE(out.ptr, nullptr);
    RetrieveOptions ro;
    ro.stream = s.stream;
    const MutableTensorView view{out.ptr, DType::kFloat32, 2 * kChunk, kCols, kCols, Device::kCuda,
                                 0};
    ASSERT_EQ(store.retrieve_hidden_states_into(t, view, ro), 2 * kChunk);
    ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
    bool dequantised = false;
    for (const std::string& op : cuda_model::history(s.stream)) {
      dequantised = dequantised || op.find("kernel restore_gather<f32>") != std::string::npos;
    }
    EXPECT_TRUE(dequantised);
    const auto got = test::download(out.ptr, out.bytes);
    const auto want = rows_of(t);
    const double bound = storage == StorageDType::kFp8E4M3 ? 1.0 / 28 : 1.0 / 14;
    for (int64_t r = 0; r < 2 * kChunk; ++r) {
      float amax = 0.0f;
      for (int64_t k = 0; k < kCols; ++k) amax = std::max(amax, std::fabs(want[r * kCols + k]));
      for (int64_t k = 0; k < kCols; ++k) {
        float v = 0.0f;
        std::memcpy(&v, got.data() + (r * kCols + k) * 4, 4);
        ASSERT_LE(std::fabs(v - want[r * kCols + k]), amax * bound * (1 + 1e-5)) << r << " " << k;
      }
    }
  }
}

TEST_F(CudaPath, TheCallersStreamCarriesTheGatherAndNeverThePcieCopy) {
  // Whatever the types, the caller's stream carries a device-side gather into staging and an
  // event; the device-to-host transfer runs on a copy stream (the engine's next kernels wait for
  // the gather only, not for PCIe).
  struct Case {
    DType dtype;
    StorageDType storage;
    int64_t stride;
  };
  for (const Case& k : {Case{DType::kFloat32, StorageDType::kFloat32, kCols},
                        Case{DType::kFloat32, StorageDType::kFloat32, kCols + 8},
                        Case{DType::kBFloat16, StorageDType::kNative, kCols},
                        Case{DType::kBFloat16, StorageDType::kFloat32, kCols}}) {
    Config c = small_config();
    c.hidden_state_storage_dtype = k.storage;
    ChunkedTokenDatabase db(kChunk, false);
    HiddenStateStore store(c, db);
    const auto t = tokens64(2 * kChunk, 7);
    TensorView rows = device_rows(t, k.dtype);
    std::vector<unsigned char> strided;
    if (k.stride != kCols) {  // the same rows with padding between them
      const auto dense = rows_of(t);
      strided.assign(static_cast<size_t>(2 * kChunk * k.stride) * 4, 0);
      for (int64_t r = 0; r < 2 * kChunk; ++r) {
        std::memcpy(strided.data() + r * k.stride * 4, dense.data() + r * kCols, kCols * 4);
      }
      rows.data = device_copy(strided.data(), strided.size());
      rows.row_stride = k.stride;
    }
    StreamHolder s;
    StoreOptions so;
    so.stream = s.stream;
    ASSERT_EQ(store.store_hidden_states(t, rows, so), (StoreResult{2, 2}));
    store.flush();
    const auto history = cuda_model::history(s.stream);
    bool gathered = false;
    for (const std::string& op : history) {
      EXPECT_EQ(op.find("cudaMemcpy"), std::string::npos) << op;
      gathered = gathered || op.find("kernel gather_cast") != std::string::npos;
    }
    EXPECT_TRUE(gathered);
    const auto got = store.retrieve_hidden_states(t);
    ASSERT_TRUE(got.has_value());
    const auto want = rows_of(t);
    for (size_t i = 0; i < want.size(); ++i) {
      const float w = k.dtype == DType::kFloat32
                          ? want[i]
                          : kernels::bf16_to_float(kernels::float_to_bf16(want[i]));
      ASSERT_EQ(got->data()[i], w) << i;
    }
  }
}

TEST_F(CudaPath, WhatIsFixedIsAllocatedAndWarmedUpAtConstructionNotOnTheFirstCalls) {
  // Inputs, outputs and the caller's stream first: only the store's own work is counted below.
  const auto t = tokens64(2 * kChunk, 9);
  const TensorView f32 = device_rows(t), bf16 = device_rows(t, DType::kBFloat16);
  const MutableTensorView out = device_out(2 * kChunk), out2 = device_out(2 * kChunk);
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;
  RetrieveOptions ro;
  ro.stream = s.stream;
  Config c = small_config();
  c.hidden_state_storage_dtype = StorageDType::kNative;
  ChunkedTokenDatabase db(kChunk, false);
  const size_t device_bytes_before = cuda_model::device_bytes(0);
  HiddenStateStore store(c, db);
  // The device's staging is taken now, before an engine sizes its KV cache from what is free.
  EXPECT_GE(cuda_model::device_bytes(0) - device_bytes_before,
            static_cast<size_t>(c.tuning.staging_bytes));
  const cuda_model::Counters before = cuda_model::counters();
  // Every kind of call: stores with and without a cast, a batch store, restores and a batch.
  (void)store.store_hidden_states(t, f32, so);
  (void)store.store_hidden_states(t, bf16, {1, 0, ActivationKind::kHidden, s.stream});
  const StoreItem items[] = {{t, f32, {2, 0, ActivationKind::kHidden, s.stream}}};
  (void)store.store_batch(items);
  EXPECT_EQ(store.retrieve_hidden_states_into(t, out, ro), 2 * kChunk);
  const RetrieveItem reads[] = {{t, out, ro}, {t, out2, {1, 0, ActivationKind::kHidden, s.stream}}};
  (void)store.retrieve_batch_into(reads);
  store.flush();
  const cuda_model::Counters after = cuda_model::counters();
  EXPECT_EQ(after.device_allocations, before.device_allocations);
  EXPECT_EQ(after.pinned_allocations, before.pinned_allocations);
  EXPECT_EQ(after.module_loads, before.module_loads);  // every kernel was loaded at construction
}

/// Resets the model's device 0 at the end of a test that loses its context on purpose (after
/// the store that used it is gone: declare it first).
struct ResetDeviceAfter {
  ~ResetDeviceAfter() {
    (void)cudaDeviceReset();
    (void)cudaGetLastError();
    cuda_model::clear_faults();
  }
};

TEST_F(CudaPath, AFailedDeviceCopyIsNeverServedItsEntriesAreDroppedAndCounted) {
  ResetDeviceAfter reset;
  ChunkedTokenDatabase db(kChunk, false);
  auto store = std::make_unique<HiddenStateStore>(small_config(), db);
  const auto bad = tokens64(2 * kChunk, 2), good = tokens64(2 * kChunk, 3);
  const auto good_rows = rows_of(good);
  const TensorView rows = device_rows(bad);
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;
  const MutableTensorView out = device_out(2 * kChunk);
  {
    // The store's first device-to-host copy fails when it runs (sticky: the context is lost),
    // after the call has returned (the stream is held until then).
    test::StreamGate gate(s.stream);
    cuda_model::fail_copy(0);
    EXPECT_EQ(store->store_hidden_states(bad, rows, so), (StoreResult{2, 2}));
  }
  EXPECT_NE(cudaDeviceSynchronize(), cudaSuccess);  // the copy ran and failed (no fence waited)
  // A host store refreshes the fences first (DevicePath::poll): the failed one is seen now.
  EXPECT_EQ(store->store_hidden_states(good, test::view_of(good_rows, kCols)), (StoreResult{2, 2}));
  EXPECT_EQ(store->stats().copy_failures, 0u);
  // A device-output retrieve (no host wait) serves none of it, and drops the chunk.
  RetrieveOptions ro;
  ro.stream = s.stream;
  EXPECT_EQ(store->retrieve_hidden_states_into(bad, out, ro), 0);
  EXPECT_EQ(store->stats().copy_failures, 1u);
  // Nothing else serves or reports the failed rows either.
  EXPECT_FALSE(store->retrieve_hidden_states(bad).has_value());
  const auto chunks = db.process_tokens(std::span<const int64_t>(bad));
  EXPECT_FALSE(store->has_chunk(chunks[0].key, {}));
  EXPECT_FALSE(store->has_chunk(chunks[1].key, {}));  // beyond the gap, and failed too
  EXPECT_EQ(store->coverage(chunks, std::vector<int64_t>{0}), 0);
  // What landed is still served.
  const auto got = store->retrieve_hidden_states(good);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(std::memcmp(got->data(), good_rows.data(), got->bytes()), 0);
  store->check_invariants();
  store.reset();
}

TEST_F(CudaPath, AFailedCopyFirstSeenByAHostWaitIsDroppedToo) {
  ResetDeviceAfter reset;
  ChunkedTokenDatabase db(kChunk, false);
  auto store = std::make_unique<HiddenStateStore>(small_config(), db);
  const auto t = tokens64(2 * kChunk, 20);
  const TensorView rows = device_rows(t);
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;
  {
    test::StreamGate gate(s.stream);
    cuda_model::fail_copy(0);
    EXPECT_EQ(store->store_hidden_states(t, rows, so), (StoreResult{2, 2}));
  }
  // No poll in between: the host retrieve's own fence wait finds the failure.
  EXPECT_FALSE(store->retrieve_hidden_states(t).has_value());
  EXPECT_EQ(store->stats().copy_failures, 1u);
  store.reset();
}

TEST_F(CudaPath, AStoresDeviceThatTheProcessDoesNotSeeIsAConfigError) {
  Config c = small_config();
  c.hidden_state_device = cuda_model::device_count();
  ChunkedTokenDatabase db(kChunk, false);
  try {
    HiddenStateStore store(c, db);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_state_device"), std::string::npos) << e.what();
  }
}

TEST_F(CudaPath, DescriptorsInFlightAreBoundedLikeStagingBytes) {
  // One-column padded rows: a tile per row and 4 bytes of staging each, so 70000 rows in flight
  // need more descriptors (kStagingTiles) than the staging holds bytes for: the rounds past them
  // wait for the oldest (manual scheduling: nothing runs unless a wait needs it).
  constexpr int64_t kRows = 70000;
  Config c = test::store_config(kChunk, 1, kRows / kChunk + 1);
  c.hidden_state_block_bytes = 64;  // a granule per one-column chunk
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(c, db);
  const auto t = tokens64(kRows, 21);
  std::vector<float> padded(2 * kRows);
  for (int64_t r = 0; r < kRows; ++r) padded[2 * r] = static_cast<float>(r % 1000);
  const TensorView rows{device_copy(padded.data(), padded.size() * 4),
                        DType::kFloat32,
                        kRows,
                        1,
                        2,
                        Device::kCuda,
                        0};
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;
  {
    ManualScheduling manual;
    EXPECT_EQ(store.store_hidden_states(t, rows, so).cached, kRows / kChunk);
    EXPECT_EQ(store.stats().staging_waits, 1u);
    store.flush();
  }
  const auto got = store.retrieve_hidden_states(t);
  ASSERT_TRUE(got.has_value());
  for (int64_t r = 0; r < kRows; ++r) ASSERT_EQ(got->data()[r], static_cast<float>(r % 1000)) << r;
}

TEST_F(CudaPath, AFailedLaunchInABatchWithdrawsItWithoutFreeingGranulesStillBeingWritten) {
  ResetDeviceAfter reset;  // (the failure is not sticky; this only clears the planted fault)
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(small_config(), db);
  const auto t1 = tokens64(2 * kChunk, 14), t2 = tokens64(2 * kChunk, 15);
  const TensorView s1 = device_rows(t1), s2 = device_rows(t2);
  StreamHolder a, b;
  StoreOptions on_a, on_b;
  on_a.stream = a.stream;
  on_b.stream = b.stream;
  const StoreItem items[] = {{t1, s1, on_a}, {t2, s2, on_b}};
  const uint64_t capacity = store.stats().pool_capacity_bytes;
  {
    test::StreamGate gate(a.stream);  // stream a's launch is queued and writes its granules later
    cuda_model::fail_launch(1);       // stream b's launch fails
    EXPECT_THROW((void)store.store_batch(items), Error);
    EXPECT_EQ(store.num_entries(), 0u);
    store.check_invariants();
    // The granules under stream a's queued launch are not back in the pool yet...
    EXPECT_LT(store.stats().pool_free_bytes, capacity);
  }
  store.flush();
  // ...and return once it ran: nothing leaked, nothing reused while being written.
  EXPECT_EQ(store.stats().pool_free_bytes, capacity);
  EXPECT_EQ(store.store_batch(items), (std::vector<StoreResult>{{2, 2}, {2, 2}}));
  EXPECT_TRUE(store.retrieve_hidden_states(t2).has_value());
}

TEST_F(CudaPath, AFailedLaunchInALaterRoundWithdrawsTheStoreAndTheNextOneWorks) {
  ResetDeviceAfter reset;
  Config c = small_config(256);
  c.tuning.staging_bytes = 8 << 10;  // two chunks per round: a four-chunk store is 2 rounds
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(c, db);
  const auto t = tokens64(4 * kChunk, 16);
  const TensorView rows = device_rows(t, DType::kBFloat16);
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;
  cuda_model::fail_launch(1);
  EXPECT_THROW((void)store.store_hidden_states(t, rows, so), Error);
  EXPECT_EQ(store.num_entries(), 0u);
  EXPECT_EQ(store.stats().pool_free_bytes, store.stats().pool_capacity_bytes);
  EXPECT_EQ(store.store_hidden_states(t, rows, so), (StoreResult{4, 4}));
  EXPECT_GE(store.stats().device_launches, 2u);
  const auto got = store.retrieve_hidden_states(t);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->rows(), 4 * kChunk);
}

TEST_F(CudaPath, APoolThatCouldNotBePinnedStillServesEveryDeviceCall) {
  ResetDeviceAfter reset;
  cuda_model::fail_allocation(0);  // the pool's cudaHostAlloc: pageable memory instead
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(small_config(), db);
  ASSERT_FALSE(store.stats().pinned);
  ASSERT_TRUE(store.stats().device_path);
  const auto t = tokens64(2 * kChunk + 5, 17);
  const auto want = rows_of(t);
  const TensorView rows = device_rows(t);
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;
  RetrieveOptions ro;
  ro.stream = s.stream;
  EXPECT_EQ(store.store_hidden_states(t, rows, so), (StoreResult{2, 2}));  // staged, then copied
  const StoreItem items[] = {{t, rows, {1, 0, ActivationKind::kHidden, s.stream}}};
  EXPECT_EQ(store.store_batch(items)[0], (StoreResult{2, 2}));  // store() per item, one fence
  const MutableTensorView out = device_out(2 * kChunk), out2 = device_out(2 * kChunk);
  EXPECT_EQ(store.retrieve_hidden_states_into(t, out, ro), 2 * kChunk);  // host convert + upload
  const RetrieveItem reads[] = {{t, out2, {1, 0, ActivationKind::kHidden, s.stream}}};
  EXPECT_EQ(store.retrieve_batch_into(reads)[0], 2 * kChunk);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  for (const auto& o : {out, out2}) {
    const auto got = test::download(o.data, 2 * kChunk * kCols * 4);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0);
  }
}

TEST_F(CudaPath, ADeviceWhoseStateCannotBeMadeIsAnErrorAndTheNextCallTriesAgain) {
  ASSERT_EQ(cuda_model::device_count(), 2);
  ResetDeviceAfter reset;
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(small_config(), db);  // device 0's state
  const auto t = tokens64(2 * kChunk, 18);
  const auto host_rows = rows_of(t);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  DeviceBytes on1(host_rows.size() * 4);
  test::upload(on1, host_rows.data(), host_rows.size() * 4);
  StreamHolder s1;  // a stream of device 1
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const TensorView rows{on1.ptr, DType::kFloat32, 2 * kChunk, kCols, 0, Device::kCuda, 1};
  StoreOptions so;
  so.stream = s1.stream;
  cuda_model::fail_allocation(0);  // device 1's staging
  EXPECT_THROW((void)store.store_hidden_states(t, rows, so), Error);
  EXPECT_EQ(store.num_entries(), 0u);
  // From this thread (current device 0), on device 1: the store switches and switches back.
  EXPECT_EQ(store.store_hidden_states(t, rows, so), (StoreResult{2, 2}));
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0);
  const auto got = store.retrieve_hidden_states(t);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(std::memcmp(got->data(), host_rows.data(), got->bytes()), 0);
}

TEST_F(CudaPath, HssRestoreImplNamesTheRestoreImplementation) {
  Config c = small_config();
  c.tuning.restore_impl = RestoreImpl::kCub;
  const auto impl_for = [&](const char* value) {
    if (value == nullptr) {
      EXPECT_EQ(unsetenv("HSS_RESTORE_IMPL"), 0);
    } else {
      EXPECT_EQ(setenv("HSS_RESTORE_IMPL", value, 1), 0);
    }
    const RestoreImpl impl = c.with_env_overrides().tuning.restore_impl;
    EXPECT_EQ(unsetenv("HSS_RESTORE_IMPL"), 0);
    return impl;
  };
  EXPECT_EQ(impl_for(nullptr), RestoreImpl::kCub);
  EXPECT_EQ(impl_for("kernel"), RestoreImpl::kKernel);
  EXPECT_EQ(impl_for("memcpy"), RestoreImpl::kCopyEngine);
  EXPECT_EQ(impl_for("copy_engine"), RestoreImpl::kCopyEngine);
  EXPECT_EQ(impl_for("warp_drive"), RestoreImpl::kCub);  // unknown: warned, the config's
}

TEST_F(CudaPath, LongRunsOfTinyTilesSpanSeveralRoundsAndLaunches) {
  // One-column rows, padded: every row is a tile of its own, so a store needs more tiles than a
  // round holds and a restore more than a launch table holds.
  constexpr int64_t kRows = 20000;
  Config c = test::store_config(kChunk, 1, kRows / kChunk + 1);
  for (const RestoreImpl impl : {RestoreImpl::kKernel, RestoreImpl::kCopyEngine}) {
    c.tuning.restore_impl = impl;
    ChunkedTokenDatabase db(kChunk, false);
    HiddenStateStore store(c, db);
    const auto t = tokens64(kRows, 19);
    std::vector<float> padded(2 * kRows);
    for (int64_t r = 0; r < kRows; ++r) padded[2 * r] = static_cast<float>(r);
    const TensorView rows{device_copy(padded.data(), padded.size() * 4),
                          DType::kFloat32,
                          kRows,
                          1,
                          2,
                          Device::kCuda,
                          0};
    StreamHolder s;
    StoreOptions so;
    so.stream = s.stream;
    const uint64_t launches = store.stats().device_launches;
    EXPECT_EQ(store.store_hidden_states(t, rows, so).cached, kRows / kChunk);
    EXPECT_GE(store.stats().device_launches - launches, 2u);  // at least two rounds
    buffers_.push_back(std::make_unique<DeviceBytes>(static_cast<size_t>(kRows) * 3 * 4));
    test::fill(buffers_.back()->ptr, 0, buffers_.back()->bytes);
    const MutableTensorView out{
        buffers_.back()->ptr, DType::kFloat32, kRows, 1, 3, Device::kCuda, 0};
    RetrieveOptions ro;
    ro.stream = s.stream;
    ro.row_begin = 3;
    EXPECT_EQ(store.retrieve_hidden_states_into(t, out, ro), kRows - 3);
    ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
    const auto got = test::download(out.data, buffers_.back()->bytes);
    for (int64_t r = 0; r < kRows - 3; ++r) {
      float f = 0;
      std::memcpy(&f, got.data() + 12 * r, 4);
      ASSERT_EQ(f, static_cast<float>(r + 3)) << r;
    }
  }
}

}  // namespace
}  // namespace hss
