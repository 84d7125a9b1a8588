// Batched device calls (issue 9) on a GPU (label gpu) and on the CUDA runtime model (label
// gpu-model): store_batch and retrieve_batch_into enqueue one launch per (device, stream) for all
// their device items, mixed source types, strides and output types included, with results
// bit-identical to the host path's single calls; batches keep the stream-ordering rules (held
// streams, cross-stream fences, pins); retrieve_layers_into with several device outputs is one
// launch; a single store with hidden_state_store_impl: mapped is one launch without staging; and
// the launch slots bound the launches in flight.

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "gpu_test_util.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/token_database.hpp"

#if !HSS_WITH_CUDA

TEST(DeviceBatchRules, RequiresACudaBuild) {
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
constexpr int64_t kCols = 40;  // rows of 160 bytes (f32): tiles and strides cut inside granules

std::vector<float> rows_of(const std::vector<int64_t>& tokens, int64_t layer) {
  const std::vector<int32_t> t32(tokens.begin(), tokens.end());
  return test::make_rows(t32, 0, layer, kCols);
}

/// One source tensor of a batch item: `dtype` (f32, or bf16/f16 bits of the rows), with
/// `row_stride` >= kCols elements per row; held on the host and in device memory.
struct Source {
  std::vector<std::byte> host;
  std::unique_ptr<DeviceBytes> device;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t row_stride = kCols;

  [[nodiscard]] TensorView view(Device where) const {
    return {where == Device::kCuda ? device->ptr : host.data(),
            dtype,
            rows,
            kCols,
            row_stride,
            where,
            0};
  }
};

Source make_source(const std::vector<float>& rows, DType dtype, int64_t row_stride) {
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
  s.device = std::make_unique<DeviceBytes>(s.host.size());
  test::upload(*s.device, s.host.data(), s.host.size());
  return s;
}

/// A device output of `rows` x kCols (stride `row_stride`) prefilled with 0x77 bytes.
struct Output {
  std::unique_ptr<DeviceBytes> device;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t row_stride = kCols;
  [[nodiscard]] MutableTensorView view() const {
    return {device->ptr, dtype, rows, kCols, row_stride, Device::kCuda, 0};
  }
  [[nodiscard]] size_t bytes() const {
    return static_cast<size_t>(rows * row_stride) * element_size(dtype);
  }
  [[nodiscard]] std::vector<unsigned char> read() const {
    return test::download(device->ptr, bytes());
  }
};

Output device_output(int64_t rows, DType dtype, int64_t row_stride) {
  Output o{nullptr, dtype, rows, row_stride};
  o.device = std::make_unique<DeviceBytes>(o.bytes());
  test::fill(o.device->ptr, 0x77, o.bytes());
  return o;
}

class DeviceBatchRules : public ::testing::Test {
 protected:
  void SetUp() override {
    HSS_REQUIRE_DEVICE();
    store_ = std::make_unique<HiddenStateStore>(test::store_config(kChunk, kCols, 1024), db_);
  }
  uint64_t launches() const { return store_->stats().device_launches; }

  ChunkedTokenDatabase db_{kChunk, false};
  std::unique_ptr<HiddenStateStore> store_;
};

TEST_F(DeviceBatchRules, OneLaunchPerStreamAndResultsBitIdenticalToTheHostPathsSingleCalls) {
  // 12 requests x 3 layers over two streams; f32, bf16 and f16 sources, contiguous and strided;
  // prompts of 1..3 chunks with a partial last chunk on some.
  constexpr int kRequests = 12;
  constexpr int kLayers = 3;
  StreamHolder streams[2];
  const DType dtypes[3] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  std::vector<std::vector<int64_t> > prompts;
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
      sources.push_back(make_source(rows_of(prompts[r], layer), dtype, stride));
      StoreOptions o;
      o.layer_idx = layer;
      o.stream = streams[r % 2].stream;
      device_items.push_back({prompts[r], sources.back().view(Device::kCuda), o});
      o.stream = nullptr;
      host_items.push_back({prompts[r], sources.back().view(Device::kHost), o});
    }
  }
  const uint64_t before_store = launches();
  const auto results = store_->store_batch(device_items);
  EXPECT_EQ(launches() - before_store, 2u);  // one per stream, 36 items

  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore reference(test::store_config(kChunk, kCols, 1024), db);
  for (size_t i = 0; i < host_items.size(); ++i) {
    const StoreItem& item = host_items[i];
    EXPECT_EQ(reference.store_hidden_states(item.token_ids, item.hidden_states, item.options),
              results[i])
        << i;
  }

  // Retrieve: outputs of every dtype, some strided, some from row 1.
  std::vector<Output> outs;
  std::vector<std::vector<std::byte> > host_outs;
  std::vector<RetrieveItem> reads, host_reads;
  for (size_t i = 0; i < device_items.size(); ++i) {
    const int64_t rows = static_cast<int64_t>(device_items[i].token_ids.size());
    const DType dtype = dtypes[i % 3];
    const int64_t stride = i % 5 == 4 ? kCols + 8 : kCols;
    outs.push_back(device_output(rows, dtype, stride));
    host_outs.emplace_back(outs.back().bytes(), std::byte{0x77});
    RetrieveOptions o;
    o.layer_idx = device_items[i].options.layer_idx;
    o.row_begin = i % 7 == 6 ? 1 : 0;
    o.stream = streams[(i / 2) % 2].stream;
    reads.push_back({device_items[i].token_ids, outs.back().view(), o});
    o.stream = nullptr;
    MutableTensorView host_view = outs.back().view();
    host_view.data = host_outs.back().data();
    host_view.device = Device::kHost;
    host_reads.push_back({device_items[i].token_ids, host_view, o});
  }
  const uint64_t before_restore = launches();
  const auto rows = store_->retrieve_batch_into(reads);
  EXPECT_EQ(launches() - before_restore, 2u);
  for (auto& s : streams) ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  for (size_t i = 0; i < reads.size(); ++i) {
    const RetrieveItem& r = host_reads[i];
    EXPECT_EQ(reference.retrieve_hidden_states_into(r.token_ids, r.out, r.options), rows[i]) << i;
    EXPECT_GT(rows[i], 0) << i;
    const auto got = outs[i].read();
    EXPECT_EQ(std::memcmp(got.data(), host_outs[i].data(), got.size()), 0) << i;
  }

  // The same items as single calls: a launch per call at least.
  const uint64_t before_singles = launches();
  for (const RetrieveItem& r : reads) {
    (void)store_->retrieve_hidden_states_into(r.token_ids, r.out, r.options);
  }
  EXPECT_GE(launches() - before_singles, reads.size());
  for (auto& s : streams) ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  store_->check_invariants();
}

