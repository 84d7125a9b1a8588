// FP8 storage (hidden_state_storage_dtype fp8_e4m3 / fp8_e5m2) through the whole host path:
// the write planner's per-row segments, the host copy's quantiser (split over threads or not),
// the read planner and the dequantiser, the pool's capacity, and the config's rules.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "hss/hss.hpp"
#include "hss/pool_transfer.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using test::make_tokens;

constexpr int64_t kChunk = 16;

Config fp8_config(StorageDType storage, int64_t cols, int64_t chunks, int64_t block_bytes = 0) {
  Config c = test::store_config(kChunk, cols, chunks);
  c.hidden_state_storage_dtype = storage;
  c.hidden_state_block_bytes = block_bytes;
  return c;
}

/// rows x cols of normal(0, 1) values times a per-row magnitude spanning 1e-6 .. 1e6.
std::vector<float> random_rows(int64_t rows, int64_t cols, uint32_t seed) {
  return test::scaled_rows(rows, cols, seed, 6);
}

/// The stated bound: |restored - x| <= amax(row) / 28 (E4M3) or / 14 (E5M2), plus the output
/// dtype's own rounding (half an ulp: 2^-9 relative for bfloat16, 2^-12 for float16).
double bound_for(StorageDType storage) {
  return storage == StorageDType::kFp8E5M2 ? 1.0 / 14 : 1.0 / 28;
}

/// Largest |restored - x| / amax(row) over rows of `cols`; non-finite x skipped.
double worst_error(const std::vector<float>& x, const std::vector<float>& restored, int64_t cols) {
  double worst = 0.0;
  const auto rows = static_cast<int64_t>(x.size()) / cols;
  for (int64_t r = 0; r < rows; ++r) {
    double amax = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[static_cast<size_t>(r * cols + c)];
      if (std::isfinite(v)) amax = std::max(amax, static_cast<double>(std::fabs(v)));
    }
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<size_t>(r * cols + c);
      if (!std::isfinite(x[i])) continue;
      const double err = std::fabs(static_cast<double>(restored[i]) - x[i]);
      worst = std::max(worst, amax > 0 ? err / amax : err);
    }
  }
  return worst;
}

std::vector<float> widen(const std::vector<uint16_t>& h, DType dtype) {
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    out[i] = dtype == DType::kBFloat16 ? kernels::bf16_to_float(h[i]) : kernels::f16_to_float(h[i]);
  }
  return out;
}

// ---- Round trips: storage x granule (0 = automatic; 64 and 192 split rows over granules).

class Fp8RoundTrip : public ::testing::TestWithParam<std::tuple<StorageDType, int64_t>> {};

TEST_P(Fp8RoundTrip, Float32OutputIsWithinTheBound) {
  const auto [storage, block] = GetParam();
  constexpr int64_t kCols = 200;
  const ChunkedTokenDatabase db_store(kChunk, false);
  HiddenStateStore store(fp8_config(storage, kCols, 64, block), db_store);
  const auto tokens = make_tokens(4 * kChunk, 1);
  const auto x = random_rows(4 * kChunk, kCols, 1);
  ASSERT_EQ(store.store_hidden_states(tokens, test::view_of(x, kCols)).cached, 4);
  auto out = store.retrieve_hidden_states(tokens);
  ASSERT_TRUE(out.has_value());
  ASSERT_EQ(out->rows(), 4 * kChunk);
  std::vector<float> back(x.size());
  std::memcpy(back.data(), out->data(), out->bytes());
  const double worst = worst_error(x, back, kCols);
  EXPECT_LE(worst, bound_for(storage) * (1 + 1e-5));
  EXPECT_GT(worst, bound_for(storage) / 8);  // lossy as stated, not silently lossless
}

TEST_P(Fp8RoundTrip, SixteenBitOutputsAddOnlyTheirOwnRounding) {
  const auto [storage, block] = GetParam();
  constexpr int64_t kCols = 96;
  const ChunkedTokenDatabase db_store(kChunk, false);
  HiddenStateStore store(fp8_config(storage, kCols, 64, block), db_store);
  const auto tokens = make_tokens(2 * kChunk, 2);
  const auto x = random_rows(2 * kChunk, kCols, 2);
  ASSERT_EQ(store.store_hidden_states(tokens, test::view_of(x, kCols)).cached, 2);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<uint16_t> out(x.size());
    const MutableTensorView view{out.data(), dtype, 2 * kChunk, kCols, 0, Device::kHost, 0};
    ASSERT_EQ(store.retrieve_hidden_states_into(tokens, view), 2 * kChunk);
    std::vector<float> finite_x = x;
    std::vector<float> back = widen(out, dtype);
    // float16 holds neither the rows of magnitude 1e5 (beyond 65504) nor those of 1e-6 (its
    // subnormals): compare the rows whose values it holds as normal numbers.
    if (dtype == DType::kFloat16) {
      for (int64_t r = 0; r < 2 * kChunk; ++r) {
        float amax = 0.0f;
        for (int64_t c = 0; c < kCols; ++c)
          amax = std::max(amax, std::fabs(x[static_cast<size_t>(r * kCols + c)]));
        if (amax > 1e4f || amax < 1e-2f) {
          for (int64_t c = 0; c < kCols; ++c) finite_x[static_cast<size_t>(r * kCols + c)] = NAN;
        }
      }
    }
    // Half an ulp of the output, relative: 2^-8 (bfloat16), 2^-11 (float16).
    const double own = dtype == DType::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    EXPECT_LE(worst_error(finite_x, back, kCols), bound_for(storage) * (1 + own) + own)
        << to_string(dtype);
  }
}

