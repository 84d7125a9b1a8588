// The ordering and lifetime rules of the device path (issue 9), through the public API, on a GPU
// (label gpu) and on the CUDA runtime model (label gpu-model). A held stream (StreamGate) stands
// in for a long kernel: a call that returns while its stream is held did not wait for it on the
// host. Covered: device-input stores and device-output retrieves on a held stream return at once
// and land in stream order; independent streams; a retrieve on another stream waits on the device
// for the store's stream; pool pressure right after unfinished and finished device restores;
// dropping an entry while its copy is in flight; output dtypes; retrieve_layers_into; the staging
// budget as a counted host wait; teardown with work in flight. (These rules were proved on a
// simulated device path before; they now run the real one.)

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gpu_test_util.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/token_database.hpp"

#if !HSS_WITH_CUDA

TEST(DeviceOrdering, RequiresACudaBuild) {
  GTEST_SKIP() << "built without CUDA (HSS_ENABLE_CUDA=OFF): " << hss::runtime_info().reason;
}

#else

namespace hss {
namespace {

using test::DeviceBytes;
using test::StreamGate;
using test::StreamHolder;
using test::tokens64;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;

std::vector<float> rows_of(const std::vector<int64_t>& tokens, int64_t layer = 0) {
  const std::vector<int32_t> t32(tokens.begin(), tokens.end());
  return test::make_rows(t32, 0, layer, kCols);
}

/// ChunkedTokenDatabase that counts key passes.
class CountingDb final : public TokenDatabase {
 public:
  std::vector<Chunk> process_tokens(std::span<const int32_t> t) const override {
    ++passes;
    return inner.process_tokens(t);
  }
  std::vector<Chunk> process_tokens(std::span<const int64_t> t) const override {
    ++passes;
    return inner.process_tokens(t);
  }
  std::vector<Chunk> process_hashes(std::span<const uint64_t> h,
                                    std::span<const int64_t> o) const override {
    return inner.process_hashes(h, o);
  }
  int64_t chunk_size() const override { return inner.chunk_size(); }
  ChunkedTokenDatabase inner{kChunk, false};
  mutable std::atomic<int> passes{0};
};

class DeviceOrdering : public ::testing::Test {
 protected:
  void SetUp() override { HSS_REQUIRE_DEVICE(); }

  void make_store(int64_t pool_chunks = 64, Config config = {}) {
    const Config sized = test::store_config(kChunk, kCols, pool_chunks);
    config.chunk_size = sized.chunk_size;
    config.enable_hidden_state_cache = true;
    config.max_hidden_state_cpu_size = sized.max_hidden_state_cpu_size;
    store_ = std::make_unique<HiddenStateStore>(config, db_);
    ASSERT_TRUE(store_->stats().device_path);
  }

