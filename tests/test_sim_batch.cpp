// Batched device calls on the simulated asynchronous path (issue 9): store_batch and
// retrieve_batch_into enqueue one launch per (device, stream) for all their device items, mixed
// source types, strides and output types included, with results bit-identical to single calls;
// batches keep the stream-ordering rules (held streams, cross-stream fences, pins). Plus the
// tiling of the batch kernels' launch tables (src/batch_tiles.hpp), run by the host twins.

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "batch_tiles.hpp"
#include "data_path.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/kernels/tiling.hpp"
#include "hss/token_database.hpp"
#include "sim_data_path.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using detail::SimDataPath;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 40;  // rows of 160 bytes (f32): tiles and strides cut inside granules

std::vector<int64_t> tokens64(int64_t n, uint64_t seed) {
  const auto t = test::make_tokens(n, seed);
  return {t.begin(), t.end()};
}

std::vector<float> rows_of(const std::vector<int64_t>& tokens, int64_t layer) {
  const std::vector<int32_t> t32(tokens.begin(), tokens.end());
  return test::make_rows(t32, 0, layer, kCols);
}

/// One source tensor of a batch item: `dtype` (f32, or bf16/f16 bits of the rows), with
/// `row_stride` >= kCols elements per row; held on the host and as simulated device memory.
struct Source {
  std::vector<std::byte> host;
  void* device = nullptr;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t row_stride = kCols;

  [[nodiscard]] TensorView view(Device where) const {
    return {
        where == Device::kCuda ? device : host.data(), dtype, rows, kCols, row_stride, where, 0};
  }
};

Source make_source(SimDataPath& sim, const std::vector<float>& rows, DType dtype,
                   int64_t row_stride) {
  Source s;
  s.dtype = dtype;
  s.rows = static_cast<int64_t>(rows.size()) / kCols;
  s.row_stride = row_stride;
  const size_t esize = element_size(dtype);
  s.host.assign(static_cast<size_t>(s.rows * row_stride) * esize, std::byte{0x5a});
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      test::write_as(dtype, rows[static_cast<size_t>(r * kCols + c)],
                     s.host.data() + static_cast<size_t>(r * row_stride + c) * esize);
    }
  }
  s.device = sim.allocate(s.host.size());
  std::memcpy(s.device, s.host.data(), s.host.size());
  return s;
}

/// An output buffer of `rows` x kCols (stride `row_stride`) prefilled with 0x77 bytes.
struct Output {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t row_stride = kCols;
  [[nodiscard]] MutableTensorView view(Device where) const {
    return {data, dtype, rows, kCols, row_stride, where, 0};
  }
  [[nodiscard]] size_t bytes() const {
    return static_cast<size_t>(rows * row_stride) * element_size(dtype);
  }
};

class SimBatch : public ::testing::Test {
 protected:
  void SetUp() override {
    Config config = test::store_config(kChunk, kCols, 1024);
    detail::ScopedDevicePathFactory hook([&](const Config&) {
      auto path = std::make_unique<SimDataPath>(SimDataPath::Options{});
      sim_ = path.get();
      return path;
    });
    store_ = std::make_unique<HiddenStateStore>(config, db_);
  }

  Output device_output(int64_t rows, DType dtype, int64_t row_stride) {
    Output o{nullptr, dtype, rows, row_stride};
    o.data = sim_->allocate(o.bytes());
    std::memset(o.data, 0x77, o.bytes());
    return o;
  }

  ChunkedTokenDatabase db_{kChunk, false};
  SimDataPath* sim_ = nullptr;
  std::unique_ptr<HiddenStateStore> store_;
};

