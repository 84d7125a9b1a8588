// Checked size arithmetic and the documented limits (hss/detail/checked.hpp): huge sizes are
// clean errors in Config, HostTensor, the token database and Engine, never wrapped byte counts.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "hss/detail/checked.hpp"
#include "hss/hss.hpp"
#include "hss/kernels/layout.hpp"
#include "store/store_validation.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// One set of documented limits: the store's own view checks use the same numbers.
static_assert(detail::kMaxCols == limits::kMaxCols);
static_assert(detail::kMaxRows == limits::kMaxRows);

TEST(Checked, MulAndAddReportOverflow) {
  EXPECT_EQ(detail::checked_mul(3, 7), 21);
  EXPECT_EQ(detail::checked_mul(0, kMax), 0);
  EXPECT_EQ(detail::checked_mul(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_FALSE(detail::checked_mul(int64_t{1} << 32, int64_t{1} << 31).has_value());
  EXPECT_FALSE(detail::checked_mul(-1, 5).has_value());
  EXPECT_EQ(detail::checked_add(kMax - 1, 1), kMax);
  EXPECT_FALSE(detail::checked_add(kMax, 1).has_value());
  EXPECT_FALSE(detail::checked_add(-2, 1).has_value());
  EXPECT_THROW((void)detail::mul_or_throw(kMax, 2, "x"), InvalidArgument);
}

TEST(Checked, LayoutViewFits) {
  EXPECT_TRUE(kernels::view_fits(0, 5, 0, 4));
  EXPECT_TRUE(kernels::view_fits(10, 5, 5, 4));
  EXPECT_FALSE(kernels::view_fits(int64_t{1} << 31, int64_t{1} << 24, int64_t{1} << 32, 4));
  EXPECT_FALSE(kernels::view_fits(kMax, kMax, kMax, 4));
  EXPECT_FALSE(kernels::view_fits(-1, 5, 5, 4));
}

TEST(Checked, ViewShapeRejectsOutOfEnumAndOutOfLimit) {
  EXPECT_NO_THROW(detail::check_view_shape(DType::kFloat32, Device::kHost, 4, 8, 0, "v"));
  EXPECT_THROW(detail::check_view_shape(static_cast<DType>(7), Device::kHost, 4, 8, 0, "v"),
               InvalidArgument);
  EXPECT_THROW(detail::check_view_shape(DType::kFloat32, static_cast<Device>(9), 4, 8, 0, "v"),
               InvalidArgument);
  EXPECT_THROW(
      detail::check_view_shape(DType::kFloat32, Device::kHost, 4, limits::kMaxCols + 1, 0, "v"),
      InvalidArgument);
  EXPECT_THROW(
      detail::check_view_shape(DType::kFloat32, Device::kHost, limits::kMaxRows + 1, 8, 0, "v"),
      InvalidArgument);
  EXPECT_THROW(detail::check_view_shape(DType::kFloat32, Device::kHost, 4, 8, 7, "v"),
               InvalidArgument);
  EXPECT_THROW(
      (void)detail::view_span_bytes(DType::kFloat32, limits::kMaxRows, 8, limits::kMaxRowStride),
      InvalidArgument);
  EXPECT_EQ(detail::view_span_bytes(DType::kBFloat16, 3, 4, 10), (2 * 10 + 4) * 2);
}

// The store's one-expression accept (store_validation.cpp) and the naming checks behind it
// (check_view_shape, view_span_bytes) share checked.hpp's limits: at each boundary, for every
// dtype, check_view accepts exactly what view_span_bytes accepts, and the span is the exact
// byte count. The data pointer is never read.
TEST(Checked, EveryViewCheckAcceptsExactlyTheDocumentedLimits) {
  std::vector<float> one(1);
  for (const DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const auto esize = static_cast<int64_t>(element_size(dtype));
    const int64_t max_elems = limits::kMaxViewBytes / esize;
    // kMaxCols columns and as many rows as fit exactly: 2^48 bytes, contiguous.
    const int64_t cols = limits::kMaxCols;
    const int64_t rows = max_elems / cols;
    ASSERT_EQ(rows * cols, max_elems);
    ASSERT_LE(rows, limits::kMaxRows);
    const int64_t stride = limits::kMaxRowStride;
    struct Case {
      int64_t rows, cols, row_stride;
    };
    const Case cases[] = {
        {rows, cols, 0},               // exactly 2^48 bytes
        {rows + 1, cols, 0},           // one row more
        {rows, cols - 1, cols},        // one element less, strided
        {rows, cols, cols + 1},        // rows - 1 elements more, strided
        {rows, 1, cols},               // the last row of one element
        {2, 8, stride},                // the stride limit
        {2, 8, stride + 1},            // one beyond
        {limits::kMaxRows, 8, 0},      // the row limit, contiguous
        {limits::kMaxRows + 1, 8, 0},  // one row beyond
        {1, limits::kMaxCols, 0},      // the column limit
        {1, limits::kMaxCols + 1, 0},  // one column beyond
        {2, 8, 7},                     // stride below cols
        {0, 8, 0},                     // no rows: no span
        {-1, 8, 0},                    // negative rows
        {1, 0, 0},                     // no columns
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << to_string(dtype) << " rows=" << c.rows
                                        << " cols=" << c.cols << " stride=" << c.row_stride);
      const TensorView view{one.data(), dtype, c.rows, c.cols, c.row_stride};
      std::optional<int64_t> span;
      try {
        span = detail::view_span_bytes(dtype, c.rows, c.cols, c.row_stride, "v");
      } catch (const InvalidArgument&) {
      }
      bool accepted = true;
      try {
        detail::check_view(view, "v", false);
      } catch (const InvalidArgument&) {
        accepted = false;
      }
      EXPECT_EQ(accepted, span.has_value());
      const bool within =
          c.rows >= 0 && c.rows <= limits::kMaxRows && c.cols > 0 && c.cols <= limits::kMaxCols &&
          (c.row_stride == 0 || (c.row_stride >= c.cols && c.row_stride <= limits::kMaxRowStride));
      if (!within) {
        EXPECT_FALSE(accepted);
        continue;
      }
      const long double elems =
          c.rows == 0
              ? 0.0L
              : static_cast<long double>(c.rows - 1) *
                        static_cast<long double>(c.row_stride == 0 ? c.cols : c.row_stride) +
                    static_cast<long double>(c.cols);
      const long double bytes = elems * static_cast<long double>(esize);
      EXPECT_EQ(accepted, bytes <= static_cast<long double>(limits::kMaxViewBytes));
      if (span) {
        EXPECT_EQ(static_cast<long double>(*span), bytes);
      }
    }
  }
}

TEST(Checked, HostTensorRejectsSizesBeyondTheLimits) {
  EXPECT_THROW(HostTensor(kMax, kMax), InvalidArgument);
  EXPECT_THROW(HostTensor(int64_t{1} << 40, 1), InvalidArgument);
  EXPECT_THROW(HostTensor(1, limits::kMaxCols + 1), InvalidArgument);
  EXPECT_THROW(HostTensor(-1, 4), InvalidArgument);
  const HostTensor t(3, 5);
  EXPECT_EQ(t.bytes(), 60u);
}

TEST(Checked, ConfigRejectsHugeChunkSizeCleanly) {
  try {
    (void)Config::from_yaml("chunk_size: 4611686018427387904\n");
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("chunk_size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4611686018427387904"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW((void)Config::from_yaml("chunk_size: 1048576\n"));
  EXPECT_THROW((void)Config::from_yaml("chunk_size: 1048577\n"), ConfigError);
  Config c;
  c.hidden_state_block_bytes = int64_t{1} << 40;
  EXPECT_THROW(c.validate(), ConfigError);
  EXPECT_THROW(ChunkedTokenDatabase(int64_t{1} << 62, false), InvalidArgument);
}

Config kv_config() {
  Config c;
  c.chunk_size = 16;
  c.max_local_cpu_size = 16.0 * 16 * 8 * 2 / (1ULL << 30);
  return c;
}

TEST(Checked, EngineRejectsBadKvViewsAndChangesNothing) {
  auto engine = Engine::create(kv_config());
  const auto tokens = test::make_tokens(32, 3);
  std::vector<uint16_t> kv(32 * 8, 1);
  TensorView view = test::view_of(kv, 8, DType::kBFloat16);
  TensorView bad = view;
  bad.dtype = static_cast<DType>(42);
  EXPECT_THROW((void)engine->store(tokens, bad), InvalidArgument);
  bad = view;
  bad.device = static_cast<Device>(5);
  EXPECT_THROW((void)engine->store(tokens, bad), InvalidArgument);
  bad = view;
  bad.cols = kMax;
  bad.row_stride = kMax;
  EXPECT_THROW((void)engine->store(tokens, bad), InvalidArgument);
  bad = view;
  bad.cols = limits::kMaxCols + 1;
  EXPECT_THROW((void)engine->store(tokens, bad), InvalidArgument);
  EXPECT_EQ(engine->kv_backend().stats().chunks_held, 0u);
  EXPECT_EQ(engine->store(tokens, view), 2);
}

// Engine::retrieve's header: kv_out needs rows >= the cached prefix, no more.
TEST(Checked, EngineRetrieveIntoExactlyThePrefix) {
  auto engine = Engine::create(kv_config());
  const auto tokens = test::make_tokens(64, 4);
  std::vector<uint16_t> kv(32 * 8);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<uint16_t>(i);
  const std::span<const int32_t> first_two(tokens.data(), 32);
  ASSERT_EQ(engine->store(first_two, test::view_of(kv, 8, DType::kBFloat16)), 2);
  std::vector<uint16_t> out(32 * 8, 0);
  MutableTensorView view{out.data(), DType::kBFloat16, 32, 8, 0, Device::kHost, 0};
  EXPECT_EQ(engine->retrieve(tokens, view), 32);  // 4 chunks asked, 2 cached, 32 rows given
  EXPECT_EQ(out, kv);
  // Fewer rows than the prefix: an error before anything is written.
  std::vector<uint16_t> small(16 * 8, 7);
  MutableTensorView small_view{small.data(), DType::kBFloat16, 16, 8, 0, Device::kHost, 0};
  EXPECT_THROW((void)engine->retrieve(tokens, small_view), InvalidArgument);
  EXPECT_EQ(small, std::vector<uint16_t>(16 * 8, 7));
  MutableTensorView bad = view;
  bad.dtype = static_cast<DType>(3);
  EXPECT_THROW((void)engine->retrieve(tokens, bad), InvalidArgument);
}

}  // namespace
}  // namespace hss
