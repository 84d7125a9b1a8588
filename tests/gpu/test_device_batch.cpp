// Batched device calls on a real device (ctest label gpu): one launch per stream for a batch of
// mixed source types, strides, odd widths and offsets, outputs of every dtype, with results
// bit-identical to the host path's single calls, for float32 and native storage. CI runs them on
// the CUDA runtime model (label gpu-model); tests/gpu/test_device_batch_rules.cpp has the rules.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "hss/build_info.hpp"
#include "hss/config.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/token_database.hpp"

#if HSS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "gpu_test_util.hpp"

#if !HSS_WITH_CUDA

TEST(DeviceBatch, RequiresACudaBuild) {
  GTEST_SKIP() << "built without CUDA (HSS_ENABLE_CUDA=OFF): " << hss::runtime_info().reason;
}

#else

namespace hss {
namespace {

using test::DeviceBytes;
using test::StreamHolder;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 2051;  // odd: no row is 16-byte aligned throughout

class DeviceBatch : public ::testing::TestWithParam<StorageDType> {};

TEST_P(DeviceBatch, OneLaunchPerStreamAndBitIdenticalToHostSingleCalls) {
  HSS_REQUIRE_DEVICE();
  Config c;
  c.chunk_size = kChunk;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = 0.25;
  c.hidden_state_storage_dtype = GetParam();
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore batch(c, db), reference(c, db);
  StreamHolder streams[2];
  const DType dtypes[3] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

  struct Item {
    std::vector<int64_t> tokens;
    DType dtype;
    int64_t stride;
    std::vector<unsigned char> host;
    DeviceBytes device;
    Item(std::vector<int64_t> t, DType d, int64_t s, std::vector<unsigned char> h)
        : tokens(std::move(t)), dtype(d), stride(s), host(std::move(h)), device(host.size()) {}
  };
  std::vector<std::unique_ptr<Item> > items;
  std::vector<StoreItem> device_items;
  for (int layer = 0; layer < 3; ++layer) {
    for (uint32_t r = 0; r < 8; ++r) {
      const DType dtype = dtypes[(r + static_cast<uint32_t>(layer)) % 3];
      const int64_t rows = (r % 3 + 1) * kChunk + (r % 2 == 0 ? 0 : 7);
      const int64_t stride = r % 4 == 3 ? kCols + 5 : kCols;
      // The prompts of a request are the same across layers.
      // One element of padding first: 16-bit views start 2 bytes into their allocation (not
      // 16-byte aligned: the kernels' scalar head runs), float32 views 4 bytes.
      items.push_back(std::make_unique<Item>(
          test::tokens_of(rows, 50 + r), dtype, stride,
          test::random_rows(dtype, rows, kCols, 100 * layer + r, stride, element_size(dtype))));
      Item& item = *items.back();
      // upload() also synchronises the legacy stream: the copy of pageable memory may still be
      // landing when cudaMemcpy returns, and the non-blocking streams below do not wait for it.
      ASSERT_NO_FATAL_FAILURE(test::upload(item.device, item.host.data(), item.host.size()));
      StoreOptions o;
      o.layer_idx = layer;
      o.stream = streams[r % 2].stream;
      device_items.push_back({item.tokens,
                              {static_cast<unsigned char*>(item.device.ptr) + element_size(dtype),
                               dtype, rows, kCols, stride, Device::kCuda, 0},
                              o});
    }
  }
  const uint64_t launches_before = batch.stats().device_launches;
  const auto results = batch.store_batch(device_items);
  EXPECT_EQ(batch.stats().device_launches - launches_before, 2u);  // one per stream
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& item = *items[i];
    StoreOptions o = device_items[i].options;
    o.stream = nullptr;
    EXPECT_EQ(
        reference.store_hidden_states(item.tokens,
                                      {item.host.data() + element_size(item.dtype), item.dtype,
                                       device_items[i].hidden_states.rows, kCols, item.stride},
                                      o),
        results[i])
        << i;
  }