TEST_F(SimBatch, OneLaunchPerStreamAndResultsBitIdenticalToSingleCalls) {
  // 12 requests x 3 layers over two streams; f32, bf16 and f16 sources, contiguous and strided;
  // prompts of 1..3 chunks with a partial last chunk on some.
  constexpr int kRequests = 12;
  constexpr int kLayers = 3;
  const Stream streams[2] = {sim_->create_stream(), sim_->create_stream()};
  const DType dtypes[3] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  std::vector<std::vector<int64_t>> prompts;
  for (int r = 0; r < kRequests; ++r) {
    prompts.push_back(tokens64((r % 3 + 1) * kChunk + (r % 2 == 0 ? 0 : 5), 100 + r));
  }
  std::vector<Source> sources;
  sources.reserve(kRequests * kLayers);
  std::vector<StoreItem> device_items, host_items;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int r = 0; r < kRequests; ++r) {
      const DType dtype = dtypes[(r + layer) % 3];
      const int64_t stride = r % 4 == 3 ? kCols + 3 : kCols;
      sources.push_back(make_source(*sim_, rows_of(prompts[r], layer), dtype, stride));
      StoreOptions o;
      o.layer_idx = layer;
      o.stream = streams[r % 2];
      device_items.push_back({prompts[r], sources.back().view(Device::kCuda), o});
      o.stream = nullptr;
      host_items.push_back({prompts[r], sources.back().view(Device::kHost), o});
    }
  }

  const uint64_t before_store = sim_->launches();
  const auto results = store_->store_batch(device_items);
  EXPECT_EQ(sim_->launches() - before_store, 2u);  // one per stream, 36 items

  // The reference: the host path, single calls, on a second store.
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore reference(test::store_config(kChunk, kCols, 1024), db);
  for (size_t i = 0; i < host_items.size(); ++i) {
    const StoreItem& item = host_items[i];
    EXPECT_EQ(reference.store_hidden_states(item.token_ids, item.hidden_states, item.options),
              results[i])
        << i;
  }

  // Retrieve: outputs of every dtype, some strided, some from row 1.
  std::vector<Output> device_outs;
  std::vector<std::vector<std::byte>> host_outs;
  std::vector<RetrieveItem> reads, host_reads;
  for (size_t i = 0; i < device_items.size(); ++i) {
    const int64_t rows = static_cast<int64_t>(device_items[i].token_ids.size());
    const DType dtype = dtypes[i % 3];
    const int64_t stride = i % 5 == 4 ? kCols + 8 : kCols;
    device_outs.push_back(device_output(rows, dtype, stride));
    host_outs.emplace_back(device_outs.back().bytes(), std::byte{0x77});
    RetrieveOptions o;
    o.layer_idx = device_items[i].options.layer_idx;
    o.row_begin = i % 7 == 6 ? 1 : 0;
    o.stream = streams[(i / 2) % 2];
    reads.push_back({device_items[i].token_ids, device_outs.back().view(Device::kCuda), o});
    o.stream = nullptr;
    MutableTensorView host_view = device_outs.back().view(Device::kHost);
    host_view.data = host_outs.back().data();
    host_reads.push_back({device_items[i].token_ids, host_view, o});
  }
  const uint64_t before_restore = sim_->launches();
  const auto rows = store_->retrieve_batch_into(reads);
  EXPECT_EQ(sim_->launches() - before_restore, 2u);
  for (size_t i = 0; i < reads.size(); ++i) {
    const RetrieveItem& r = host_reads[i];
    EXPECT_EQ(reference.retrieve_hidden_states_into(r.token_ids, r.out, r.options), rows[i]) << i;
    EXPECT_GT(rows[i], 0) << i;
    EXPECT_EQ(std::memcmp(device_outs[i].data, host_outs[i].data(), host_outs[i].size()), 0) << i;
  }

  // The same items as single calls: a launch per call at least.
  const uint64_t before_singles = sim_->launches();
  for (const RetrieveItem& r : reads) {
    (void)store_->retrieve_hidden_states_into(r.token_ids, r.out, r.options);
  }
  EXPECT_GE(sim_->launches() - before_singles, reads.size());
  store_->check_invariants();
}

