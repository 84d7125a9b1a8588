// Every ordering and lifetime rule of issue 9, on the simulated asynchronous device path:
// stores after unfinished and finished device restores under pool pressure, device-output
// retrieves that never wait on the host, two independent streams, deferred granule returns,
// output dtypes, retrieve_layers_into, batch calls, and teardown with work in flight.

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "data_path.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/token_database.hpp"
#include "sim_data_path.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using detail::SimDataPath;
using test::make_rows;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;

std::vector<int64_t> tokens64(int64_t n, uint64_t seed) {
  const auto t = test::make_tokens(n, seed);
  return {t.begin(), t.end()};
}

std::vector<float> rows_of(const std::vector<int64_t>& tokens, int64_t layer = 0) {
  const std::vector<int32_t> t32(tokens.begin(), tokens.end());
  return make_rows(t32, 0, layer, kCols);
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

class SimRules : public ::testing::Test {
 protected:
  void make_store(int64_t pool_chunks = 64, SimDataPath::Options options = {}, Config config = {}) {
    const Config sized = test::store_config(kChunk, kCols, pool_chunks);
    config.chunk_size = sized.chunk_size;
    config.enable_hidden_state_cache = true;
    config.max_hidden_state_cpu_size = sized.max_hidden_state_cpu_size;
    detail::ScopedDevicePathFactory hook([&](const Config&) {
      auto path = std::make_unique<SimDataPath>(options);
      sim_ = path.get();
      return path;
    });
    store_ = std::make_unique<HiddenStateStore>(config, db_);
  }

  TensorView device_copy(const std::vector<float>& rows) {
    void* data = sim_->allocate(rows.size() * sizeof(float));
    std::memcpy(data, rows.data(), rows.size() * sizeof(float));
    return {
        data, DType::kFloat32, static_cast<int64_t>(rows.size()) / kCols, kCols, 0, Device::kCuda,
        0};
  }
  MutableTensorView device_out(int64_t rows, DType dtype = DType::kFloat32) {
    void* data = sim_->allocate(static_cast<size_t>(rows * kCols) * element_size(dtype));
    return {data, dtype, rows, kCols, 0, Device::kCuda, 0};
  }
  StoreResult store(const std::vector<int64_t>& tokens, Stream s = nullptr, int64_t layer = 0) {
    StoreOptions o;
    o.stream = s;
    o.layer_idx = layer;
    return store_->store_hidden_states(tokens, device_copy(rows_of(tokens, layer)), o);
  }
  int64_t retrieve_device(const std::vector<int64_t>& tokens, const MutableTensorView& out,
                          Stream s) {
    RetrieveOptions o;
    o.stream = s;
    return store_->retrieve_hidden_states_into(tokens, out, o);
  }
  static bool holds(const MutableTensorView& out, const std::vector<float>& want) {
    return std::memcmp(out.data, want.data(), want.size() * sizeof(float)) == 0;
  }

  CountingDb db_;
  SimDataPath* sim_ = nullptr;
  std::unique_ptr<HiddenStateStore> store_;
};

TEST_F(SimRules, StoreUnderPressureAfterAnUnfinishedDeviceRestoreEvictsOnlyFreeableKeys) {
  make_store(/*pool_chunks=*/4);
  const Stream s = sim_->create_stream();
  const auto a = tokens64(2 * kChunk, 1), b = tokens64(2 * kChunk, 2), c = tokens64(2 * kChunk, 3);
  store(a);
  store(b);
  sim_->hold(s);
  const auto out = device_out(2 * kChunk);
  EXPECT_EQ(retrieve_device(a, out, s), 2 * kChunk);  // queued: A is pinned by the restore
  EXPECT_EQ(store(c), (StoreResult{2, 2}));           // B (freeable) makes room, not A
  EXPECT_EQ(store_->stats().allocation_failures, 0u);
  EXPECT_TRUE(store_->retrieve_hidden_states(a).has_value());
  EXPECT_FALSE(store_->retrieve_hidden_states(b).has_value());
  sim_->release(s);
  EXPECT_TRUE(holds(out, rows_of(a)));
  store_->check_invariants();
}

TEST_F(SimRules, StoreUnderPressureAfterFinishedDeviceRestoresReusesTheirGranules) {
  make_store(/*pool_chunks=*/4);
  const Stream s = sim_->create_stream();
  const auto a = tokens64(2 * kChunk, 4), b = tokens64(2 * kChunk, 5), c = tokens64(4 * kChunk, 6);
  store(a);
  store(b);
  const auto out_a = device_out(2 * kChunk), out_b = device_out(2 * kChunk);
  EXPECT_EQ(retrieve_device(a, out_a, s), 2 * kChunk);
  EXPECT_EQ(retrieve_device(b, out_b, s), 2 * kChunk);
  EXPECT_GT(sim_->restores_in_flight(), 0u);  // finished, not yet released
  // The store releases finished restores before deciding: both keys become evictable.
  EXPECT_EQ(store(c), (StoreResult{4, 4}));
  EXPECT_EQ(store_->stats().allocation_failures, 0u);
  EXPECT_TRUE(holds(out_a, rows_of(a)));
  EXPECT_TRUE(holds(out_b, rows_of(b)));
  store_->check_invariants();
}

TEST_F(SimRules, BlockedStreamStoreAndDeviceRetrieveReturnAtOnceAndLandInOrder) {
  make_store();
  const Stream s = sim_->create_stream();
  const auto t = tokens64(3 * kChunk, 7);
  const auto out = device_out(3 * kChunk);
  sim_->hold(s);
  EXPECT_EQ(store(t, s), (StoreResult{3, 3}));
  EXPECT_EQ(retrieve_device(t, out, s), 3 * kChunk);  // published; the copy is still queued
  EXPECT_FALSE(holds(out, rows_of(t)));
  EXPECT_EQ(sim_->host_waits(), 0u);
  sim_->release(s);
  EXPECT_TRUE(holds(out, rows_of(t)));
  EXPECT_EQ(sim_->host_waits(), 0u);
}

TEST_F(SimRules, DeviceRetrieveOnAnotherStreamWaitsOnTheDeviceForTheStoreStream) {
  make_store();
  const Stream a = sim_->create_stream();
  const Stream b = sim_->create_stream();
  const auto x = tokens64(2 * kChunk, 8), y = tokens64(2 * kChunk, 9);
  sim_->hold(a);
  store(x, a);
  store(y, b);
  const auto out_y = device_out(2 * kChunk), out_x = device_out(2 * kChunk);
  EXPECT_EQ(retrieve_device(y, out_y, b), 2 * kChunk);
  EXPECT_TRUE(holds(out_y, rows_of(y)));  // B proceeds although A is blocked
  EXPECT_EQ(retrieve_device(x, out_x, b), 2 * kChunk);
  EXPECT_FALSE(holds(out_x, rows_of(x)));  // B waits for A's copy on the device
  EXPECT_EQ(sim_->host_waits(), 0u);
  sim_->release(a);
  EXPECT_TRUE(holds(out_x, rows_of(x)));
}

TEST_F(SimRules, DroppingAnEntryWithItsCopyInFlightDefersTheGranulesInsteadOfWaiting) {
  make_store(/*pool_chunks=*/4);
  const Stream s = sim_->create_stream();
  const auto t = tokens64(2 * kChunk, 10);
  const uint64_t free_before = store_->stats().pool_free_bytes;
  sim_->hold(s);
  store(t, s);
  const auto chunks = db_.inner.process_tokens(std::span<const int64_t>(t));
  EXPECT_TRUE(store_->drop_key(chunks[0].key));
  EXPECT_TRUE(store_->drop_key(chunks[1].key));
  EXPECT_EQ(sim_->host_waits(), 0u);                        // no wait for the copy
  EXPECT_LT(store_->stats().pool_free_bytes, free_before);  // granules wait for the copy
  sim_->release(s);
  store_->flush();
  EXPECT_EQ(store_->stats().pool_free_bytes, free_before);
  store_->check_invariants();
}

TEST_F(SimRules, RetrieveWritesEveryOutputDTypeHostAndDevice) {
  make_store();
  const auto t = tokens64(2 * kChunk, 11);
  std::vector<float> rows(static_cast<size_t>(2 * kChunk * kCols));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = 1.0f + static_cast<float>(i) / 7.0f;
  store_->store_hidden_states(t, {rows.data(), DType::kFloat32, 2 * kChunk, kCols});
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<uint16_t> host(rows.size());
    const MutableTensorView host_out{host.data(), dtype, 2 * kChunk, kCols};
    EXPECT_EQ(store_->retrieve_hidden_states_into(t, host_out), 2 * kChunk);
    const auto dev = device_out(2 * kChunk, dtype);
    EXPECT_EQ(retrieve_device(t, dev, nullptr), 2 * kChunk);
    for (size_t i = 0; i < rows.size(); ++i) {
      const uint16_t want = dtype == DType::kBFloat16 ? kernels::float_to_bf16(rows[i])
                                                      : kernels::float_to_f16(rows[i]);
      ASSERT_EQ(host[i], want) << i;
      ASSERT_EQ(static_cast<const uint16_t*>(dev.data)[i], want) << i;
    }
  }
}