  /// Device memory (kept until the fixture ends) holding `bytes` of `host`.
  void* device_copy(const void* host, size_t bytes) {
    buffers_.push_back(std::make_unique<DeviceBytes>(bytes));
    test::upload(*buffers_.back(), host, bytes);
    return buffers_.back()->ptr;
  }
  TensorView device_rows(const std::vector<int64_t>& tokens, int64_t layer = 0) {
    const auto rows = rows_of(tokens, layer);
    return {device_copy(rows.data(), rows.size() * 4),
            DType::kFloat32,
            static_cast<int64_t>(tokens.size()),
            kCols,
            0,
            Device::kCuda,
            0};
  }
  TensorView device_rows_bf16(const std::vector<int64_t>& tokens) {
    const auto bits = test::to_bf16(rows_of(tokens));
    return {device_copy(bits.data(), bits.size() * 2),
            DType::kBFloat16,
            static_cast<int64_t>(tokens.size()),
            kCols,
            0,
            Device::kCuda,
            0};
  }
  /// A device output of `rows` x kCols of `dtype`, filled with 0x77 bytes.
  MutableTensorView device_out(int64_t rows, DType dtype = DType::kFloat32) {
    const size_t bytes = static_cast<size_t>(rows * kCols) * element_size(dtype);
    buffers_.push_back(std::make_unique<DeviceBytes>(bytes));
    test::fill(buffers_.back()->ptr, 0x77, bytes);
    return {buffers_.back()->ptr, dtype, rows, kCols, 0, Device::kCuda, 0};
  }
  StoreResult store(const std::vector<int64_t>& tokens, Stream s = nullptr, int64_t layer = 0) {
    StoreOptions o;
    o.stream = s;
    o.layer_idx = layer;
    return store_->store_hidden_states(tokens, device_rows(tokens, layer), o);
  }
  int64_t retrieve_device(const std::vector<int64_t>& tokens, const MutableTensorView& out,
                          Stream s, int64_t layer = 0) {
    RetrieveOptions o;
    o.stream = s;
    o.layer_idx = layer;
    return store_->retrieve_hidden_states_into(tokens, out, o);
  }
  /// The output's bytes equal `want` (read after the caller synchronised the output's stream).
  static bool holds(const MutableTensorView& out, const std::vector<float>& want) {
    const auto got = test::download(out.data, want.size() * sizeof(float));
    return std::memcmp(got.data(), want.data(), got.size()) == 0;
  }
  void expect_retrieves(const std::vector<int64_t>& tokens, int64_t layer = 0) {
    RetrieveOptions o;
    o.layer_idx = layer;
    const auto got = store_->retrieve_hidden_states(tokens, o);
    ASSERT_TRUE(got.has_value());
    const auto want = rows_of(tokens, layer);
    ASSERT_EQ(got->rows(), static_cast<int64_t>(tokens.size()));
    ASSERT_EQ(std::memcmp(got->data(), want.data(), got->bytes()), 0);
  }
#if HSS_CUDA_MODEL
  static uint64_t host_waits() { return cuda_model::counters().host_waits; }
#endif