TEST_F(SimBatch, ABatchRestoreOnAnotherStreamWaitsOnTheDeviceForTheBatchStore) {
  const Stream a = sim_->create_stream(), b = sim_->create_stream();
  const auto t1 = tokens64(2 * kChunk, 7), t2 = tokens64(3 * kChunk, 8);
  const Source s1 = make_source(*sim_, rows_of(t1, 0), DType::kBFloat16, kCols);
  const Source s2 = make_source(*sim_, rows_of(t2, 0), DType::kFloat32, kCols + 1);
  StoreOptions so;
  so.stream = a;
  sim_->hold(a);  // the store's launch cannot run yet
  const StoreItem items[] = {{t1, s1.view(Device::kCuda), so}, {t2, s2.view(Device::kCuda), so}};
  EXPECT_EQ(store_->store_batch(items)[1], (StoreResult{3, 3}));

  RetrieveOptions ro;
  ro.stream = b;
  const Output o1 = device_output(2 * kChunk, DType::kFloat32, kCols);
  const Output o2 = device_output(3 * kChunk, DType::kFloat32, kCols);
  const RetrieveItem reads[] = {{t1, o1.view(Device::kCuda), ro}, {t2, o2.view(Device::kCuda), ro}};
  EXPECT_EQ(store_->retrieve_batch_into(reads), (std::vector<int64_t>{2 * kChunk, 3 * kChunk}));
  EXPECT_EQ(sim_->host_waits(), 0u);  // neither call waited on the host
  EXPECT_GT(sim_->queued(b), 0u);     // b waits for a's fence, on the device
  std::vector<std::byte> untouched(o1.bytes(), std::byte{0x77});
  EXPECT_EQ(std::memcmp(o1.data, untouched.data(), untouched.size()), 0);

  sim_->release(a);
  EXPECT_EQ(sim_->queued(b), 0u);
  const auto want1 = test::make_rows(std::vector<int32_t>(t1.begin(), t1.end()), 0, 0, kCols);
  std::vector<float> got1(want1.size());
  std::memcpy(got1.data(), o1.data, got1.size() * sizeof(float));
  for (size_t i = 0; i < want1.size(); ++i) {
    // bf16 source, float32 storage and output: the bf16 value exactly.
    EXPECT_EQ(got1[i], kernels::bf16_to_float(kernels::float_to_bf16(want1[i]))) << i;
  }
  EXPECT_EQ(std::memcmp(o2.data, rows_of(t2, 0).data(), o2.bytes()), 0);
}

TEST_F(SimBatch, ABatchRestoreHoldsItsEntriesUntilItsLaunchRan) {
  const Stream s = sim_->create_stream();
  const auto t = tokens64(2 * kChunk, 9);
  const auto rows = rows_of(t, 0);
  ASSERT_EQ(store_->store_hidden_states(t, test::view_of(rows, kCols)), (StoreResult{2, 2}));
  sim_->hold(s);
  RetrieveOptions ro;
  ro.stream = s;
  const Output out = device_output(2 * kChunk, DType::kFloat32, kCols);
  const RetrieveItem reads[] = {{t, out.view(Device::kCuda), ro}};
  EXPECT_EQ(store_->retrieve_batch_into(reads)[0], 2 * kChunk);
  EXPECT_EQ(sim_->restores_in_flight(), 1u);
  // Dropping the keys while the launch is queued: its pins keep the granules unrecycled.
  for (const Chunk& c : db_.process_tokens(std::span<const int64_t>(t))) {
    EXPECT_TRUE(store_->drop_key(c.key));
  }
  const auto other = tokens64(8 * kChunk, 10);
  const auto other_rows = rows_of(other, 0);
  (void)store_->store_hidden_states(other, test::view_of(other_rows, kCols));
  sim_->release(s);
  EXPECT_EQ(std::memcmp(out.data, rows.data(), out.bytes()), 0);
  store_->flush();
  EXPECT_EQ(sim_->restores_in_flight(), 0u);
  store_->check_invariants();
}