TEST_F(SimRules, NativeBf16RestoredIntoBf16IsBitIdentical) {
  Config c;
  c.hidden_state_storage_dtype = StorageDType::kNative;
  make_store(64, {}, c);
  const auto t = tokens64(kChunk, 12);
  std::vector<uint16_t> bits(static_cast<size_t>(kChunk * kCols));
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(0x3F00 + i * 37);
  store_->store_hidden_states(t, {bits.data(), DType::kBFloat16, kChunk, kCols});
  std::vector<uint16_t> got(bits.size());
  EXPECT_EQ(store_->retrieve_hidden_states_into(
                t, MutableTensorView{got.data(), DType::kBFloat16, kChunk, kCols}),
            kChunk);
  EXPECT_EQ(got, bits);
}

TEST_F(SimRules, WrongDevicePointersAreInvalidArgumentWithNothingChanged) {
  SimDataPath::Options o;
  o.devices = 2;
  make_store(64, o);
  const auto t = tokens64(kChunk, 13);
  auto on_device = device_copy(rows_of(t));
  on_device.device_index = 1;  // the memory is on device 0
  EXPECT_THROW(store_->store_hidden_states(t, on_device), InvalidArgument);
  const auto host_rows = rows_of(t);
  TensorView host_as_cuda{host_rows.data(), DType::kFloat32, kChunk, kCols, 0, Device::kCuda, 0};
  EXPECT_THROW(store_->store_hidden_states(t, host_as_cuda), InvalidArgument);
  auto device_as_host = device_copy(host_rows);
  device_as_host.device = Device::kHost;
  EXPECT_THROW(store_->store_hidden_states(t, device_as_host), InvalidArgument);
  EXPECT_EQ(store_->num_entries(), 0u);
  EXPECT_EQ(store_->stats().stores, 0u);
}

