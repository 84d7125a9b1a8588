// Calls large enough (>= 8 MiB) to take the host path's non-temporal copy loops: strided and
// misaligned sources and destinations, every storage dtype, bit-exact.
#include <gtest/gtest.h>

#include <cstring>

#include "hss/hss.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

constexpr int64_t kChunk = 256;
constexpr int64_t kCols = 2048 + 3;  // odd width: rows start at every alignment
constexpr int64_t kRows = 5 * kChunk;

struct Case {
  DType dtype;
  StorageDType storage;
};

class LargeCopies : public ::testing::TestWithParam<Case> {};

TEST_P(LargeCopies, RoundTripIsBitExactWithStridesAndOffsets) {
  const Case c = GetParam();
  Config config = test::store_config(kChunk, kCols, 8);
  config.hidden_state_storage_dtype = c.storage;
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(config, db);

  const auto tokens = test::make_tokens(kRows, 77);
  const auto rows = test::make_rows(tokens, 0, 0, kCols);
  const int64_t stride = kCols + 5;
  // Source: strided, starting 2 bytes past a 16-byte boundary for 16-bit types.
  std::vector<uint8_t> source(static_cast<size_t>((kRows * stride + 8) * 4), 0xAB);
  const size_t esize = element_size(c.dtype);
  uint8_t* base = source.data() + (esize == 2 ? 2 : 4);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t col = 0; col < kCols; ++col) {
      const float v = rows[static_cast<size_t>(r * kCols + col)];
      uint8_t* dst = base + static_cast<size_t>((r * stride + col)) * esize;
      if (c.dtype == DType::kFloat32) {
        std::memcpy(dst, &v, 4);
      } else {
        const uint16_t h =
            c.dtype == DType::kBFloat16 ? kernels::float_to_bf16(v) : test::exact_f16(v);
        std::memcpy(dst, &h, 2);
      }
    }
  }
  const TensorView view{base, c.dtype, kRows, kCols, stride, Device::kHost, 0};
  ASSERT_EQ(store.store_hidden_states(tokens, view, {0, 0}).cached, 5);

  // Fresh tensor, tail from an odd row.
  const int64_t row_begin = 37;
  auto out = store.retrieve_hidden_states(tokens, {0, row_begin});
  ASSERT_TRUE(out);
  ASSERT_EQ(out->rows(), kRows - row_begin);
  ASSERT_EQ(0, std::memcmp(out->data(), rows.data() + row_begin * kCols, out->bytes()));

  // Caller's buffer: strided and 4 bytes off a 16-byte boundary.
  const int64_t out_stride = kCols + 1;
  std::vector<float> buffer(static_cast<size_t>(kRows * out_stride + 4), -1.0f);
  MutableTensorView into{buffer.data() + 1, DType::kFloat32, kRows, kCols,
                         out_stride,        Device::kHost,   0};
  ASSERT_EQ(store.retrieve_hidden_states_into(tokens, into), kRows);
  EXPECT_EQ(buffer[0], -1.0f);
  for (int64_t r = 0; r < kRows; ++r) {
    ASSERT_EQ(0,
              std::memcmp(buffer.data() + 1 + r * out_stride, rows.data() + r * kCols, kCols * 4))
        << "row " << r;
    ASSERT_EQ(buffer[static_cast<size_t>(1 + r * out_stride + kCols)], -1.0f)
        << "padding of row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, LargeCopies,
                         ::testing::Values(Case{DType::kFloat32, StorageDType::kFloat32},
                                           Case{DType::kBFloat16, StorageDType::kFloat32},
                                           Case{DType::kBFloat16, StorageDType::kNative},
                                           Case{DType::kFloat16, StorageDType::kFloat32},
                                           Case{DType::kFloat16, StorageDType::kNative}));

}  // namespace
}  // namespace hss