TEST_F(SimBatch, AFailedGroupWithdrawsTheBatchWithoutFreeingGranulesStillBeingWritten) {
  const Stream a = sim_->create_stream(), b = sim_->create_stream();
  const auto t1 = tokens64(2 * kChunk, 14), t2 = tokens64(2 * kChunk, 15);
  const Source s1 = make_source(*sim_, rows_of(t1, 0), DType::kFloat32, kCols);
  const Source s2 = make_source(*sim_, rows_of(t2, 0), DType::kFloat32, kCols);
  StoreOptions on_a, on_b;
  on_a.stream = a;
  on_b.stream = b;
  const StoreItem items[] = {{t1, s1.view(Device::kCuda), on_a},
                             {t2, s2.view(Device::kCuda), on_b}};
  const uint64_t capacity = store_->stats().pool_capacity_bytes;
  sim_->hold(a);             // stream a's launch is queued and will write its granules later
  sim_->fail_store_call(1);  // stream b's launch fails
  EXPECT_THROW((void)store_->store_batch(items), Error);
  EXPECT_EQ(store_->num_entries(), 0u);
  store_->check_invariants();
  // The granules under stream a's queued launch are not back in the pool yet...
  EXPECT_LT(store_->stats().pool_free_bytes, capacity);
  sim_->release(a);
  store_->flush();
  // ...and return once it ran: nothing leaked, nothing reused while being written.
  EXPECT_EQ(store_->stats().pool_free_bytes, capacity);
  const auto t3 = tokens64(4 * kChunk, 16);
  const auto r3 = rows_of(t3, 0);
  EXPECT_EQ(store_->store_hidden_states(t3, test::view_of(r3, kCols)), (StoreResult{4, 4}));
  std::vector<float> got(r3.size());
  EXPECT_EQ(
      store_->retrieve_hidden_states_into(t3, {got.data(), DType::kFloat32, 4 * kChunk, kCols}),
      4 * kChunk);
  EXPECT_EQ(got, r3);
}

TEST_F(SimBatch, RetrieveLayersIntoSeveralDeviceOutputsIsOneLaunch) {
  const Stream s = sim_->create_stream();
  const auto t = tokens64(3 * kChunk, 17);
  const Slot slots[] = {{ActivationKind::kHidden, 0},
                        {ActivationKind::kHidden, 5},
                        {ActivationKind::kKey, 2},
                        {ActivationKind::kHidden, 7}};
  std::vector<std::vector<float>> rows;
  for (const Slot& slot : slots) {
    rows.push_back(rows_of(t, slot.layer_idx + 10 * static_cast<int64_t>(slot.kind)));
    StoreOptions o;
    o.layer_idx = slot.layer_idx;
    o.kind = slot.kind;
    ASSERT_EQ(store_->store_hidden_states(t, test::view_of(rows.back(), kCols), o),
              (StoreResult{3, 3}));
  }
  // Three device outputs (f32, bf16, strided f16) and one host output, from row 1.
  const Output o0 = device_output(3 * kChunk, DType::kFloat32, kCols);
  const Output o1 = device_output(3 * kChunk, DType::kBFloat16, kCols);
  const Output o2 = device_output(3 * kChunk, DType::kFloat16, kCols + 3);
  std::vector<float> host(static_cast<size_t>(3 * kChunk * kCols), -1.0f);
  const MutableTensorView outs[] = {o0.view(Device::kCuda),
                                    o1.view(Device::kCuda),
                                    o2.view(Device::kCuda),
                                    {host.data(), DType::kFloat32, 3 * kChunk, kCols}};
  sim_->hold(s);
  const uint64_t before = sim_->launches();
  EXPECT_EQ(store_->retrieve_layers_into(t, slots, outs, {1, s}), 3 * kChunk - 1);
  EXPECT_EQ(sim_->launches() - before, 1u);  // one launch for the three device outputs
  EXPECT_EQ(sim_->host_waits(), 0u);
  sim_->release(s);
  const int64_t n = 3 * kChunk - 1;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      const auto at = [&](size_t slot) {
        return rows[slot][static_cast<size_t>((r + 1) * kCols + c)];
      };
      float f = 0;
      std::memcpy(&f, static_cast<const float*>(o0.data) + r * kCols + c, 4);
      ASSERT_EQ(f, at(0));
      uint16_t h = 0;
      std::memcpy(&h, static_cast<const uint16_t*>(o1.data) + r * kCols + c, 2);
      ASSERT_EQ(h, kernels::float_to_bf16(at(1)));
      std::memcpy(&h, static_cast<const uint16_t*>(o2.data) + r * (kCols + 3) + c, 2);
      ASSERT_EQ(h, kernels::float_to_f16(at(2)));
      ASSERT_EQ(host[static_cast<size_t>(r * kCols + c)], at(3));
    }
  }
  store_->check_invariants();
}