TEST_F(SimRules, RetrieveLayersIntoDeviceBuffersOnTheCallerStream) {
  make_store();
  const Stream s = sim_->create_stream();
  const auto t = tokens64(2 * kChunk, 14);
  store(t, s, 0);
  store(t, s, 3);
  const Slot slots[] = {{ActivationKind::kHidden, 0}, {ActivationKind::kHidden, 3}};
  const MutableTensorView outs[] = {device_out(2 * kChunk), device_out(2 * kChunk)};
  sim_->hold(s);
  RetrieveLayersOptions o;
  o.stream = s;
  o.row_begin = kChunk;
  EXPECT_EQ(store_->retrieve_layers_into(t, slots, outs, o), kChunk);
  sim_->release(s);
  const auto want0 = rows_of(t, 0), want3 = rows_of(t, 3);
  EXPECT_EQ(std::memcmp(outs[0].data, want0.data() + kChunk * kCols, kChunk * kCols * 4), 0);
  EXPECT_EQ(std::memcmp(outs[1].data, want3.data() + kChunk * kCols, kChunk * kCols * 4), 0);
  EXPECT_EQ(sim_->host_waits(), 0u);
}

TEST_F(SimRules, StagingWaitsAreReportedInStats) {
  SimDataPath::Options o;
  o.staging_bytes = kChunk * kCols * 4;
  make_store(64, o);
  const Stream s = sim_->create_stream();
  const auto t1 = tokens64(kChunk, 15), t2 = tokens64(kChunk, 16);
  auto bf16_rows = [&](const std::vector<int64_t>& t) {
    const auto bits = test::to_bf16(rows_of(t));
    void* data = sim_->allocate(bits.size() * 2);
    std::memcpy(data, bits.data(), bits.size() * 2);
    return TensorView{data, DType::kBFloat16, kChunk, kCols, 0, Device::kCuda, 0};
  };
  StoreOptions so;
  so.stream = s;
  sim_->hold(s);
  store_->store_hidden_states(t1, bf16_rows(t1), so);
  const TensorView second = bf16_rows(t2);
  std::thread waiter([&] { store_->store_hidden_states(t2, second, so); });
  sim_->wait_for_host_waiters(1);
  sim_->release(s);
  waiter.join();
  EXPECT_EQ(store_->stats().staging_waits, 1u);
}