  // Restore every item into outputs of every dtype, some strided, on the other stream.
  std::vector<std::unique_ptr<DeviceBytes> > outs;
  std::vector<RetrieveItem> reads;
  for (size_t i = 0; i < device_items.size(); ++i) {
    const DType out_dtype = dtypes[i % 3];
    const int64_t rows = device_items[i].hidden_states.rows;
    const int64_t stride = i % 5 == 4 ? kCols + 9 : kCols;
    outs.push_back(std::make_unique<DeviceBytes>(static_cast<size_t>(rows * stride) *
                                                 element_size(out_dtype)));
    test::fill(outs.back()->ptr, 0x77, outs.back()->bytes);
    RetrieveOptions o;
    o.layer_idx = device_items[i].options.layer_idx;
    o.stream = streams[(i + 1) % 2].stream;
    reads.push_back({device_items[i].token_ids,
                     {outs.back()->ptr, out_dtype, rows, kCols, stride, Device::kCuda, 0},
                     o});
  }
  const uint64_t restore_before = batch.stats().device_launches;
  const auto rows = batch.retrieve_batch_into(reads);
  EXPECT_EQ(batch.stats().device_launches - restore_before, 2u);
  for (auto& s : streams) CUDA_OK(cudaStreamSynchronize(s.stream));
  for (size_t i = 0; i < reads.size(); ++i) {
    const size_t bytes = outs[i]->bytes;
    std::vector<unsigned char> got(bytes), want(bytes, 0x77);
    CUDA_OK(cudaMemcpy(got.data(), outs[i]->ptr, bytes, cudaMemcpyDeviceToHost));
    MutableTensorView host_out = reads[i].out;
    host_out.data = want.data();
    host_out.device = Device::kHost;
    RetrieveOptions o = reads[i].options;
    o.stream = nullptr;
    EXPECT_EQ(reference.retrieve_hidden_states_into(reads[i].token_ids, host_out, o), rows[i]);
    EXPECT_EQ(rows[i], reads[i].out.rows / kChunk * kChunk) << i;  // a partial chunk is not kept
    EXPECT_EQ(std::memcmp(got.data(), want.data(), bytes), 0) << i;
  }
}

// A single call is a batch of one: a batch whose (device, stream) group holds one item launches
// exactly as the single call does (the single store's staging path under
// hidden_state_store_impl: staging, restore() under hidden_state_restore_impl), with the same
// results, counters and bytes.
TEST(DeviceBatch, ABatchOfOneIsTheSingleCall) {
  HSS_REQUIRE_DEVICE();
  Config c;
  c.chunk_size = kChunk;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = 0.0625;
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore single(c, db), batch(c, db);
  StreamHolder stream;
  const int64_t rows = 3 * kChunk, cols = 96;
  const auto tokens = test::tokens_of(rows, 71);
  const auto host = test::random_rows(DType::kBFloat16, rows, cols, 72, 0, 0);
  DeviceBytes dev(host.size());
  test::upload(dev, host.data(), host.size());
  StoreOptions so;
  so.stream = stream.stream;
  const TensorView view{dev.ptr, DType::kBFloat16, rows, cols, 0, Device::kCuda, 0};

  const StoreResult one = single.store_hidden_states(tokens, view, so);
  const StoreItem item{tokens, view, so};
  const std::vector<StoreResult> many = batch.store_batch(std::span<const StoreItem>(&item, 1));
  ASSERT_EQ(many.size(), 1u);
  EXPECT_EQ(many[0], one);
  EXPECT_EQ(one.written, 3);
  const HiddenStateStats s1 = single.stats(), s2 = batch.stats();
  EXPECT_EQ(s2.device_launches, s1.device_launches);  // the staging gather and its copies
  EXPECT_GT(s1.device_launches, 1u);
  EXPECT_EQ(s2.stores, s1.stores);
  EXPECT_EQ(s2.chunks_written, s1.chunks_written);

  DeviceBytes out1(static_cast<size_t>(rows * cols) * 4), out2(out1.bytes);
  test::fill(out1.ptr, 0x55, out1.bytes);
  test::fill(out2.ptr, 0x55, out2.bytes);
  RetrieveOptions ro;
  ro.stream = stream.stream;
  const MutableTensorView v1{out1.ptr, DType::kFloat32, rows, cols, 0, Device::kCuda, 0};
  const MutableTensorView v2{out2.ptr, DType::kFloat32, rows, cols, 0, Device::kCuda, 0};
  const uint64_t before1 = single.stats().device_launches;
  const uint64_t before2 = batch.stats().device_launches;
  EXPECT_EQ(single.retrieve_hidden_states_into(tokens, v1, ro), rows);
  const RetrieveItem read{tokens, v2, ro};
  const std::vector<int64_t> got = batch.retrieve_batch_into(std::span<const RetrieveItem>(&read, 1));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], rows);
  EXPECT_EQ(batch.stats().device_launches - before2, single.stats().device_launches - before1);
  EXPECT_EQ(batch.stats().hit_tokens, single.stats().hit_tokens);
  CUDA_OK(cudaStreamSynchronize(stream.stream));
  std::vector<unsigned char> b1(out1.bytes), b2(out2.bytes);
  CUDA_OK(cudaMemcpy(b1.data(), out1.ptr, b1.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(b2.data(), out2.ptr, b2.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(b1, b2);
  // bfloat16 widened exactly: the first element is the stored one shifted into a float32.
  uint16_t first16 = 0;
  std::memcpy(&first16, host.data(), 2);
  uint32_t first32 = 0;
  std::memcpy(&first32, b1.data(), 4);
  EXPECT_EQ(first32, uint32_t{first16} << 16);
}

// A GPU loads an element only from an address aligned to its size; a misaligned one is a sticky
// cudaErrorMisalignedAddress that loses the context. Device views are therefore checked: a view
// whose data is not element-aligned is InvalidArgument, before anything changes. (Row strides
// are counted in elements, so an aligned base aligns every row.)
TEST(DeviceViews, AMisalignedDeviceViewIsInvalidArgumentWithNothingChanged) {
  HSS_REQUIRE_DEVICE();
  Config c;
  c.chunk_size = kChunk;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = 0.0625;
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(c, db);
  const int64_t rows = 2 * kChunk, cols = 64;
  const auto tokens = test::tokens_of(rows, 60);
  const auto host = test::random_rows(DType::kFloat32, rows, cols, 61, 0, 4);
  DeviceBytes dev(host.size() + 4);
  test::upload(dev, host.data(), host.size());
  auto* base = static_cast<unsigned char*>(dev.ptr);
  const auto expect_misaligned = [](const auto& call, const char* argument) {
    try {
      call();
      ADD_FAILURE() << "no error for " << argument;
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(argument), std::string::npos) << what;
      EXPECT_NE(what.find("aligned"), std::string::npos) << what;
    }
  };
  // float32 rows 2 bytes off, bfloat16 rows 1 byte off: single calls and a batch item.
  expect_misaligned(
      [&] {
        (void)store.store_hidden_states(
            tokens, {base + 2, DType::kFloat32, rows, cols, 0, Device::kCuda, 0});
      },
      "hidden_states.data");
  expect_misaligned(
      [&] {
        (void)store.store_hidden_states(
            tokens, {base + 1, DType::kBFloat16, rows, cols, 0, Device::kCuda, 0});
      },
      "hidden_states.data");
  const StoreItem items[] = {
      {tokens, {base + 4, DType::kFloat32, rows, cols, 0, Device::kCuda, 0}, {}},
      {tokens, {base + 2, DType::kFloat32, rows, cols, 0, Device::kCuda, 0}, {1, 0}}};
  expect_misaligned([&] { (void)store.store_batch(items); }, "items[1]");
  EXPECT_EQ(store.num_entries(), 0u);
  EXPECT_EQ(store.stats().stores, 0u);
  EXPECT_EQ(store.stats().device_launches, 0u);

  // An aligned view of the same memory (4 bytes in) stores, and an output 2 bytes off is refused.
  EXPECT_EQ(
      store
          .store_hidden_states(tokens, {base + 4, DType::kFloat32, rows, cols, 0, Device::kCuda, 0})
          .cached,
      2);
  DeviceBytes out(host.size() + 4);
  test::fill(out.ptr, 0x55, out.bytes);
  auto* out_base = static_cast<unsigned char*>(out.ptr);
  const uint64_t retrieves = store.stats().retrieves;
  expect_misaligned(
      [&] {
        (void)store.retrieve_hidden_states_into(
            tokens, {out_base + 2, DType::kFloat32, rows, cols, 0, Device::kCuda, 0});
      },
      "out.data");
  expect_misaligned(
      [&] {
        const RetrieveItem bad[] = {
            {tokens, {out_base + 1, DType::kFloat16, rows, cols, 0, Device::kCuda, 0}, {}}};
        (void)store.retrieve_batch_into(bad);
      },
      "items[0]");
  EXPECT_EQ(store.stats().retrieves, retrieves);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(test::download(out.ptr, out.bytes), std::vector<unsigned char>(out.bytes, 0x55));
  // The aligned store's rows are intact.
  const auto got = store.retrieve_hidden_states(tokens);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(std::memcmp(got->data(), host.data() + 4, host.size() - 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Storage, DeviceBatch,
                         ::testing::Values(StorageDType::kFloat32, StorageDType::kNative),
                         [](const ::testing::TestParamInfo<StorageDType>& param_info) {
                           return param_info.param == StorageDType::kNative ? "native" : "float32";
                         });

}  // namespace
}  // namespace hss

#endif  // HSS_WITH_CUDA