TEST(SimMappedStore, ASingleCastingStoreIsOneLaunchWithoutStaging) {
  // hidden_state_store_impl: mapped: the batch kernel with one job, writing the pool directly.
  Config config = test::store_config(kChunk, kCols, 64);
  config.hidden_state_store_impl = StoreImpl::kMapped;
  config.hidden_state_staging_bytes = 64;  // a staged cast of these rows would have to wait
  SimDataPath* sim = nullptr;
  detail::ScopedDevicePathFactory hook([&](const Config& c) {
    auto path = std::make_unique<SimDataPath>(
        SimDataPath::Options{static_cast<uint64_t>(c.hidden_state_staging_bytes)});
    sim = path.get();
    return path;
  });
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(config, db);
  const Stream s = sim->create_stream();
  const auto t1 = tokens64(2 * kChunk + 3, 11), t2 = tokens64(3 * kChunk, 12);
  const Source s1 = make_source(*sim, rows_of(t1, 0), DType::kBFloat16, kCols + 2);
  const Source s2 = make_source(*sim, rows_of(t2, 0), DType::kFloat16, kCols);
  StoreOptions so;
  so.stream = s;
  sim->hold(s);
  const uint64_t before = sim->launches();
  EXPECT_EQ(store.store_hidden_states(t1, s1.view(Device::kCuda), so), (StoreResult{2, 2}));
  EXPECT_EQ(store.store_hidden_states(t2, s2.view(Device::kCuda), so), (StoreResult{3, 3}));
  EXPECT_EQ(sim->launches() - before, 2u);
  EXPECT_EQ(sim->staging_in_flight(), 0u);
  EXPECT_EQ(store.stats().staging_waits, 0u);
  EXPECT_EQ(sim->host_waits(), 0u);
  sim->release(s);
  for (const auto* src : {&s1, &s2}) {
    const auto& t = src == &s1 ? t1 : t2;
    const int64_t rows = static_cast<int64_t>(t.size()) / kChunk * kChunk;
    std::vector<float> got(static_cast<size_t>(rows * kCols));
    ASSERT_EQ(store.retrieve_hidden_states_into(t, {got.data(), DType::kFloat32, rows, kCols}),
              rows);
    const auto want = rows_of(t, 0);
    for (size_t i = 0; i < got.size(); ++i) {
      const uint16_t bits = src->dtype == DType::kBFloat16 ? kernels::float_to_bf16(want[i])
                                                           : kernels::float_to_f16(want[i]);
      const float exact = src->dtype == DType::kBFloat16 ? kernels::bf16_to_float(bits)
                                                         : kernels::f16_to_float(bits);
      ASSERT_EQ(got[i], exact) << i;
    }
  }
}