TEST_F(DeviceBatchRules, ABatchRestoreOnAnotherStreamWaitsOnTheDeviceForTheBatchStore) {
  StreamHolder a, b;
  const auto t1 = tokens64(2 * kChunk, 7), t2 = tokens64(3 * kChunk, 8);
  const Source s1 = make_source(rows_of(t1, 0), DType::kBFloat16, kCols);
  const Source s2 = make_source(rows_of(t2, 0), DType::kFloat32, kCols + 1);
  StoreOptions so;
  so.stream = a.stream;
  RetrieveOptions ro;
  ro.stream = b.stream;
  const Output o1 = device_output(2 * kChunk, DType::kFloat32, kCols);
  const Output o2 = device_output(3 * kChunk, DType::kFloat32, kCols);
  {
    StreamGate gate(a.stream);  // the store's launch cannot run yet
    const StoreItem items[] = {{t1, s1.view(Device::kCuda), so}, {t2, s2.view(Device::kCuda), so}};
    EXPECT_EQ(store_->store_batch(items)[1], (StoreResult{3, 3}));
    const RetrieveItem reads[] = {{t1, o1.view(), ro}, {t2, o2.view(), ro}};
    EXPECT_EQ(store_->retrieve_batch_into(reads), (std::vector<int64_t>{2 * kChunk, 3 * kChunk}));
#if HSS_CUDA_MODEL
    EXPECT_GT(cuda_model::queued(b.stream), 0u);  // b waits for a's fence, on the device
#endif
    EXPECT_EQ(o1.read(), std::vector<unsigned char>(o1.bytes(), 0x77));
  }
  ASSERT_EQ(cudaStreamSynchronize(b.stream), cudaSuccess);
  const auto want1 = rows_of(t1, 0);
  const auto got1 = o1.read();
  for (size_t i = 0; i < want1.size(); ++i) {
    float f = 0;
    std::memcpy(&f, got1.data() + 4 * i, 4);
    // bf16 source, float32 storage and output: the bf16 value exactly.
    ASSERT_EQ(f, kernels::bf16_to_float(kernels::float_to_bf16(want1[i]))) << i;
  }
  const auto want2 = rows_of(t2, 0);
  EXPECT_EQ(std::memcmp(o2.read().data(), want2.data(), o2.bytes()), 0);
}

