// RowFormat: the byte count of every storage format, scales included (src/format/row_format.hpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "format/row_format.hpp"

namespace hss::detail {
namespace {

using kernels::ElemType;

TEST(RowFormat, UnscaledTypesAreRowsTimesColsTimesElementSize) {
  EXPECT_EQ(RowFormat::of(ElemType::kFloat32).payload_bytes(3, 5), 60u);
  EXPECT_EQ(RowFormat::of(ElemType::kBFloat16).payload_bytes(3, 5), 30u);
  EXPECT_EQ(RowFormat::of(ElemType::kFloat16).scales, ScaleLayout::kNone);
}

TEST(RowFormat, Fp8IsCodesPaddedTo16ThenAFloat32ScalePerRow) {
  for (ElemType t : {ElemType::kFp8E4M3, ElemType::kFp8E5M2}) {
    const RowFormat f = RowFormat::of(t);
    EXPECT_EQ(f.scales, ScaleLayout::kRowF32Trailing);
    EXPECT_EQ(RowFormat::scale_offset(3, 5), 16u);  // 15 code bytes, padded
    EXPECT_EQ(f.payload_bytes(3, 5), 16u + 12u);
    EXPECT_EQ(f.payload_bytes(256, 4096), (1u << 20) + 1024u);
    EXPECT_EQ(f.checked_payload_bytes(256, 4096), f.payload_bytes(256, 4096));
    EXPECT_EQ(f.payload_bytes(0, 7), 0u);
  }
}

TEST(RowFormat, Fp8TakesUnder53PercentOfBFloat16ForRealisticRows) {
  const RowFormat fp8 = RowFormat::of(ElemType::kFp8E4M3);
  const RowFormat bf16 = RowFormat::of(ElemType::kBFloat16);
  for (int64_t cols : {1024, 2048, 4096, 8192}) {
    const double ratio = static_cast<double>(bf16.payload_bytes(256, cols)) /
                         static_cast<double>(fp8.payload_bytes(256, cols));
    EXPECT_GE(ratio, 1.99) << cols;
  }
}

TEST(RowFormat, CheckedBytesRefuseOverflow) {
  const RowFormat fp8 = RowFormat::of(ElemType::kFp8E4M3);
  constexpr int64_t kBig = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_FALSE(fp8.checked_payload_bytes(kBig, 3).has_value());
  EXPECT_FALSE(fp8.checked_payload_bytes(1, std::numeric_limits<int64_t>::max()).has_value());
  EXPECT_FALSE(RowFormat::of(ElemType::kFloat32).checked_payload_bytes(kBig, 4).has_value());
}

TEST(RowFormat, AScaleNeverStraddlesAGranule) {
  // Granules are multiples of 64 bytes; the scale block starts at a multiple of 16.
  for (int64_t rows = 1; rows < 40; ++rows) {
    for (int64_t cols = 1; cols < 40; ++cols) {
      const uint64_t at = RowFormat::scale_offset(rows, cols);
      EXPECT_EQ(at % 16, 0u);
      for (int64_t r = 0; r < rows; ++r) {
        const uint64_t begin = at + 4 * static_cast<uint64_t>(r);
        EXPECT_EQ(begin / 64, (begin + 3) / 64);
      }
    }
  }
}

}  // namespace
}  // namespace hss::detail