TEST(SimLaunchSlots, ARestoreWaitsOnTheHostOnlyWhenEveryLaunchSlotIsInFlight) {
  Config config = test::store_config(kChunk, kCols, 64);
  config.hidden_state_launch_slots = 2;
  SimDataPath* sim = nullptr;
  detail::ScopedDevicePathFactory hook([&](const Config& c) {
    SimDataPath::Options options;
    options.launch_slots = static_cast<size_t>(c.hidden_state_launch_slots);
    auto path = std::make_unique<SimDataPath>(options);
    sim = path.get();
    return path;
  });
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(config, db);
  const auto t = tokens64(kChunk, 13);
  const auto rows = rows_of(t, 0);
  ASSERT_EQ(store.store_hidden_states(t, test::view_of(rows, kCols)), (StoreResult{1, 1}));
  const Stream s = sim->create_stream();
  sim->hold(s);
  RetrieveOptions ro;
  ro.stream = s;
  std::vector<void*> outs;
  for (int i = 0; i < 3; ++i) outs.push_back(sim->allocate(rows.size() * sizeof(float)));
  auto out = [&](int i) {
    return MutableTensorView{
        outs[static_cast<size_t>(i)], DType::kFloat32, kChunk, kCols, 0, Device::kCuda, 0};
  };
  EXPECT_EQ(store.retrieve_hidden_states_into(t, out(0), ro), kChunk);
  const RetrieveItem batch[] = {{t, out(1), ro}};
  EXPECT_EQ(store.retrieve_batch_into(batch)[0], kChunk);  // the second slot
  EXPECT_EQ(store.stats().launch_waits, 0u);
  std::thread third([&] { (void)store.retrieve_hidden_states_into(t, out(2), ro); });
  sim->wait_for_host_waiters(1);  // both slots are held by the queued launches
  sim->release(s);
  third.join();
  EXPECT_EQ(store.stats().launch_waits, 1u);
  store.flush();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::memcmp(outs[static_cast<size_t>(i)], rows.data(), rows.size() * sizeof(float)),
              0)
        << i;
  }
}

// ---- the launch tables