TEST_P(Fp8RoundTrip, SixteenBitAndStridedSourcesQuantiseTheSameValues) {
  const auto [storage, block] = GetParam();
  constexpr int64_t kCols = 64;
  const ChunkedTokenDatabase db_store(kChunk, false);
  HiddenStateStore store(fp8_config(storage, kCols, 64, block), db_store);
  const auto tokens = make_tokens(2 * kChunk, 3);
  const auto x = test::to_bf16(random_rows(2 * kChunk, kCols, 3));
  const std::vector<float> xf = widen(x, DType::kBFloat16);
  // The same rows again as float32 inside a wider buffer (row_stride 80).
  std::vector<float> strided(static_cast<size_t>(2 * kChunk * 80), 7.0f);
  for (int64_t r = 0; r < 2 * kChunk; ++r) {
    std::memcpy(&strided[static_cast<size_t>(r * 80)], &xf[static_cast<size_t>(r * kCols)],
                kCols * sizeof(float));
  }
  ASSERT_EQ(
      store.store_hidden_states(tokens, test::view_of(x, kCols, DType::kBFloat16), {0, 0}).cached,
      2);
  const TensorView strided_view{
      strided.data(), DType::kFloat32, 2 * kChunk, kCols, 80, Device::kHost, 0};
  ASSERT_EQ(store.store_hidden_states(tokens, strided_view, {1, 0}).cached, 2);
  auto a = store.retrieve_hidden_states(tokens, {0, 0});
  auto b = store.retrieve_hidden_states(tokens, {1, 0});
  ASSERT_TRUE(a && b);
  EXPECT_EQ(0, std::memcmp(a->data(), b->data(), a->bytes()));  // same values, same codes
}

INSTANTIATE_TEST_SUITE_P(
    Storage, Fp8RoundTrip,
    ::testing::Combine(::testing::Values(StorageDType::kFp8E4M3, StorageDType::kFp8E5M2),
                       ::testing::Values(int64_t{0}, int64_t{64}, int64_t{192})),
    [](const auto& param_info) {
      return std::string(to_string(std::get<0>(param_info.param)) == "fp8_e4m3" ? "E4M3" : "E5M2") +
             "_granule" + std::to_string(std::get<1>(param_info.param));
    });

// ---- Exact values.

TEST(Fp8Store, ExactlyRepresentableRowsRestoreExactly) {
  constexpr int64_t kCols = 8;
  const ChunkedTokenDatabase db_store(kChunk, false);
  HiddenStateStore store(fp8_config(StorageDType::kFp8E4M3, kCols, 8), db_store);
  const auto tokens = make_tokens(kChunk, 4);
  std::vector<float> x(static_cast<size_t>(kChunk * kCols));
  // Row r: amax 448 * 2^r's codes times 2^r: every value is a code times the row's scale 2^r.
  for (int64_t r = 0; r < kChunk; ++r) {
    const float s = std::ldexp(1.0f, static_cast<int>(r) - 8);
    const float vals[kCols] = {448, -448, 1, -2, 0.5f, 0, 13, -0.015625f};
    for (int64_t c = 0; c < kCols; ++c) x[static_cast<size_t>(r * kCols + c)] = vals[c] * s;
  }
  ASSERT_EQ(store.store_hidden_states(tokens, test::view_of(x, kCols)).cached, 1);
  auto out = store.retrieve_hidden_states(tokens);
  ASSERT_TRUE(out);
  EXPECT_EQ(0, std::memcmp(out->data(), x.data(), out->bytes()));
}