  CountingDb db_;
  std::vector<std::unique_ptr<DeviceBytes> > buffers_;  // outlive the store (declared first)
  std::unique_ptr<HiddenStateStore> store_;
};

TEST_F(DeviceOrdering, AStoreOnAHeldStreamReturnsAtOnceAndReadsItsSourceBeforeTheNextWork) {
  make_store();
  StreamHolder s;
  const auto tokens = tokens64(4 * kChunk, 1);
  const TensorView rows = device_rows(tokens);
  StreamGate gate(s.stream);
#if HSS_CUDA_MODEL
  const uint64_t waits = host_waits();
#endif
  (void)store_->store_hidden_states(tokens, rows, {0, 0, ActivationKind::kHidden, s.stream});
#if HSS_CUDA_MODEL
  EXPECT_GT(cuda_model::queued(s.stream), 1u);  // the gate and the store's work: nothing ran
  EXPECT_EQ(host_waits(), waits);
#endif
  // The engine's next step overwrites its tensor on the same stream: the store read it first.
  ASSERT_EQ(cudaMemsetAsync(const_cast<void*>(rows.data), 0, 4 * kChunk * kCols * 4, s.stream),
            cudaSuccess);
  gate.open();
  expect_retrieves(tokens);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
}

TEST_F(DeviceOrdering, WithOneStreamHeldAnotherStoresAndRetrievesWithoutWaitingForIt) {
  make_store();
  StreamHolder a, b;
  const auto ta = tokens64(2 * kChunk, 2), tb = tokens64(2 * kChunk, 3);
  const TensorView ra = device_rows(ta), rb = device_rows(tb);
  StreamGate gate(a.stream);
  (void)store_->store_hidden_states(ta, ra, {0, 0, ActivationKind::kHidden, a.stream});
  (void)store_->store_hidden_states(tb, rb, {0, 0, ActivationKind::kHidden, b.stream});
  expect_retrieves(tb);  // b's copies landed although a's are queued
  gate.open();
  expect_retrieves(ta);
}

TEST_F(DeviceOrdering, CastStagingBeyondTheBudgetIsACountedHostWait) {
  Config c;
  c.tuning.staging_bytes = kChunk * kCols * 4 * 2;  // one two-chunk cast store fits, not two
  make_store(64, c);
  StreamHolder s;
  const auto t1 = tokens64(2 * kChunk, 4), t2 = tokens64(2 * kChunk, 5);
  const TensorView r1 = device_rows_bf16(t1), r2 = device_rows_bf16(t2);
  StoreOptions on_s;
  on_s.stream = s.stream;
  StreamGate gate(s.stream);
  (void)store_->store_hidden_states(t1, r1, on_s);
  EXPECT_EQ(store_->stats().staging_waits, 0u);
  std::atomic<bool> second_done{false};
  std::thread second([&] {
    (void)store_->store_hidden_states(t2, r2, on_s);
    second_done = true;
  });
  test::wait_until_a_thread_blocks();
  EXPECT_FALSE(second_done.load());  // it waits for the first store's staging
  gate.open();
  second.join();
  EXPECT_EQ(store_->stats().staging_waits, 1u);
  expect_retrieves(t1);
  expect_retrieves(t2);
}

TEST_F(DeviceOrdering, ADeviceOutputRetrieveWritesTheRows) {
  make_store();
  StreamHolder s;
  const auto tokens = tokens64(3 * kChunk, 6);
  (void)store(tokens, s.stream);
  const auto out = device_out(3 * kChunk);
  EXPECT_EQ(retrieve_device(tokens, out, s.stream), 3 * kChunk);
  store_->flush();
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_TRUE(holds(out, rows_of(tokens)));
}

TEST_F(DeviceOrdering, AStoreOnAHeldStreamAndADeviceRetrieveAfterItReturnAtOnceAndLandInOrder) {
  make_store();
  StreamHolder s;
  const auto t = tokens64(3 * kChunk, 7);
  const auto out = device_out(3 * kChunk);
  {
    StreamGate gate(s.stream);
    EXPECT_EQ(store(t, s.stream), (StoreResult{3, 3}));
    EXPECT_EQ(retrieve_device(t, out, s.stream), 3 * kChunk);  // published; the copy is queued
    EXPECT_FALSE(holds(out, rows_of(t)));
  }
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_TRUE(holds(out, rows_of(t)));
}

TEST_F(DeviceOrdering, ADeviceRetrieveOnAnotherStreamWaitsOnTheDeviceForTheStoresStream) {
  make_store();
  StreamHolder a, b;
  const auto x = tokens64(2 * kChunk, 8), y = tokens64(2 * kChunk, 9);
  const auto out_y = device_out(2 * kChunk), out_x = device_out(2 * kChunk);
  StreamGate gate(a.stream);
  (void)store(x, a.stream);
  (void)store(y, b.stream);
  EXPECT_EQ(retrieve_device(y, out_y, b.stream), 2 * kChunk);
  ASSERT_EQ(cudaStreamSynchronize(b.stream), cudaSuccess);
  EXPECT_TRUE(holds(out_y, rows_of(y)));  // b proceeds although a is held
  EXPECT_EQ(retrieve_device(x, out_x, b.stream), 2 * kChunk);
#if HSS_CUDA_MODEL
  EXPECT_GT(cuda_model::queued(b.stream), 0u);  // b waits for a's copy, on the device
#endif
  EXPECT_FALSE(holds(out_x, rows_of(x)));
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(b.stream), cudaSuccess);
  EXPECT_TRUE(holds(out_x, rows_of(x)));
}

TEST_F(DeviceOrdering, PoolPressureAfterAnUnfinishedDeviceRestoreEvictsOnlyFreeableKeys) {
  make_store(/*pool_chunks=*/4);
  StreamHolder s;
  const auto a = tokens64(2 * kChunk, 1), b = tokens64(2 * kChunk, 2), c = tokens64(2 * kChunk, 3);
  (void)store(a);
  (void)store(b);
  store_->flush();
  const auto out = device_out(2 * kChunk);
  {
    StreamGate gate(s.stream);
    EXPECT_EQ(retrieve_device(a, out, s.stream), 2 * kChunk);  // queued: a is pinned by it
    EXPECT_EQ(store(c), (StoreResult{2, 2}));                  // b (freeable) makes room, not a
    EXPECT_EQ(store_->stats().allocation_failures, 0u);
    EXPECT_TRUE(store_->retrieve_hidden_states(a).has_value());
    EXPECT_FALSE(store_->retrieve_hidden_states(b).has_value());
  }
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_TRUE(holds(out, rows_of(a)));
  store_->check_invariants();
}

TEST_F(DeviceOrdering, PoolPressureAfterFinishedDeviceRestoresReusesTheirGranules) {
  make_store(/*pool_chunks=*/4);
  StreamHolder s;
  const auto a = tokens64(2 * kChunk, 4), b = tokens64(2 * kChunk, 5), c = tokens64(4 * kChunk, 6);
  (void)store(a);
  (void)store(b);
  const auto out_a = device_out(2 * kChunk), out_b = device_out(2 * kChunk);
  EXPECT_EQ(retrieve_device(a, out_a, s.stream), 2 * kChunk);
  EXPECT_EQ(retrieve_device(b, out_b, s.stream), 2 * kChunk);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  // The store releases finished restores before deciding: both keys become evictable.
  EXPECT_EQ(store(c), (StoreResult{4, 4}));
  EXPECT_EQ(store_->stats().allocation_failures, 0u);
  EXPECT_TRUE(holds(out_a, rows_of(a)));
  EXPECT_TRUE(holds(out_b, rows_of(b)));
  store_->check_invariants();
}

TEST_F(DeviceOrdering, DroppingAnEntryWithItsCopyInFlightDefersItsGranulesInsteadOfWaiting) {
  make_store(/*pool_chunks=*/4);
  StreamHolder s;
  const auto t = tokens64(2 * kChunk, 10);
  const uint64_t free_before = store_->stats().pool_free_bytes;
  {
    StreamGate gate(s.stream);
    (void)store(t, s.stream);
    const auto chunks = db_.inner.process_tokens(std::span<const int64_t>(t));
    EXPECT_TRUE(store_->drop_key(chunks[0].key));  // returns: no wait for the held copy
    EXPECT_TRUE(store_->drop_key(chunks[1].key));
    EXPECT_LT(store_->stats().pool_free_bytes, free_before);  // the granules wait for the copy
  }
  store_->flush();
  EXPECT_EQ(store_->stats().pool_free_bytes, free_before);
  store_->check_invariants();
}

TEST_F(DeviceOrdering, RetrieveWritesEveryOutputDTypeToHostAndDevice) {
  make_store();
  StreamHolder s;
  const auto t = tokens64(2 * kChunk, 11);
  std::vector<float> rows(static_cast<size_t>(2 * kChunk * kCols));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 1.0f + static_cast<float>(i) / 7.0f;
  (void)store_->store_hidden_states(t, {rows.data(), DType::kFloat32, 2 * kChunk, kCols});
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<uint16_t> host(rows.size());
    EXPECT_EQ(store_->retrieve_hidden_states_into(
                  t, MutableTensorView{host.data(), dtype, 2 * kChunk, kCols}),
              2 * kChunk);
    const auto dev = device_out(2 * kChunk, dtype);
    EXPECT_EQ(retrieve_device(t, dev, s.stream), 2 * kChunk);
    ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
    const auto dev_bytes = test::download(dev.data, rows.size() * 2);
    for (size_t i = 0; i < rows.size(); ++i) {
      const uint16_t want = dtype == DType::kBFloat16 ? kernels::float_to_bf16(rows[i])
                                                      : kernels::float_to_f16(rows[i]);
      uint16_t got = 0;
      std::memcpy(&got, dev_bytes.data() + 2 * i, 2);
      ASSERT_EQ(host[i], want) << i;
      ASSERT_EQ(got, want) << i;
    }
  }
}