TEST(BatchTiles, TablesCoverEveryElementOnceAndResumeAcrossTables) {
  // Two jobs: a strided f32 source (cols 5, stride 7) in two segments and a contiguous bf16 one;
  // tables of 2 tiles so that tiling resumes mid-segment and across jobs.
  std::vector<float> src_a(4 * 7);
  for (size_t i = 0; i < src_a.size(); ++i) src_a[i] = static_cast<float>(i) + 0.5f;
  std::vector<uint16_t> src_b(6 * 5);
  for (size_t i = 0; i < src_b.size(); ++i) {
    src_b[i] = kernels::float_to_bf16(static_cast<float>(i) * 0.25f);
  }
  std::vector<float> pool(4 * 5 + 6 * 5, -1.0f);
  const kernels::WriteSegment segs_a[] = {{pool.data(), 0, 0, 8, kernels::ElemType::kFloat32},
                                          {pool.data() + 8, 0, 8, 12, kernels::ElemType::kFloat32}};
  const kernels::WriteSegment segs_b[] = {
      {pool.data() + 20, 1, 0, 30 - 5, kernels::ElemType::kFloat32}};  // rows 1..5
  const detail::StoreJob jobs[] = {
      {{src_a.data(), kernels::ElemType::kFloat32, 5, 7}, segs_a},
      {{nullptr, kernels::ElemType::kFloat32, 5, 5}, {}},  // an empty job is skipped
      {{src_b.data(), kernels::ElemType::kBFloat16, 5, 5}, segs_b}};
  detail::TileCursor cursor;
  std::vector<kernels::BatchStoreTile> table(2);
  size_t tables = 0, tiles = 0;
  for (size_t n; (n = detail::fill_store_tiles(jobs, cursor, table)) > 0; ++tables) {
    tiles += n;
    for (size_t i = 0; i < n; ++i) {
      const auto& t = table[i];
      // Strided sources: a tile stays inside one row.
      if (t.src.row_stride != t.src.cols) {
        EXPECT_LE(t.seg.src_elem % t.src.cols + t.seg.count, t.src.cols);
      }
    }
    detail::run_store_tiles_on_host(std::span(table.data(), n));
  }
  EXPECT_EQ(cursor.job, 3u);
  EXPECT_EQ(tables, 3u);
  // Job a: 0-4 | 5-7 (segment 0), 8-9 | 10-14 | 15-19 (segment 1), each inside a source row;
  // job b: its 25 contiguous elements in one tile.
  EXPECT_EQ(tiles, 6u);
  for (int64_t e = 0; e < 20; ++e) {
    EXPECT_EQ(pool[static_cast<size_t>(e)], src_a[static_cast<size_t>(e / 5 * 7 + e % 5)]) << e;
  }
  for (int64_t e = 0; e < 25; ++e) {
    EXPECT_EQ(pool[static_cast<size_t>(20 + e)],
              kernels::bf16_to_float(src_b[static_cast<size_t>(5 + e)]))
        << e;
  }

  // Restore tables back into a strided f16 output (cols 5, stride 6) from the pool.
  std::vector<uint16_t> out(9 * 6, 0xFFFF);
  const kernels::GatherSegment gathers[] = {
      {pool.data(), 0, 20, kernels::ElemType::kFloat32},
      {pool.data() + 20, 20, 25, kernels::ElemType::kFloat32}};
  const detail::RestoreJob restores[] = {
      {gathers, {out.data(), 5, 6, kernels::ElemType::kFloat16}}};
  detail::TileCursor rc;
  std::vector<kernels::BatchRestoreTile> rtable(2);
  size_t rtiles = 0;
  for (size_t n; (n = detail::fill_restore_tiles(restores, rc, rtable)) > 0;) {
    rtiles += n;
    detail::run_restore_tiles_on_host(std::span(rtable.data(), n));
  }
  EXPECT_EQ(rtiles, 9u);  // one per output row
  for (int64_t e = 0; e < 45; ++e) {
    EXPECT_EQ(out[static_cast<size_t>(e / 5 * 6 + e % 5)],
              kernels::float_to_f16(pool[static_cast<size_t>(e)]))
        << e;
  }
  for (int64_t r = 0; r < 9; ++r) EXPECT_EQ(out[static_cast<size_t>(r * 6 + 5)], 0xFFFF) << r;
}