TEST(Fp8Store, ZeroRowsRestoreAsZeros) {
  constexpr int64_t kCols = 48;
  const ChunkedTokenDatabase db_store(kChunk, false);
  HiddenStateStore store(fp8_config(StorageDType::kFp8E5M2, kCols, 8), db_store);
  const auto tokens = make_tokens(kChunk, 5);
  std::vector<float> x(static_cast<size_t>(kChunk * kCols), 0.0f);
  x[static_cast<size_t>(3 * kCols + 1)] = -0.0f;
  ASSERT_EQ(store.store_hidden_states(tokens, test::view_of(x, kCols)).cached, 1);
  auto out = store.retrieve_hidden_states(tokens);
  ASSERT_TRUE(out);
  const auto* back = static_cast<const float*>(out->data());
  for (int64_t i = 0; i < kChunk * kCols; ++i) ASSERT_EQ(back[i], 0.0f) << i;
  EXPECT_TRUE(std::signbit(back[3 * kCols + 1]));  // -0 keeps its sign
}

TEST(Fp8Store, NonFiniteInputIsKeptNotSpreadAcrossTheRow) {
  // Defined behaviour (the store does not check finiteness for any dtype): NaN stays NaN;
  // infinity stays infinity in E5M2 and becomes NaN in E4M3, which has none; the rest of the
  // row is quantised against the amax of its finite elements, within the usual bound.
  constexpr int64_t kCols = 32;
  for (StorageDType storage : {StorageDType::kFp8E4M3, StorageDType::kFp8E5M2}) {
    const ChunkedTokenDatabase db_store(kChunk, false);
    HiddenStateStore store(fp8_config(storage, kCols, 8), db_store);
    const auto tokens = make_tokens(kChunk, 6);
    auto x = random_rows(kChunk, kCols, 6);
    x[0] = std::numeric_limits<float>::quiet_NaN();
    x[1] = std::numeric_limits<float>::infinity();
    x[2] = -std::numeric_limits<float>::infinity();
    ASSERT_EQ(store.store_hidden_states(tokens, test::view_of(x, kCols)).cached, 1);
    auto out = store.retrieve_hidden_states(tokens);
    ASSERT_TRUE(out);
    std::vector<float> back(x.size());
    std::memcpy(back.data(), out->data(), out->bytes());
    EXPECT_TRUE(std::isnan(back[0]));
    if (storage == StorageDType::kFp8E5M2) {
      EXPECT_EQ(back[1], std::numeric_limits<float>::infinity());
      EXPECT_EQ(back[2], -std::numeric_limits<float>::infinity());
    } else {
      EXPECT_TRUE(std::isnan(back[1]));
      EXPECT_TRUE(std::isnan(back[2]));
    }
    for (size_t i = 3; i < back.size(); ++i) ASSERT_TRUE(std::isfinite(back[i])) << i;
    EXPECT_LE(worst_error(x, back, kCols), bound_for(storage) * (1 + 1e-5));
  }
}

TEST(Fp8Store, RowBeginRestoresTheTailWithItsRowsScales) {
  constexpr int64_t kCols = 40;
  const ChunkedTokenDatabase db_store(kChunk, false);
  HiddenStateStore store(fp8_config(StorageDType::kFp8E4M3, kCols, 8, 64), db_store);
  const auto tokens = make_tokens(3 * kChunk, 7);
  const auto x = random_rows(3 * kChunk, kCols, 7);
  ASSERT_EQ(store.store_hidden_states(tokens, test::view_of(x, kCols)).cached, 3);
  auto full = store.retrieve_hidden_states(tokens);
  RetrieveOptions from21;
  from21.row_begin = 21;
  auto tail = store.retrieve_hidden_states(tokens, from21);
  ASSERT_TRUE(full && tail);
  ASSERT_EQ(tail->rows(), 3 * kChunk - 21);
  EXPECT_EQ(0, std::memcmp(tail->data(), static_cast<const float*>(full->data()) + 21 * kCols,
                           tail->bytes()));
}

TEST(Fp8Store, CopySplitOverThreadsWritesTheSameCodes) {
  constexpr int64_t kCols = 1000;
  Config one = fp8_config(StorageDType::kFp8E4M3, kCols, 16, 4096);
  one.tuning.copy_threads = 1;
  Config four = one;
  four.tuning.copy_threads = 4;
  four.tuning.copy_split_bytes = 4096;  // split every call of 8 KiB and more
  const ChunkedTokenDatabase db_a(kChunk, false);
  HiddenStateStore a(one, db_a);
  const ChunkedTokenDatabase db_b(kChunk, false);
  HiddenStateStore b(four, db_b);
  const auto tokens = make_tokens(4 * kChunk, 8);
  const auto x = random_rows(4 * kChunk, kCols, 8);
  ASSERT_EQ(a.store_hidden_states(tokens, test::view_of(x, kCols)).cached, 4);
  ASSERT_EQ(b.store_hidden_states(tokens, test::view_of(x, kCols)).cached, 4);
  auto ra = a.retrieve_hidden_states(tokens);
  auto rb = b.retrieve_hidden_states(tokens);
  ASSERT_TRUE(ra && rb);
  EXPECT_GT(b.stats().host_copy.split_copies, 0u);
  EXPECT_EQ(0, std::memcmp(ra->data(), rb->data(), ra->bytes()));
  EXPECT_LE(worst_error(x,
                        std::vector<float>(static_cast<const float*>(rb->data()),
                                           static_cast<const float*>(rb->data()) + x.size()),
                        kCols),
            1.0 / 28 * (1 + 1e-5));
}