// ---- batch calls

TEST_F(SimRules, BatchResultsEqualSingleCallsWithOneKeyPassPerTokenList) {
  make_store(256);
  const auto a = tokens64(3 * kChunk, 20), b = tokens64(2 * kChunk, 21);
  std::vector<std::vector<float>> rows;
  std::vector<StoreItem> items;
  for (int64_t layer = 0; layer < 3; ++layer) {
    for (const auto* t : {&a, &b}) {
      rows.push_back(rows_of(*t, layer));
      StoreOptions o;
      o.layer_idx = layer;
      items.push_back(
          {*t, {rows.back().data(), DType::kFloat32, static_cast<int64_t>(t->size()), kCols}, o});
    }
  }
  // rows may have moved while growing: rebuild the views.
  for (size_t i = 0; i < items.size(); ++i) items[i].hidden_states.data = rows[i].data();
  items.push_back(items[0]);  // already cached: {0, 3}
  const int passes_before = db_.passes.load();
  const auto results = store_->store_batch(items);
  EXPECT_EQ(db_.passes.load() - passes_before, 2);  // two distinct token lists
  ASSERT_EQ(results.size(), items.size());
  EXPECT_EQ(results[0], (StoreResult{3, 3}));
  EXPECT_EQ(results[1], (StoreResult{2, 2}));
  EXPECT_EQ(results.back(), (StoreResult{0, 3}));

  // The same through single calls on a second store.
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore single(test::store_config(kChunk, kCols, 256), db);
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(
        single.store_hidden_states(items[i].token_ids, items[i].hidden_states, items[i].options),
        results[i])
        << i;
  }
  // Retrieve batch == single retrieves, host outputs.
  std::vector<std::vector<float>> got(items.size() - 1);
  std::vector<RetrieveItem> reads;
  for (size_t i = 0; i + 1 < items.size(); ++i) {
    got[i].assign(items[i].token_ids.size() * kCols, -1.0f);
    RetrieveOptions o;
    o.layer_idx = items[i].options.layer_idx;
    o.row_begin = static_cast<int64_t>(i % 2);
    reads.push_back(
        {items[i].token_ids,
         {got[i].data(), DType::kFloat32, static_cast<int64_t>(items[i].token_ids.size()), kCols},
         o});
  }
  const auto read_rows = store_->retrieve_batch_into(reads);
  for (size_t i = 0; i < reads.size(); ++i) {
    std::vector<float> want(got[i].size(), -1.0f);
    EXPECT_EQ(read_rows[i],
              single.retrieve_hidden_states_into(
                  reads[i].token_ids, {want.data(), DType::kFloat32, reads[i].out.rows, kCols},
                  reads[i].options))
        << i;
    EXPECT_EQ(got[i], want) << i;
  }
}