TEST_F(DeviceOrdering, RetrieveLayersIntoDeviceBuffersOnTheCallersStream) {
  make_store();
  StreamHolder s;
  const auto t = tokens64(2 * kChunk, 14);
  (void)store(t, s.stream, 0);
  (void)store(t, s.stream, 3);
  const Slot slots[] = {{ActivationKind::kHidden, 0}, {ActivationKind::kHidden, 3}};
  const MutableTensorView outs[] = {device_out(2 * kChunk), device_out(2 * kChunk)};
  RetrieveLayersOptions o;
  o.stream = s.stream;
  o.row_begin = kChunk;
  {
    StreamGate gate(s.stream);
    EXPECT_EQ(store_->retrieve_layers_into(t, slots, outs, o), kChunk);
  }
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  const auto want0 = rows_of(t, 0), want3 = rows_of(t, 3);
  const auto got0 = test::download(outs[0].data, kChunk * kCols * 4);
  const auto got3 = test::download(outs[1].data, kChunk * kCols * 4);
  EXPECT_EQ(std::memcmp(got0.data(), want0.data() + kChunk * kCols, got0.size()), 0);
  EXPECT_EQ(std::memcmp(got3.data(), want3.data() + kChunk * kCols, got3.size()), 0);
}

TEST_F(DeviceOrdering, NativeBf16RestoredIntoBf16IsBitIdentical) {
  Config c;
  c.hidden_state_storage_dtype = StorageDType::kNative;
  make_store(64, c);
  StreamHolder s;
  const auto t = tokens64(kChunk, 12);
  std::vector<uint16_t> bits(static_cast<size_t>(kChunk * kCols));
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(0x3F00 + i * 37);
  const TensorView dev{device_copy(bits.data(), bits.size() * 2),
                       DType::kBFloat16,
                       kChunk,
                       kCols,
                       0,
                       Device::kCuda,
                       0};
  (void)store_->store_hidden_states(t, dev, {0, 0, ActivationKind::kHidden, s.stream});
  const auto out = device_out(kChunk, DType::kBFloat16);
  EXPECT_EQ(retrieve_device(t, out, s.stream), kChunk);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  const auto got = test::download(out.data, bits.size() * 2);
  EXPECT_EQ(std::memcmp(got.data(), bits.data(), got.size()), 0);
}

