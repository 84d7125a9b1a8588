// The CUDA path against the CUDA runtime model, where a test needs what only the model shows
// (label model): which stream carried which operation, how many launch slots and how much
// staging a call took, what it allocated or loaded, and manual scheduling, which makes "no host
// wait" exact (nothing runs unless a host wait needs it). tests/gpu holds the rules a GPU can
// check too.

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda_model.hpp"
#include "gpu/gpu_test_util.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/token_database.hpp"

namespace hss {
namespace {

using test::DeviceBytes;
using test::StreamHolder;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 64;

/// Manual scheduling for the test's scope: nothing runs unless a host wait needs it.
struct ManualScheduling {
  ManualScheduling() { cuda_model::set_manual(true); }
  ~ManualScheduling() { cuda_model::set_manual(false); }
};

std::vector<int64_t> tokens64(int64_t n, uint64_t seed) {
  const auto t = test::make_tokens(n, seed);
  return {t.begin(), t.end()};
}

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
  c.hidden_state_launch_slots = 1;
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
  c.hidden_state_staging_bytes = 40 << 10;
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
            static_cast<size_t>(c.hidden_state_staging_bytes));
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

}  // namespace
}  // namespace hss