// The batch kernels' host twins against the host path, for every supported (source, storage)
// pair, every (storage, output) pair, odd widths, 2-byte base offsets and strided views, many jobs
// in one table: bit-identical (the same per-element functions; this checks the tiling and the
// per-tile views).
TEST(BatchTiles, TwinsEqualTheHostPathForEveryTypePairWidthAndOffset) {
  using kernels::ElemType;
  const std::pair<ElemType, ElemType> store_pairs[] = {{ElemType::kFloat32, ElemType::kFloat32},
                                                       {ElemType::kFloat16, ElemType::kFloat32},
                                                       {ElemType::kBFloat16, ElemType::kFloat32},
                                                       {ElemType::kFloat16, ElemType::kFloat16},
                                                       {ElemType::kBFloat16, ElemType::kBFloat16}};
  const ElemType types[] = {ElemType::kFloat32, ElemType::kFloat16, ElemType::kBFloat16};
  const int64_t widths[] = {1, 7, 2051};
  const int64_t rows = 5;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  // Sources, kept alive for the whole table.
  std::vector<std::vector<std::byte>> sources, pools_twin, pools_host;
  std::vector<std::vector<kernels::WriteSegment>> segs_twin, segs_host;
  std::vector<detail::StoreJob> jobs;
  std::vector<std::pair<ElemType, int64_t>> job_shape;  // storage type, cols
  for (const auto& [src_type, dst_type] : store_pairs) {
    for (const int64_t cols : widths) {
      for (const int64_t pad : {int64_t{0}, int64_t{3}}) {
        const size_t offset = src_type == ElemType::kFloat32 ? 0 : 2;
        const int64_t stride = cols + pad;
        const size_t esize = kernels::elem_bytes(src_type);
        auto& src = sources.emplace_back(offset + static_cast<size_t>(rows * stride) * esize);
        for (int64_t i = 0; i < rows * stride; ++i) {
          test::write_as(static_cast<DType>(static_cast<int>(src_type)), dist(rng),
                         src.data() + offset + static_cast<size_t>(i) * esize);
        }
        const kernels::SourceView view{src.data() + offset, src_type, cols, stride};
        // Two segments: rows 1..2 and rows 3..4 (src_row0 = 1), the second split mid-row.
        const int64_t elems = 4 * cols;
        const size_t dst_esize = kernels::elem_bytes(dst_type);
        auto& twin = pools_twin.emplace_back(static_cast<size_t>(elems) * dst_esize, std::byte{1});
        auto& host = pools_host.emplace_back(twin);
        const int64_t cut = elems / 2 + 1;
        segs_twin.push_back({{twin.data(), 1, 0, cut, dst_type},
                             {twin.data() + cut * dst_esize, 1, cut, elems - cut, dst_type}});
        segs_host.push_back({{host.data(), 1, 0, cut, dst_type},
                             {host.data() + cut * dst_esize, 1, cut, elems - cut, dst_type}});
        detail::host_store(view, segs_host.back());
        jobs.push_back({view, segs_twin.back()});
        job_shape.emplace_back(dst_type, cols);
      }
    }
  }
  detail::TileCursor cursor;
  std::vector<kernels::BatchStoreTile> table(detail::kBatchTilesPerTable);
  const size_t n = detail::fill_store_tiles(jobs, cursor, table);
  EXPECT_EQ(cursor.job, jobs.size());  // every job in one table: one launch
  detail::run_store_tiles_on_host(std::span(table.data(), n));
  for (size_t j = 0; j < jobs.size(); ++j) EXPECT_EQ(pools_twin[j], pools_host[j]) << "store " << j;

  // Restores of every pool above into every output type, strided and not, in one table.
  std::vector<std::vector<kernels::GatherSegment>> gathers;
  std::vector<std::vector<std::byte>> outs_twin, outs_host;
  std::vector<detail::RestoreJob> restores;
  gathers.reserve(jobs.size() * 6);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const auto [storage, cols] = job_shape[j];
    const int64_t elems = 4 * cols;
    const size_t src_esize = kernels::elem_bytes(storage);
    for (const ElemType out_type : types) {
      for (const int64_t pad : {int64_t{0}, int64_t{5}}) {
        const int64_t stride = cols + pad;
        const size_t out_esize = kernels::elem_bytes(out_type);
        auto& twin =
            outs_twin.emplace_back(static_cast<size_t>(4 * stride) * out_esize, std::byte{0x77});
        auto& host = outs_host.emplace_back(twin);
        // Two gathers: the pool's second half first, to flat output elements out of order.
        const int64_t half = elems / 2;
        auto& g = gathers.emplace_back(std::vector<kernels::GatherSegment>{
            {pools_host[j].data() + half * src_esize, half, elems - half, storage},
            {pools_host[j].data(), 0, half, storage}});
        detail::host_restore(g, {host.data(), cols, stride, out_type});
        restores.push_back({g, {twin.data(), cols, stride, out_type}});
      }
    }
  }
  detail::TileCursor rc;
  std::vector<kernels::BatchRestoreTile> rtable(detail::kBatchTilesPerTable);
  const size_t rn = detail::fill_restore_tiles(restores, rc, rtable);
  EXPECT_EQ(rc.job, restores.size());
  detail::run_restore_tiles_on_host(std::span(rtable.data(), rn));
  for (size_t r = 0; r < restores.size(); ++r) {
    EXPECT_EQ(outs_twin[r], outs_host[r]) << "restore " << r;
  }
}

}  // namespace
}  // namespace hss
