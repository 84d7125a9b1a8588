// Batched device calls on a real device (ctest label gpu): one launch per stream for a batch of
// mixed source types, strides, odd widths and offsets, outputs of every dtype, with results
// bit-identical to the host path's single calls, for float32 and native storage. The same rules
// run in CI on the simulated path (tests/test_sim_batch.cpp).

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "hss/build_info.hpp"
#include "hss/config.hpp"
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
      items.push_back(std::make_unique<Item>(
          test::tokens_of(rows, 50 + r), dtype, stride,
          test::random_rows(dtype, rows, kCols, 100 * layer + r, stride, 2)));
      Item& item = *items.back();
      ASSERT_NE(item.device.ptr, nullptr);
      CUDA_OK(
          cudaMemcpy(item.device.ptr, item.host.data(), item.host.size(), cudaMemcpyHostToDevice));
      StoreOptions o;
      o.layer_idx = layer;
      o.stream = streams[r % 2].stream;
      device_items.push_back({item.tokens,
                              {static_cast<unsigned char*>(item.device.ptr) + 2, dtype, rows, kCols,
                               stride, Device::kCuda, 0},
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
                                      {item.host.data() + 2, item.dtype,
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
    EXPECT_EQ(rows[i], reads[i].out.rows) << i;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), bytes), 0) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, DeviceBatch,
                         ::testing::Values(StorageDType::kFloat32, StorageDType::kNative),
                         [](const ::testing::TestParamInfo<StorageDType>& param_info) {
                           return param_info.param == StorageDType::kNative ? "native" : "float32";
                         });

}  // namespace
}  // namespace hss

#endif  // HSS_WITH_CUDA