TEST_F(DeviceBatchRules, ABatchRestoreHoldsItsEntriesUntilItsLaunchRan) {
  StreamHolder s;
  const auto t = tokens64(2 * kChunk, 9);
  const auto rows = rows_of(t, 0);
  ASSERT_EQ(store_->store_hidden_states(t, test::view_of(rows, kCols)), (StoreResult{2, 2}));
  RetrieveOptions ro;
  ro.stream = s.stream;
  const Output out = device_output(2 * kChunk, DType::kFloat32, kCols);
  {
    StreamGate gate(s.stream);
    const RetrieveItem reads[] = {{t, out.view(), ro}};
    EXPECT_EQ(store_->retrieve_batch_into(reads)[0], 2 * kChunk);
    // Dropping the keys while the launch is queued: its pins keep the granules unrecycled.
    for (const Chunk& c : db_.process_tokens(std::span<const int64_t>(t))) {
      EXPECT_TRUE(store_->drop_key(c.key));
    }
    const auto other = tokens64(8 * kChunk, 10);
    const auto other_rows = rows_of(other, 0);
    (void)store_->store_hidden_states(other, test::view_of(other_rows, kCols));
  }
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(std::memcmp(out.read().data(), rows.data(), out.bytes()), 0);
  store_->flush();
  store_->check_invariants();
}

TEST_F(DeviceBatchRules, RetrieveLayersIntoSeveralDeviceOutputsIsOneLaunch) {
  StreamHolder s;
  const auto t = tokens64(3 * kChunk, 17);
  const Slot slots[] = {{ActivationKind::kHidden, 0},
                        {ActivationKind::kHidden, 5},
                        {ActivationKind::kKey, 2},
                        {ActivationKind::kHidden, 7}};
  std::vector<std::vector<float> > rows;
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
  const MutableTensorView outs[] = {
      o0.view(), o1.view(), o2.view(), {host.data(), DType::kFloat32, 3 * kChunk, kCols}};
  const uint64_t before = launches();
  {
    StreamGate gate(s.stream);
    EXPECT_EQ(store_->retrieve_layers_into(t, slots, outs, {1, s.stream}), 3 * kChunk - 1);
    EXPECT_EQ(launches() - before, 1u);  // one launch for the three device outputs
  }
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  const auto g0 = o0.read(), g1 = o1.read(), g2 = o2.read();
  const int64_t n = 3 * kChunk - 1;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      const auto at = [&](size_t slot) {
        return rows[slot][static_cast<size_t>((r + 1) * kCols + c)];
      };
      float f = 0;
      std::memcpy(&f, g0.data() + 4 * (r * kCols + c), 4);
      ASSERT_EQ(f, at(0));
      uint16_t h = 0;
      std::memcpy(&h, g1.data() + 2 * (r * kCols + c), 2);
      ASSERT_EQ(h, kernels::float_to_bf16(at(1)));
      std::memcpy(&h, g2.data() + 2 * (r * (kCols + 3) + c), 2);
      ASSERT_EQ(h, kernels::float_to_f16(at(2)));
      ASSERT_EQ(host[static_cast<size_t>(r * kCols + c)], at(3));
    }
  }
  store_->check_invariants();
}

