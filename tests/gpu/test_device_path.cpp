// The CUDA data path through the public API: device stores equal host stores bit for bit, the
// caller may reuse its source at once, retrieve waits for pending copies, restore into device
// memory with each HSS_RESTORE_IMPL. Every test skips (with the reason) when no device is usable.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hss/build_info.hpp"
#include "hss/config.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/token_database.hpp"
#include "hss/trace.hpp"

#if HSS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "gpu_test_util.hpp"

#if !HSS_WITH_CUDA

TEST(DevicePath, RequiresACudaBuild) {
  GTEST_SKIP() << "built without CUDA (HSS_ENABLE_CUDA=OFF): " << hss::runtime_info().reason;
}

#else

namespace hss {
namespace {

using test::DeviceBytes;
using test::StreamHolder;

constexpr int64_t kChunk = 16;

Config make_config(StorageDType storage, double pool_gib = 0.0625) {
  Config c;
  c.chunk_size = kChunk;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = pool_gib;
  c.hidden_state_storage_dtype = storage;
  return c;
}

std::vector<int32_t> make_tokens(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = static_cast<int32_t>(rng() % 50000);
  return t;
}

/// rows x stride elements of `dtype` with random finite values (16-bit patterns avoid inf/NaN).
std::vector<unsigned char> make_rows(DType dtype, int64_t rows, int64_t stride, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t n = static_cast<size_t>(rows * stride);
  std::vector<unsigned char> bytes(n * element_size(dtype));
  if (dtype == DType::kFloat32) {
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    auto* f = reinterpret_cast<float*>(bytes.data());
    for (size_t i = 0; i < n; ++i) f[i] = dist(rng);
  } else {
    auto* h = reinterpret_cast<uint16_t*>(bytes.data());
    for (size_t i = 0; i < n; ++i) {
      uint16_t v = static_cast<uint16_t>(rng());
      if (dtype == DType::kFloat16 && ((v >> 10) & 0x1F) == 0x1F) v &= 0xBFFF;
      if (dtype == DType::kBFloat16 && ((v >> 7) & 0xFF) == 0xFF) v &= 0xBFFF;
      h[i] = v;
    }
  }
  return bytes;
}

/// One store pair: host path and device path, same config.
struct Stores {
  explicit Stores(const Config& c)
      : db(c.chunk_size, c.save_unfull_chunk),
        host(std::make_unique<HiddenStateStore>(c, db)),
        device(std::make_unique<HiddenStateStore>(c, db)) {}
  ChunkedTokenDatabase db;
  std::unique_ptr<HiddenStateStore> host, device;
};

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

struct DTypeCase {
  DType dtype;
  StorageDType storage;
};

void PrintTo(const DTypeCase& c, std::ostream* os) {
  *os << to_string(c.dtype) << " stored as " << to_string(c.storage);
}

class DeviceStoreDTypes : public ::testing::TestWithParam<DTypeCase> {};

TEST_P(DeviceStoreDTypes, DeviceStoreEqualsHostStoreBitForBit) {
  HSS_REQUIRE_DEVICE();
  const auto [dtype, storage] = GetParam();
  Stores s(make_config(storage));
  const int64_t rows = 5 * kChunk + 3, cols = 72, stride = 80;  // padded rows, partial chunk
  const auto tokens = make_tokens(rows, 1);
  const auto host = make_rows(dtype, rows, stride, 2);
  DeviceBytes dev(host.size());
  ASSERT_NE(dev.ptr, nullptr);
  ASSERT_NO_FATAL_FAILURE(test::upload(dev, host.data(), host.size()));

  const TensorView host_view{host.data(), dtype, rows, cols, stride, Device::kHost, 0};
  const TensorView dev_view{dev.ptr, dtype, rows, cols, stride, Device::kCuda, 0};
  EXPECT_EQ(s.host->store_hidden_states(tokens, host_view).cached, 5);
  EXPECT_EQ(s.device->store_hidden_states(tokens, dev_view).cached, 5);
  EXPECT_TRUE(s.device->stats().device_path);

  const auto want = s.host->retrieve_hidden_states(tokens);
  const auto got = s.device->retrieve_hidden_states(tokens);
  ASSERT_TRUE(want && got);
  EXPECT_EQ(got->rows(), 5 * kChunk);
  EXPECT_TRUE(same_bits(*want, *got));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, DeviceStoreDTypes,
                         ::testing::Values(DTypeCase{DType::kFloat32, StorageDType::kFloat32},
                                           DTypeCase{DType::kFloat16, StorageDType::kFloat32},
                                           DTypeCase{DType::kBFloat16, StorageDType::kFloat32},
                                           DTypeCase{DType::kFloat16, StorageDType::kNative},
                                           DTypeCase{DType::kBFloat16, StorageDType::kNative}),
                         [](const ::testing::TestParamInfo<DTypeCase>& param_info) {
                           return std::string(to_string(param_info.param.dtype)) + "_" +
                                  std::string(to_string(param_info.param.storage));
                         });

TEST(DevicePath, SourceOverwrittenOnTheStreamAfterStoreReturnsStillYieldsOldRows) {
  HSS_REQUIRE_DEVICE();
  Stores s(make_config(StorageDType::kFloat32));
  const int64_t rows = 8 * kChunk, cols = 256;
  const auto tokens = make_tokens(rows, 3);
  const auto host = make_rows(DType::kBFloat16, rows, cols, 4);
  DeviceBytes dev(host.size());
  StreamHolder stream;
  ASSERT_NO_FATAL_FAILURE(test::upload(dev, host.data(), host.size()));
  StoreOptions opt;
  opt.stream = stream.stream;
  s.device->store_hidden_states(tokens,
                                {dev.ptr, DType::kBFloat16, rows, cols, 0, Device::kCuda, 0}, opt);
  CUDA_OK(cudaMemsetAsync(dev.ptr, 0x7F, dev.bytes, stream.stream));  // the engine's next step
  s.host->store_hidden_states(tokens, {host.data(), DType::kBFloat16, rows, cols});
  const auto got = s.device->retrieve_hidden_states(tokens);
  const auto want = s.host->retrieve_hidden_states(tokens);
  ASSERT_TRUE(got && want);
  EXPECT_TRUE(same_bits(*want, *got));
  CUDA_OK(cudaStreamSynchronize(stream.stream));
}

void sleep_on_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

TEST(DevicePath, RetrieveWaitsForAPendingCopy) {
  HSS_REQUIRE_DEVICE();
  Stores s(make_config(StorageDType::kFloat32));
  const int64_t rows = 4 * kChunk, cols = 128;
  const auto tokens = make_tokens(rows, 5);
  const auto host = make_rows(DType::kFloat32, rows, cols, 6);
  DeviceBytes dev(host.size());
  StreamHolder stream;
  ASSERT_NO_FATAL_FAILURE(test::upload(dev, host.data(), host.size()));
  // Hold the stream so the gather kernel (and so the copies) cannot have run when retrieve starts.
  static int delay_ms = 300;
  CUDA_OK(cudaLaunchHostFunc(stream.stream, sleep_on_stream, &delay_ms));
  StoreOptions opt;
  opt.stream = stream.stream;
  EXPECT_EQ(s.device
                ->store_hidden_states(
                    tokens, {dev.ptr, DType::kFloat32, rows, cols, 0, Device::kCuda, 0}, opt)
                .cached,
            4);
  const auto got = s.device->retrieve_hidden_states(tokens);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->rows(), rows);
  EXPECT_EQ(std::memcmp(got->data(), host.data(), host.size()), 0);
}

TEST(DevicePath, FlushWaitsForEveryPendingCopy) {
  HSS_REQUIRE_DEVICE();
  Stores s(make_config(StorageDType::kFloat32));
  const int64_t rows = 2 * kChunk, cols = 64;
  const auto tokens = make_tokens(rows, 7);
  const auto host = make_rows(DType::kFloat32, rows, cols, 8);
  DeviceBytes dev(host.size());
  StreamHolder stream;
  ASSERT_NO_FATAL_FAILURE(test::upload(dev, host.data(), host.size()));
  static int delay_ms = 200;
  CUDA_OK(cudaLaunchHostFunc(stream.stream, sleep_on_stream, &delay_ms));
  StoreOptions opt;
  opt.stream = stream.stream;
  s.device->store_hidden_states(tokens, {dev.ptr, DType::kFloat32, rows, cols, 0, Device::kCuda, 0},
                                opt);
  s.device->flush();
  // The copies waited for the gather kernel, which ran after everything queued before it.
  EXPECT_EQ(cudaStreamQuery(stream.stream), cudaSuccess);
}

TEST(DevicePath, ConcurrentStoresFromTwoStreams) {
  HSS_REQUIRE_DEVICE();
  Stores s(make_config(StorageDType::kFloat32));
  const int64_t rows = 6 * kChunk, cols = 96;
  constexpr int kThreads = 2, kLayers = 8;
  std::vector<std::vector<int32_t> > tokens;
  std::vector<std::vector<unsigned char> > host;
  for (int t = 0; t < kThreads; ++t) {
    tokens.push_back(make_tokens(rows, 100 + static_cast<uint32_t>(t)));
    host.push_back(make_rows(DType::kFloat16, rows, cols, 200 + static_cast<uint32_t>(t)));
  }
  std::vector<std::string> failures(kThreads);
  auto worker = [&](int t) {
    try {
      StreamHolder stream;
      DeviceBytes dev(host[static_cast<size_t>(t)].size());
      for (int layer = 0; layer < kLayers; ++layer) {
        // A different source per layer: rewritten on the stream after each store.
        auto rows_l = host[static_cast<size_t>(t)];
        for (auto& b : rows_l) b = static_cast<unsigned char>(b ^ (layer * 3));
        if (cudaMemcpyAsync(dev.ptr, rows_l.data(), rows_l.size(), cudaMemcpyHostToDevice,
                            stream.stream) != cudaSuccess ||
            cudaStreamSynchronize(stream.stream) != cudaSuccess) {
          failures[static_cast<size_t>(t)] = "upload failed";
          return;
        }
        StoreOptions opt;
        opt.stream = stream.stream;
        opt.layer_idx = layer;
        s.device->store_hidden_states(tokens[static_cast<size_t>(t)],
                                      {dev.ptr, DType::kFloat16, rows, cols, 0, Device::kCuda, 0},
                                      opt);
        s.host->store_hidden_states(tokens[static_cast<size_t>(t)],
                                    {rows_l.data(), DType::kFloat16, rows, cols}, {layer, 0});
      }
      (void)cudaStreamSynchronize(stream.stream);
    } catch (const std::exception& e) {
      failures[static_cast<size_t>(t)] = e.what();
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  for (const auto& f : failures) EXPECT_EQ(f, "");
  for (int t = 0; t < kThreads; ++t) {
    for (int layer = 0; layer < kLayers; ++layer) {
      const auto got = s.device->retrieve_hidden_states(tokens[static_cast<size_t>(t)], {layer});
      const auto want = s.host->retrieve_hidden_states(tokens[static_cast<size_t>(t)], {layer});
      ASSERT_TRUE(got && want) << t << " " << layer;
      EXPECT_TRUE(same_bits(*want, *got)) << t << " " << layer;
    }
  }
}

TEST(DevicePath, StoreLargerThanOneStagingBufferRunsInRounds) {
  HSS_REQUIRE_DEVICE();
  Config c = make_config(StorageDType::kFloat32, 0.125);
  c.chunk_size = 256;
  Stores s(c);
  const int64_t rows = 10 * 256, cols = 8192;  // 80 MiB of float32 > one 64 MiB staging buffer
  const auto tokens = make_tokens(rows, 9);
  const auto host = make_rows(DType::kFloat32, rows, cols, 10);
  DeviceBytes dev(host.size());
  ASSERT_NE(dev.ptr, nullptr);
  ASSERT_NO_FATAL_FAILURE(test::upload(dev, host.data(), host.size()));
  EXPECT_EQ(
      s.device
          ->store_hidden_states(tokens, {dev.ptr, DType::kFloat32, rows, cols, 0, Device::kCuda, 0})
          .cached,
      10);
  const auto got = s.device->retrieve_hidden_states(tokens);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->rows(), rows);
  EXPECT_EQ(std::memcmp(got->data(), host.data(), host.size()), 0);
}

TEST(DevicePath, BadDeviceIndexIsInvalidArgumentAndWritesNothing) {
  HSS_REQUIRE_DEVICE();
  Stores s(make_config(StorageDType::kFloat32));
  const auto tokens = make_tokens(kChunk, 11);
  DeviceBytes dev(static_cast<size_t>(kChunk * 8 * 4));
  EXPECT_THROW(s.device->store_hidden_states(
                   tokens, {dev.ptr, DType::kFloat32, kChunk, 8, 0, Device::kCuda, 9999}),
               InvalidArgument);
  EXPECT_EQ(s.device->num_cached_chunks(), 0u);
  EXPECT_FALSE(s.device->retrieve_hidden_states(tokens).has_value());
}

/// The NVTX ranges (through the trace hook) one device store of `dtype` rows emits.
std::vector<std::string> ranges_of_a_device_store(DType dtype) {
  struct Seen {
    std::mutex mutex;
    std::vector<std::string> names;
  } seen;
  trace::set_range_hook(
      [](std::string_view name, bool push, void* user) {
        auto* s = static_cast<Seen*>(user);
        if (!push) return;
        std::lock_guard lock(s->mutex);
        s->names.emplace_back(name);
      },
      &seen);
  Stores s(make_config(StorageDType::kFloat32));
  const auto tokens = make_tokens(kChunk, 12);
  DeviceBytes dev(static_cast<size_t>(kChunk * 8) * element_size(dtype));
  test::fill(dev.ptr, 0, dev.bytes);
  s.device->store_hidden_states(tokens, {dev.ptr, dtype, kChunk, 8, 0, Device::kCuda, 0});
  trace::set_range_hook(nullptr);
  std::lock_guard lock(seen.mutex);
  return seen.names;
}

bool has(const std::vector<std::string>& names, const char* name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

TEST(DevicePath, EveryDeviceStoreEmitsGatherCastAndD2hRanges) {
  HSS_REQUIRE_DEVICE();
  // Cast (bfloat16 -> float32 storage) or not (float32), a device store gathers into staging on
  // the caller's stream (store/gather_cast), then copies to the pool on a copy stream (store/d2h).
  for (const DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    const auto names = ranges_of_a_device_store(dtype);
    EXPECT_TRUE(has(names, "store/gather_cast")) << to_string(dtype);
    EXPECT_TRUE(has(names, "store/d2h")) << to_string(dtype);
  }
}

// ---------------------------------------------------------------------------------------------
// restore into device memory

struct RestoreCase {
  const char* impl;
  DType dtype;
  StorageDType storage;
  int64_t pad;  // output row padding (0: contiguous)
};

void PrintTo(const RestoreCase& c, std::ostream* os) {
  *os << c.impl << ", " << to_string(c.dtype) << " stored as " << to_string(c.storage) << ", pad "
      << c.pad;
}

class DeviceRestore : public ::testing::TestWithParam<RestoreCase> {};

TEST_P(DeviceRestore, RetrieveIntoDeviceMemoryEqualsHostRetrieve) {
  HSS_REQUIRE_DEVICE();
  const RestoreCase p = GetParam();
  ASSERT_EQ(setenv("HSS_RESTORE_IMPL", p.impl, 1), 0);  // read when the store is created
  Stores s(make_config(p.storage));
  ASSERT_EQ(unsetenv("HSS_RESTORE_IMPL"), 0);
  const int64_t rows = 7 * kChunk + 5, cols = 136;
  const auto tokens = make_tokens(rows, 13);
  const auto host = make_rows(p.dtype, rows, cols, 14);
  s.device->store_hidden_states(tokens, {host.data(), p.dtype, rows, cols});

  const int64_t row_begin = 20;  // starts inside chunk 1
  const int64_t want_rows = 7 * kChunk - row_begin;
  const int64_t out_rows = want_rows + 3, stride = cols + p.pad;
  DeviceBytes out(static_cast<size_t>(out_rows * stride) * sizeof(float));
  test::fill(out.ptr, 0xAB, out.bytes);
  StreamHolder stream;
  RetrieveOptions opt;
  opt.row_begin = row_begin;
  opt.stream = stream.stream;
  const MutableTensorView view{out.ptr, DType::kFloat32, out_rows, cols, stride, Device::kCuda, 0};
  EXPECT_EQ(s.device->retrieve_hidden_states_into(tokens, view, opt), want_rows);
  std::vector<float> got(static_cast<size_t>(out_rows * stride));
  CUDA_OK(cudaMemcpyAsync(got.data(), out.ptr, out.bytes, cudaMemcpyDeviceToHost, stream.stream));
  CUDA_OK(cudaStreamSynchronize(stream.stream));

  const auto want = s.device->retrieve_hidden_states(tokens, {0, row_begin});
  ASSERT_TRUE(want);
  ASSERT_EQ(want->rows(), want_rows);
  uint32_t untouched;
  std::memset(&untouched, 0xAB, sizeof untouched);
  for (int64_t r = 0; r < out_rows; ++r) {
    for (int64_t c = 0; c < stride; ++c) {
      const float g = got[static_cast<size_t>(r * stride + c)];
      uint32_t bits;
      std::memcpy(&bits, &g, sizeof bits);
      if (r < want_rows && c < cols) {
        uint32_t w;
        std::memcpy(&w, &want->data()[r * cols + c], sizeof w);
        ASSERT_EQ(bits, w) << "row " << r << " col " << c;
      } else {
        ASSERT_EQ(bits, untouched) << "wrote outside the prefix at row " << r << " col " << c;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Impls, DeviceRestore,
    ::testing::Values(RestoreCase{"kernel", DType::kFloat32, StorageDType::kFloat32, 0},
                      RestoreCase{"kernel", DType::kFloat32, StorageDType::kFloat32, 8},
                      RestoreCase{"kernel", DType::kBFloat16, StorageDType::kNative, 0},
                      RestoreCase{"kernel", DType::kFloat16, StorageDType::kNative, 3},
                      RestoreCase{"cub", DType::kFloat32, StorageDType::kFloat32, 0},
                      RestoreCase{"cub", DType::kBFloat16, StorageDType::kNative, 0},  // fallback
                      RestoreCase{"memcpy", DType::kFloat16, StorageDType::kFloat32, 0},
                      RestoreCase{"memcpy", DType::kFloat32, StorageDType::kFloat32, 4}),
    [](const ::testing::TestParamInfo<RestoreCase>& param_info) {
      return std::string(param_info.param.impl) + "_" +
             std::string(to_string(param_info.param.dtype)) + "_" +
             std::string(to_string(param_info.param.storage)) + "_pad" +
             std::to_string(param_info.param.pad);
    });

TEST(DevicePath, RetrieveIntoTooSmallDeviceOutputIsInvalidArgument) {
  HSS_REQUIRE_DEVICE();
  Stores s(make_config(StorageDType::kFloat32));
  const int64_t rows = 2 * kChunk, cols = 32;
  const auto tokens = make_tokens(rows, 15);
  const auto host = make_rows(DType::kFloat32, rows, cols, 16);
  s.device->store_hidden_states(tokens, {host.data(), DType::kFloat32, rows, cols});
  DeviceBytes out(static_cast<size_t>((rows - 1) * cols) * sizeof(float));
  const MutableTensorView view{out.ptr, DType::kFloat32, rows - 1, cols, 0, Device::kCuda, 0};
  EXPECT_THROW((void)s.device->retrieve_hidden_states_into(tokens, view), InvalidArgument);
}

}  // namespace
}  // namespace hss

#endif  // HSS_WITH_CUDA