TEST_F(SimRules, BatchWithABadItemNamesItsIndexAndDoesNothing) {
  make_store();
  const auto a = tokens64(2 * kChunk, 22);
  const auto rows = rows_of(a);
  std::vector<StoreItem> items(3,
                               StoreItem{a, {rows.data(), DType::kFloat32, 2 * kChunk, kCols}, {}});
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
  std::vector<float> out(rows.size());
  std::vector<RetrieveItem> reads(
      2, RetrieveItem{a, {out.data(), DType::kFloat32, 2 * kChunk, kCols}, {}});
  reads[1].out.rows = 3;  // too small for the cached prefix
  const auto retrieves_before = store_->stats().retrieves;
  try {
    (void)store_->retrieve_batch_into(reads);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("items[1]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store_->stats().retrieves, retrieves_before);
  EXPECT_EQ(out, std::vector<float>(rows.size(), 0.0f));  // item 0 was not written either
}

TEST_F(SimRules, DeviceBatchOnABlockedStreamReturnsAtOnce) {
  make_store();
  const Stream s = sim_->create_stream();
  const auto a = tokens64(2 * kChunk, 23), b = tokens64(kChunk, 24);
  const auto ra = device_copy(rows_of(a)), rb = device_copy(rows_of(b));
  StoreOptions so;
  so.stream = s;
  sim_->hold(s);
  const StoreItem items[] = {{a, ra, so}, {b, rb, so}};
  const auto results = store_->store_batch(items);
  EXPECT_EQ(results[0], (StoreResult{2, 2}));
  EXPECT_EQ(results[1], (StoreResult{1, 1}));
  RetrieveOptions ro;
  ro.stream = s;
  const RetrieveItem reads[] = {{a, device_out(2 * kChunk), ro}, {b, device_out(kChunk), ro}};
  const auto rows = store_->retrieve_batch_into(reads);
  EXPECT_EQ(rows, (std::vector<int64_t>{2 * kChunk, kChunk}));
  EXPECT_EQ(sim_->host_waits(), 0u);
  sim_->release(s);
  EXPECT_TRUE(holds(reads[0].out, rows_of(a)));
  EXPECT_TRUE(holds(reads[1].out, rows_of(b)));
}

TEST_F(SimRules, DestructionWithRestoresAndCopiesInFlightIsClean) {
  make_store(/*pool_chunks=*/8);
  const Stream s = sim_->create_stream();
  const auto t = tokens64(2 * kChunk, 25);
  sim_->hold(s);
  store(t, s);
  const auto out = device_out(2 * kChunk);
  EXPECT_EQ(retrieve_device(t, out, s), 2 * kChunk);
  const auto chunks = db_.inner.process_tokens(std::span<const int64_t>(t));
  EXPECT_TRUE(store_->drop_key(chunks[1].key));  // a deferred granule return too
  // The store goes while its stream is still blocked: teardown waits for the queued work (as
  // cudaStreamSynchronize would) and the engine's stream moves on meanwhile. ASan: the pool
  // outlives every copy and pin.
  SimDataPath* sim = sim_;
  std::vector<float> seen(static_cast<size_t>(2 * kChunk * kCols));
  std::thread engine([&] {
    sim->wait_for_host_waiters(1);  // teardown is waiting for the blocked stream
    // The engine's next work on the stream reads the restored rows (still held: it queues).
    sim->launch(s, [&] { std::memcpy(seen.data(), out.data, seen.size() * sizeof(float)); });
    sim->release(s);  // the copy, the restore, then the read, in stream order
  });
  store_.reset();
  engine.join();
  EXPECT_EQ(seen, rows_of(t));
}

}  // namespace
}  // namespace hss