TEST(DeviceMappedStore, ASingleCastingStoreIsOneLaunchWithoutStaging) {
  HSS_REQUIRE_DEVICE();
  // hidden_state_store_impl: mapped: the batch kernel with one job, writing the pool directly.
  Config config = test::store_config(kChunk, kCols, 64);
  config.tuning.store_impl = StoreImpl::kMapped;
  config.tuning.staging_bytes = 64;  // a staged cast of these rows would have to wait
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(config, db);
  StreamHolder s;
  const auto t1 = tokens64(2 * kChunk + 3, 11), t2 = tokens64(3 * kChunk, 12);
  const Source s1 = make_source(rows_of(t1, 0), DType::kBFloat16, kCols + 2);
  const Source s2 = make_source(rows_of(t2, 0), DType::kFloat16, kCols);
  StoreOptions so;
  so.stream = s.stream;
  const uint64_t before = store.stats().device_launches;
  {
    StreamGate gate(s.stream);
    EXPECT_EQ(store.store_hidden_states(t1, s1.view(Device::kCuda), so), (StoreResult{2, 2}));
    EXPECT_EQ(store.store_hidden_states(t2, s2.view(Device::kCuda), so), (StoreResult{3, 3}));
    EXPECT_EQ(store.stats().device_launches - before, 2u);
    EXPECT_EQ(store.stats().staging_waits, 0u);
  }
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

TEST(DeviceLaunchSlots, ARestoreWaitsOnTheHostOnlyWhenEveryLaunchSlotIsInFlight) {
  HSS_REQUIRE_DEVICE();
  Config config = test::store_config(kChunk, kCols, 64);
  config.tuning.launch_slots = 2;
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(config, db);
  const auto t = tokens64(kChunk, 13);
  const auto rows = rows_of(t, 0);
  ASSERT_EQ(store.store_hidden_states(t, test::view_of(rows, kCols)), (StoreResult{1, 1}));
  StreamHolder s;
  RetrieveOptions ro;
  ro.stream = s.stream;
  std::vector<Output> outs;
  for (int i = 0; i < 3; ++i) outs.push_back(device_output(kChunk, DType::kFloat32, kCols));
  {
    StreamGate gate(s.stream);
    EXPECT_EQ(store.retrieve_hidden_states_into(t, outs[0].view(), ro), kChunk);
    const RetrieveItem batch[] = {{t, outs[1].view(), ro}};
    EXPECT_EQ(store.retrieve_batch_into(batch)[0], kChunk);  // the second slot
    EXPECT_EQ(store.stats().launch_waits, 0u);
    std::atomic<bool> third_done{false};
    std::thread third([&] {
      (void)store.retrieve_hidden_states_into(t, outs[2].view(), ro);
      third_done = true;
    });
    test::wait_until_a_thread_blocks();  // both slots are held by the queued launches
    EXPECT_FALSE(third_done.load());
    gate.open();
    third.join();
  }
  EXPECT_EQ(store.stats().launch_waits, 1u);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::memcmp(outs[static_cast<size_t>(i)].read().data(), rows.data(),
                          rows.size() * sizeof(float)),
              0)
        << i;
  }
}

}  // namespace
}  // namespace hss

#endif  // HSS_WITH_CUDA
