// FP8 storage on the device path, on a GPU (label gpu) and on the CUDA runtime model (label
// gpu-model). The twin checks: one store takes host tensors (the host path quantises), another
// the same rows as device tensors (the kernels quantise); the pool bytes of every entry, codes
// and scales, are the same (read through a P/D export's extents), for every source dtype, both
// FP8 formats, both store implementations, single calls and batches, odd widths, strided rows,
// and rows whose scale is subnormal. Restores from the device into float32, bfloat16 and float16
// outputs equal the host path's bit for bit and lie within the documented bound. And the
// capacity figure: an FP8 pool holds at least 1.9x the tokens of a bfloat16 one, scales included.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/pool_transfer.hpp"
#include "hss/token_database.hpp"

#if !HSS_WITH_CUDA

TEST(DeviceFp8, RequiresACudaBuild) {
  GTEST_SKIP() << "built without CUDA (HSS_ENABLE_CUDA=OFF): " << hss::runtime_info().reason;
}

#else

namespace hss {
namespace {

using namespace std::chrono_literals;
using test::DeviceBytes;
using test::StreamHolder;

constexpr StorageDType kFp8[] = {StorageDType::kFp8E4M3, StorageDType::kFp8E5M2};
constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

/// rows x cols float32 values, a magnitude per row (scaled_rows: 1e-3 .. 1e3), and rows at the
/// edges of the FP8 bound's domains: amax near 2^-139 (a subnormal scale), amax just under and
/// at 448 x 2^-126 (the edge of E4M3's normal-scale domain), a zero row, a row with an infinity
/// and a NaN among finite values.
std::vector<float> fp8_rows(int64_t rows, int64_t cols, uint32_t seed) {
  auto x = test::scaled_rows(rows, cols, seed, 3);
  const float edge = 448.0f * std::ldexp(1.0f, -126);
  const float row_amax[] = {std::ldexp(1.3f, -139), edge * 0.999f, edge};
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * cols;
    const int64_t kind = r % 7;
    if (kind < 3) {  // rescale the row so that its amax is row_amax[kind]
      float amax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
      for (int64_t c = 0; c < cols; ++c) row[c] = row[c] / amax * row_amax[kind];
    } else if (kind == 3) {
      std::fill(row, row + cols, 0.0f);
    } else if (kind == 4 && cols > 2) {
      row[0] = std::numeric_limits<float>::infinity();
      row[cols - 1] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  return x;
}

/// A tensor held twice, on the host and in device memory: `dtype` values of `values` with
/// `stride` elements per row (0x5a bytes in the gaps).
struct Rows {
  std::vector<unsigned char> host;
  std::unique_ptr<DeviceBytes> device;
  DType dtype;
  int64_t rows, cols, stride;

  Rows(const std::vector<float>& values, DType d, int64_t r, int64_t c, int64_t s)
      : dtype(d), rows(r), cols(c), stride(s) {
    const size_t esize = element_size(d);
    host.assign(static_cast<size_t>(r * s) * esize, 0x5a);
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < c; ++j) {
        test::write_as(d, values[static_cast<size_t>(i * c + j)],
                       host.data() + static_cast<size_t>(i * s + j) * esize);
      }
    }
    device = std::make_unique<DeviceBytes>(host.size());
    test::upload(*device, host.data(), host.size());
  }
  [[nodiscard]] TensorView view(Device where) const {
    return {where == Device::kCuda ? device->ptr : host.data(), dtype, rows, cols, stride, where,
            0};
  }
  /// Element (i, j) widened to float32: the value the store was given.
  [[nodiscard]] float at(int64_t i, int64_t j) const {
    const unsigned char* p = host.data() + static_cast<size_t>(i * stride + j) * element_size(dtype);
    if (dtype == DType::kFloat32) {
      float f = 0.0f;
      std::memcpy(&f, p, 4);
      return f;
    }
    uint16_t h = 0;
    std::memcpy(&h, p, 2);
    return dtype == DType::kBFloat16 ? kernels::bf16_to_float(h) : kernels::f16_to_float(h);
  }
};

/// A store bound to a KV that holds every chunk, and its pool transfer (whose exports show the
/// pool bytes of an entry).
struct Side {
  Side(const Config& config, const ChunkedTokenDatabase& db) : store(config, db), transfer(store) {
    store.bind_storage_manager(&kv);
  }
  test::ControlledKv kv;
  HiddenStateStore store;
  PoolTransfer transfer;
};

Config fp8_config(StorageDType storage, int64_t chunk, int64_t cols, StoreImpl impl) {
  Config c = test::store_config(chunk, cols, 64);
  c.tuning.staging_bytes = int64_t{64} << 20;
  c.hidden_state_storage_dtype = storage;
  c.tuning.store_impl = impl;
  return c;
}

/// Every entry's pool bytes (codes, then the scale block) for `tokens`, layer 0, through an
/// export's extents.
std::vector<std::vector<unsigned char>> pool_bytes(Side& side,
                                                   const ChunkedTokenDatabase& db,
                                                   const std::vector<int32_t>& tokens) {
  const auto chunks = db.process_tokens(tokens);
  const Slot slots[] = {{ActivationKind::kHidden, 0}};
  const ChunkExport ex = side.transfer.export_chunks(chunks, slots, 0, 5s);
  std::vector<std::vector<unsigned char>> out;
  for (const ExportedEntry& e : ex.entries) {
    std::vector<unsigned char> bytes;
    for (const Extent& x : e.extents) {
      const auto* p = reinterpret_cast<const unsigned char*>(x.addr);
      bytes.insert(bytes.end(), p, p + x.bytes);
    }
    out.push_back(std::move(bytes));
  }
  (void)side.transfer.release_lease(ex.lease_id);
  return out;
}

struct TwinCase {
  StorageDType storage;
  DType in;
  int64_t chunk, cols, chunks, pad;
  StoreImpl impl;
  bool batch;
};

std::string describe(const TwinCase& c) {
  return std::string(to_string(c.storage)) + " from " + std::string(to_string(c.in)) + " chunk " +
         std::to_string(c.chunk) + " cols " + std::to_string(c.cols) + " x" +
         std::to_string(c.chunks) + " pad " + std::to_string(c.pad) + " " +
         std::string(to_string(c.impl)) + (c.batch ? " batch" : " single");
}

void expect_same_pool_bytes(const TwinCase& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  const Config config = fp8_config(c.storage, c.chunk, c.cols, c.impl);
  ChunkedTokenDatabase db(c.chunk, false);
  Side device(config, db), host(config, db);
  ASSERT_TRUE(device.store.stats().device_path);
  const int64_t n = c.chunks * c.chunk;
  const auto tokens = test::make_tokens(n, seed);
  const Rows rows(fp8_rows(n, c.cols, seed), c.in, n, c.cols, c.cols + c.pad);
  StreamHolder s;
  const StoreOptions on_device{0, 0, ActivationKind::kHidden, s.stream};
  const StoreOptions on_host{0, 0, ActivationKind::kHidden, nullptr};
  if (c.batch) {
    const StoreItem d_items[] = {{tokens, rows.view(Device::kCuda), on_device}};
    const StoreItem h_items[] = {{tokens, rows.view(Device::kHost), on_host}};
    EXPECT_EQ(device.store.store_batch(d_items), host.store.store_batch(h_items));
  } else {
    EXPECT_EQ(device.store.store_hidden_states(tokens, rows.view(Device::kCuda), on_device),
              host.store.store_hidden_states(tokens, rows.view(Device::kHost), on_host));
  }
  const auto from_device = pool_bytes(device, db, tokens);
  const auto from_host = pool_bytes(host, db, tokens);
  ASSERT_EQ(from_device.size(), static_cast<size_t>(c.chunks));
  ASSERT_EQ(from_host.size(), from_device.size());
  for (size_t e = 0; e < from_host.size(); ++e) {
    ASSERT_EQ(from_device[e].size(), from_host[e].size()) << e;
    EXPECT_TRUE(from_device[e] == from_host[e]) << "entry " << e;
  }
  EXPECT_EQ(device.store.stats().copy_failures, 0u);
}

TEST(DeviceFp8, PoolBytesAreTheSameWhicheverPathStoredTheRows) {
  HSS_REQUIRE_DEVICE();
  uint32_t seed = 500;
  for (const StorageDType storage : kFp8) {
    for (const DType in : kDTypes) {
      for (const StoreImpl impl : {StoreImpl::kStaging, StoreImpl::kMapped}) {
        for (const bool batch : {false, true}) {
          for (const int64_t cols : {int64_t{1}, int64_t{7}, int64_t{130}, int64_t{2051}}) {
            const TwinCase c{storage, in, 16, cols, 2, cols % 2 == 0 ? 3 : 0, impl, batch};
            expect_same_pool_bytes(c, ++seed);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(DeviceFp8, RowsLongerThanATileSplitAcrossTilesKeepOneScale) {
  HSS_REQUIRE_DEVICE();
  // 20000 float32 columns: a row is two tiles of 4096 elements and more (a scaled entry's row
  // is cut by granule too), each tile finds the whole row's amax, one writes the scale.
  for (const StoreImpl impl : {StoreImpl::kStaging, StoreImpl::kMapped}) {
    expect_same_pool_bytes({StorageDType::kFp8E4M3, DType::kFloat32, 4, 20000, 2, 0, impl, false},
                           77);
  }
}

/// Restores layer 0 of `tokens` from `store` into a `dtype` output in device memory (on
/// `stream`) or in host memory (stream null), returning its bytes.
std::vector<unsigned char> restore_as(HiddenStateStore& store, const std::vector<int32_t>& tokens,
                                      int64_t cols, DType dtype, cudaStream_t stream) {
  const auto rows = static_cast<int64_t>(tokens.size());
  const size_t bytes = static_cast<size_t>(rows * cols) * element_size(dtype);
  RetrieveOptions ro;
  ro.stream = stream;
  if (stream == nullptr) {
    std::vector<unsigned char> out(bytes, 0x5a);
    const MutableTensorView view{out.data(), dtype, rows, cols, cols, Device::kHost, 0};
    EXPECT_EQ(store.retrieve_hidden_states_into(tokens, view, ro), rows);
    return out;
  }
  DeviceBytes out(bytes);
  test::fill(out.ptr, 0x5a, bytes);
  const MutableTensorView view{out.ptr, dtype, rows, cols, cols, Device::kCuda, 0};
  EXPECT_EQ(store.retrieve_hidden_states_into(tokens, view, ro), rows);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return test::download(out.ptr, bytes);
}

TEST(DeviceFp8, DeviceRestoresIntoEveryOutputDTypeEqualTheHostPathAndKeepTheBound) {
  HSS_REQUIRE_DEVICE();
  constexpr int64_t kChunk = 16, kCols = 130, kRows = 3 * kChunk;
  for (const StorageDType storage : kFp8) {
    for (const RestoreImpl impl : {RestoreImpl::kKernel, RestoreImpl::kCub}) {
      SCOPED_TRACE(std::string(to_string(storage)) + " restore " + std::string(to_string(impl)));
      Config config = fp8_config(storage, kChunk, kCols, StoreImpl::kStaging);
      config.tuning.restore_impl = impl;  // cub moves bytes: FP8 takes the kernel anyway
      ChunkedTokenDatabase db(kChunk, false);
      HiddenStateStore device(config, db), host(config, db);
      const auto tokens = test::make_tokens(kRows, 900);
      const auto values = test::scaled_rows(kRows, kCols, 901, 3);
      const Rows rows(values, DType::kFloat32, kRows, kCols, kCols);
      StreamHolder s;
      ASSERT_EQ(device.store_hidden_states(tokens, rows.view(Device::kCuda), {0, 0, {}, s.stream})
                    .cached,
                3);
      ASSERT_EQ(host.store_hidden_states(tokens, rows.view(Device::kHost)).cached, 3);

      const auto f32 = restore_as(device, tokens, kCols, DType::kFloat32, s.stream);
      EXPECT_TRUE(f32 == restore_as(host, tokens, kCols, DType::kFloat32, nullptr));
      // float32: within the bound of each row's amax (a normal scale: 1e-3 .. 1e3 rows).
      const double bound = storage == StorageDType::kFp8E4M3 ? 1.0 / 28 : 1.0 / 14;
      std::vector<float> restored(static_cast<size_t>(kRows * kCols));
      std::memcpy(restored.data(), f32.data(), f32.size());
      for (int64_t r = 0; r < kRows; ++r) {
        float amax = 0.0f;
        for (int64_t c = 0; c < kCols; ++c) amax = std::max(amax, std::fabs(rows.at(r, c)));
        for (int64_t c = 0; c < kCols; ++c) {
          const float err = std::fabs(restored[static_cast<size_t>(r * kCols + c)] - rows.at(r, c));
          ASSERT_LE(err, amax * bound * (1 + 1e-5)) << r << " " << c;
        }
      }
      // 16-bit outputs: the float32 value rounded to nearest-even, from both paths.
      for (const DType out : {DType::kBFloat16, DType::kFloat16}) {
        const auto got = restore_as(device, tokens, kCols, out, s.stream);
        EXPECT_TRUE(got == restore_as(host, tokens, kCols, out, nullptr)) << to_string(out);
        for (size_t i = 0; i < restored.size(); ++i) {
          uint16_t h = 0;
          std::memcpy(&h, got.data() + 2 * i, 2);
          const uint16_t want = out == DType::kBFloat16 ? kernels::float_to_bf16(restored[i])
                                                         : kernels::float_to_f16(restored[i]);
          ASSERT_EQ(h, want) << to_string(out) << " element " << i;
        }
      }
    }
  }
}

/// Tokens the pool holds after `prompts` single-chunk stores from device tensors of `in`, more
/// than it has room for.
int64_t tokens_held(StorageDType storage, DType in, int64_t chunk, int64_t cols, double pool_gib,
                    int prompts) {
  Config c = test::store_config(chunk, cols, 1);
  c.max_hidden_state_cpu_size = pool_gib;
  c.hidden_state_storage_dtype = storage;
  ChunkedTokenDatabase db(chunk, false);
  HiddenStateStore store(c, db);
  const Rows rows(test::scaled_rows(chunk, cols, 5, 2), in, chunk, cols, cols);
  StreamHolder s;
  for (int p = 0; p < prompts; ++p) {
    const auto tokens = test::make_tokens(chunk, 7000 + static_cast<uint64_t>(p));
    (void)store.store_hidden_states(tokens, rows.view(Device::kCuda), {0, 0, {}, s.stream});
  }
  store.flush();
  const HiddenStateStats st = store.stats();
  // Full: a store found no room (a pending entry is not evicted) or evicted to make some.
  EXPECT_GT(st.allocation_failures + st.hs_evictions, 0u) << to_string(storage);
  EXPECT_EQ(st.copy_failures, 0u);
  return static_cast<int64_t>(st.entries_held) * chunk;
}

TEST(DeviceFp8, AnFp8PoolHoldsAtLeast1Point9TimesTheTokensOfBfloat16ScalesIncluded) {
  HSS_REQUIRE_DEVICE();
  // A 256 x 4096 chunk: bfloat16 2 MiB; FP8 1 MiB of codes + 1 KiB of scales (under FP8 the
  // automatic granule is a quarter of the usual one, store_state.cpp). 40 MiB of pool; more
  // prompts than either holds, so the pool is full.
  constexpr int64_t kChunk = 256, kCols = 4096;
  constexpr double kPoolGiB = 40.0 / 1024.0;
  const int64_t bf16 = tokens_held(StorageDType::kNative, DType::kBFloat16, kChunk, kCols,
                                   kPoolGiB, 24);
  ASSERT_GT(bf16, 0);
  for (const StorageDType storage : kFp8) {
    const int64_t fp8 = tokens_held(storage, DType::kBFloat16, kChunk, kCols, kPoolGiB, 44);
    const double ratio = static_cast<double>(fp8) / static_cast<double>(bf16);
    RecordProperty(std::string("fp8_over_bf16_tokens_") + std::string(to_string(storage)),
                   std::to_string(ratio));
    EXPECT_GE(ratio, 1.9) << to_string(storage) << ": " << fp8 << " tokens against " << bf16;
  }
}

}  // namespace
}  // namespace hss

#endif  // HSS_WITH_CUDA