TEST_F(DeviceOrdering, TeardownWithCopiesAndRestoresInFlightWaitsForThemAndLeavesTheStreamOrdered) {
  make_store(/*pool_chunks=*/8);
  StreamHolder s;
  const auto t = tokens64(2 * kChunk, 25);
  const auto out = device_out(2 * kChunk);
  auto gate = std::make_unique<StreamGate>(s.stream);
  (void)store(t, s.stream);
  EXPECT_EQ(retrieve_device(t, out, s.stream), 2 * kChunk);
  const auto chunks = db_.inner.process_tokens(std::span<const int64_t>(t));
  EXPECT_TRUE(store_->drop_key(chunks[1].key));  // a deferred granule return too
  // The store goes while its stream is still held: teardown waits for the queued work and the
  // engine's stream moves on meanwhile. Under ASan: the pool outlives every copy and pin.
  std::thread engine([&] {
    test::wait_until_a_thread_blocks();  // teardown is waiting for the held stream
    gate->open();
  });
  store_.reset();
  engine.join();
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_TRUE(holds(out, rows_of(t)));
}

// ---- batches

TEST_F(DeviceOrdering, BatchResultsEqualSingleCallsWithOneKeyPassPerTokenList) {
  make_store(256);
  const auto a = tokens64(3 * kChunk, 20), b = tokens64(2 * kChunk, 21);
  std::vector<std::vector<float> > rows;
  std::vector<StoreItem> items;
  rows.reserve(6);
  for (int64_t layer = 0; layer < 3; ++layer) {
    for (const auto* t : {&a, &b}) {
      rows.push_back(rows_of(*t, layer));
      StoreOptions o;
      o.layer_idx = layer;
      items.push_back(
          {*t, {rows.back().data(), DType::kFloat32, static_cast<int64_t>(t->size()), kCols}, o});
    }
  }
  items.push_back(items[0]);  // already cached: {0, 3}
  const int passes_before = db_.passes.load();
  const auto results = store_->store_batch(items);
  EXPECT_EQ(db_.passes.load() - passes_before, 2);  // two distinct token lists
  ASSERT_EQ(results.size(), items.size());
  EXPECT_EQ(results[0], (StoreResult{3, 3}));
  EXPECT_EQ(results[1], (StoreResult{2, 2}));
  EXPECT_EQ(results.back(), (StoreResult{0, 3}));
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore single(test::store_config(kChunk, kCols, 256), db);
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(
        single.store_hidden_states(items[i].token_ids, items[i].hidden_states, items[i].options),
        results[i])
        << i;
  }
}