// ---- Capacity.

/// Chunks of 256 x 4096 a 64 MiB pool holds when filled with `storage` entries of bf16 input.
size_t chunks_held(StorageDType storage) {
  constexpr int64_t kRows = 256, kCols = 4096;
  Config c;
  c.chunk_size = kRows;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = 64.0 / 1024.0;  // 64 MiB
  c.hidden_state_storage_dtype = storage;
  const ChunkedTokenDatabase db_store(kRows, false);
  HiddenStateStore store(c, db_store);
  const auto rows = test::to_bf16(random_rows(kRows, kCols, 9));
  const TensorView view = test::view_of(rows, kCols, DType::kBFloat16);
  for (uint64_t seed = 0; seed < 80; ++seed) {  // more than either fits: the LRU evicts
    (void)store.store_hidden_states(make_tokens(kRows, 1000 + seed), view);
  }
  return store.num_cached_chunks();
}

TEST(Fp8Store, ThePoolHoldsAtLeast1Point9TimesTheChunksOfBFloat16) {
  const size_t bf16 = chunks_held(StorageDType::kNative);
  const size_t e4m3 = chunks_held(StorageDType::kFp8E4M3);
  const size_t e5m2 = chunks_held(StorageDType::kFp8E5M2);
  EXPECT_EQ(bf16, 32u);  // 2 MiB a chunk: 32 granules of 64 KiB
  EXPECT_EQ(e4m3, 63u);  // 1 MiB + 1 KiB a chunk: 65 granules of 16 KiB (FP8's automatic granule)
  EXPECT_GE(static_cast<double>(e4m3) / static_cast<double>(bf16), 1.9) << e4m3 << " vs " << bf16;
  EXPECT_EQ(e5m2, e4m3);
}

TEST(Fp8Store, BytesHeldCountTheScales) {
  constexpr int64_t kCols = 100;
  const ChunkedTokenDatabase db_store(kChunk, false);
  HiddenStateStore store(fp8_config(StorageDType::kFp8E4M3, kCols, 8), db_store);
  const auto x = random_rows(kChunk, kCols, 10);
  ASSERT_EQ(store.store_hidden_states(make_tokens(kChunk, 10), test::view_of(x, kCols)).cached, 1);
  EXPECT_EQ(store.stats().bytes_held, 1600u + 4u * kChunk);  // 1600 codes (16-aligned) + scales
}

// ---- Config.

TEST(Fp8Config, ParsesPrintsAndRoundTripsTheNames) {
  const Config c = Config::from_yaml(
      "enable_hidden_state_cache: true\nmax_hidden_state_cpu_size: 0.01\n"
      "hidden_state_storage_dtype: fp8_e5m2\n");
  EXPECT_EQ(c.hidden_state_storage_dtype, StorageDType::kFp8E5M2);
  EXPECT_EQ(to_string(StorageDType::kFp8E4M3), "fp8_e4m3");
  EXPECT_EQ(Config::from_yaml(c.to_yaml()).hidden_state_storage_dtype, StorageDType::kFp8E5M2);
  EXPECT_EQ(std::get<std::string>(c.value("hidden_state_storage_dtype")), "fp8_e5m2");
  EXPECT_EQ(Config().hidden_state_storage_dtype, StorageDType::kFloat32);  // lossless default
  EXPECT_THROW((void)Config::from_yaml("hidden_state_storage_dtype: fp8\n"), ConfigError);
}

TEST(Fp8Config, BackingTiersAndTransferAreAccepted) {
  // FP8 rows travel with their scales (wire codes 3 and 4): the disk and remote tiers and P/D
  // transfer take them (tests/tiers/test_fp8_tiers.cpp, tests/transfer/test_fp8_transfer.cpp).
  const std::string base =
      "enable_hidden_state_cache: true\nmax_hidden_state_cpu_size: 0.01\n"
      "hidden_state_storage_dtype: fp8_e4m3\n";
  for (const std::string extra :
       {"local_disk: /tmp/hss-fp8-test\n", "hidden_state_remote_url: redis://127.0.0.1:1\n",
        "hidden_state_transfer: nixl\n"}) {
    const Config c = Config::from_yaml(base + extra);
    EXPECT_EQ(c.hidden_state_storage_dtype, StorageDType::kFp8E4M3) << extra;
  }
}

}  // namespace
}  // namespace hss