TEST_F(DeviceOrdering, ABatchWithABadItemNamesItsIndexAndDoesNothing) {
  make_store();
  const auto a = tokens64(2 * kChunk, 22);
  const auto rows = rows_of(a);
  const TensorView dev = device_rows(a);
  std::vector<StoreItem> items(3, StoreItem{a, dev, {}});
  items[1].options.layer_idx = 1;
  items[2].hidden_states.rows = 5;  // wrong row count
  try {
    (void)store_->store_batch(items);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("items[2]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store_->num_entries(), 0u);
  EXPECT_EQ(store_->stats().stores, 0u);
  items[2].hidden_states.rows = 2 * kChunk;
  EXPECT_EQ(store_->store_batch(items).size(), 3u);
  const auto out = device_out(2 * kChunk);
  std::vector<RetrieveItem> reads(2, RetrieveItem{a, out, {}});
  reads[1].out.rows = 3;  // too small for the cached prefix
  const auto retrieves_before = store_->stats().retrieves;
  try {
    (void)store_->retrieve_batch_into(reads);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("items[1]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store_->stats().retrieves, retrieves_before);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto untouched = test::download(out.data, rows.size() * 4);  // item 0 not written either
  EXPECT_EQ(untouched, std::vector<unsigned char>(rows.size() * 4, 0x77));
}

TEST_F(DeviceOrdering, ADeviceBatchOnAHeldStreamReturnsAtOnce) {
  make_store();
  StreamHolder s;
  const auto a = tokens64(2 * kChunk, 23), b = tokens64(kChunk, 24);
  const TensorView ra = device_rows(a), rb = device_rows(b);
  StoreOptions so;
  so.stream = s.stream;
  RetrieveOptions ro;
  ro.stream = s.stream;
  const RetrieveItem reads[] = {{a, device_out(2 * kChunk), ro}, {b, device_out(kChunk), ro}};
  {
    StreamGate gate(s.stream);
    const StoreItem items[] = {{a, ra, so}, {b, rb, so}};
    const auto results = store_->store_batch(items);
    EXPECT_EQ(results[0], (StoreResult{2, 2}));
    EXPECT_EQ(results[1], (StoreResult{1, 1}));
    EXPECT_EQ(store_->retrieve_batch_into(reads), (std::vector<int64_t>{2 * kChunk, kChunk}));
  }
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_TRUE(holds(reads[0].out, rows_of(a)));
  EXPECT_TRUE(holds(reads[1].out, rows_of(b)));
}

}  // namespace
}  // namespace hss

#endif  // HSS_WITH_CUDA
