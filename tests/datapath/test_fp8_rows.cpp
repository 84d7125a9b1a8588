// The host path's 8-bit rows (src/datapath/host/fp8_rows.hpp) write exactly what the kernels'
// per-element rules (kernels/hss/kernels/convert.hpp) define: every code's tabulated value,
// every code dequantised against scales that overflow, underflow and round, in both the per-row
// table and the direct loop; the quantiser over a sweep of float32 bit patterns and every 16-bit
// pattern, in each instruction set this machine runs; the row scale over rows with non-finite,
// subnormal and signed-zero elements. Values only.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "datapath/host/fp8_rows.hpp"
#include "datapath/host/host_copy.hpp"
#include "hss/kernels/layout.hpp"

namespace hss::detail {
namespace {

using kernels::ElemType;

constexpr ElemType kFp8Types[] = {ElemType::kFp8E4M3, ElemType::kFp8E5M2};

uint32_t bits_of(float f) { return kernels::float_to_bits(f); }

std::string name_of(ElemType t) { return t == ElemType::kFp8E5M2 ? "e5m2" : "e4m3"; }

/// Every loop set this machine can run.
std::vector<CopyIsa> every_isa() {
  std::vector<CopyIsa> isas{CopyIsa::kPortable};
  if (this_cpu().sse2) isas.push_back(CopyIsa::kSse2);
  if (this_cpu().avx2) isas.push_back(CopyIsa::kAvx2);
  return isas;
}

TEST(Fp8Rows, CodeValuesAreTheDecodersValueOfEveryCode) {
  for (unsigned c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    EXPECT_EQ(bits_of(fp8_code_values(ElemType::kFp8E4M3)[c]),
              bits_of(kernels::e4m3_to_float(code)))
        << c;
    EXPECT_EQ(bits_of(fp8_code_values(ElemType::kFp8E5M2)[c]),
              bits_of(kernels::e5m2_to_float(code)))
        << c;
  }
}

/// The scales a dequantiser meets: exact powers of two, a row scale that rounds, the smallest
/// (subnormal) scale, and scales whose products overflow float32 (clamped to +-FLT_MAX).
std::vector<float> scales() {
  return {1.0f,
          0.25f,
          4.0f / 448.0f,
          3.3f / 57344.0f,
          kernels::bits_to_float(1u),
          kernels::bits_to_float(0x00400000u),
          1e30f,
          std::numeric_limits<float>::max() / 448.0f * 1.5f,
          std::numeric_limits<float>::max()};
}

TEST(Fp8Rows, DequantiseIsDequantiseAsForEveryCodeScaleAndOutputType) {
  // Every code, shuffled, repeated to 300 (the per-row table) and its first 200 (the direct loop).
  std::vector<uint8_t> codes(300);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 167 + 5) & 0xFF);
  for (ElemType type : kFp8Types) {
    for (float scale : scales()) {
      for (int64_t n : {int64_t{300}, int64_t{256}, int64_t{200}, int64_t{1}}) {
        std::vector<float> f32(static_cast<size_t>(n));
        std::vector<uint16_t> bf16(static_cast<size_t>(n)), f16(static_cast<size_t>(n));
        fp8_dequantise_run(codes.data(), type, scale, f32.data(), ElemType::kFloat32, n);
        fp8_dequantise_run(codes.data(), type, scale, bf16.data(), ElemType::kBFloat16, n);
        fp8_dequantise_run(codes.data(), type, scale, f16.data(), ElemType::kFloat16, n);
        for (size_t i = 0; i < f32.size(); ++i) {
          const float want = type == ElemType::kFp8E5M2
                                 ? kernels::dequantise_as<ElemType::kFp8E5M2>(codes[i], scale)
                                 : kernels::dequantise_as<ElemType::kFp8E4M3>(codes[i], scale);
          ASSERT_EQ(bits_of(f32[i]), bits_of(want))
              << name_of(type) << " code " << int{codes[i]} << " scale " << scale << " n " << n;
          ASSERT_EQ(bf16[i], kernels::float_to_bf16(want)) << int{codes[i]} << " " << scale;
          ASSERT_EQ(f16[i], kernels::float_to_f16(want)) << int{codes[i]} << " " << scale;
        }
      }
    }
  }
}

/// Expects fp8_quantise_run of `values` (float32) against `scale` to be quantise per element,
/// in every instruction set.
void expect_quantise_f32(const std::vector<float>& values, float scale, ElemType type) {
  std::vector<uint8_t> want(values.size());
  for (size_t i = 0; i < values.size(); ++i) want[i] = kernels::quantise(values[i], scale, type);
  for (CopyIsa isa : every_isa()) {
    std::vector<uint8_t> got(values.size(), 0x55);
    fp8_quantise_run(values.data(), ElemType::kFloat32, got.data(),
                     static_cast<int64_t>(values.size()), scale, type, isa);
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << name_of(type) << " " << to_string(isa) << " bits 0x" << std::hex
                                 << bits_of(values[i]) << " scale " << scale;
    }
  }
}

TEST(Fp8Rows, QuantiseIsQuantiseAsOverASweepOfFloat32BitPatterns) {
  // Every value of the top 24 bits (sign, exponent, the mantissa's top 15), each with a
  // pseudo-random low byte, and again with a low byte of 0 and 0x80 in a strided subset: ties,
  // carries, subnormals, the saturation boundary, infinities and NaNs. Scale 1 feeds the
  // patterns to the encoder unchanged; the other scales go through the division.
  std::vector<float> values(size_t{1} << 24);
  for (uint32_t p = 0; p < (1u << 24); ++p) {
    values[p] = kernels::bits_to_float((p << 8) | ((p * 0x9E3779B1u) >> 24));
  }
  for (ElemType type : kFp8Types) expect_quantise_f32(values, 1.0f, type);
  std::vector<float> strided;
  for (uint32_t p = 0; p < (1u << 24); p += 61) {
    for (uint32_t low : {0u, 0x80u, 0x7Fu})
      strided.push_back(kernels::bits_to_float((p << 8) | low));
  }
  for (ElemType type : kFp8Types) {
    expect_quantise_f32(strided, 1.0f, type);
    expect_quantise_f32(strided, 4.0f / 448.0f, type);
    expect_quantise_f32(strided, kernels::bits_to_float(1u), type);
  }
}

TEST(Fp8Rows, QuantiseIsQuantiseAsForEverySixteenBitPattern) {
  for (ElemType src_type : {ElemType::kBFloat16, ElemType::kFloat16}) {
    std::vector<uint16_t> values(65536 + 37);  // a partial block at the end
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint16_t>(i * 40503u);
    const kernels::SourceView view{values.data(), src_type, static_cast<int64_t>(values.size()),
                                   static_cast<int64_t>(values.size())};
    for (ElemType type : kFp8Types) {
      for (float scale : {1.0f, 0.37f / 448.0f, 1e-30f}) {
        for (CopyIsa isa : every_isa()) {
          std::vector<uint8_t> got(values.size(), 0x55);
          fp8_quantise_run(values.data(), src_type, got.data(), static_cast<int64_t>(values.size()),
                           scale, type, isa);
          for (size_t i = 0; i < values.size(); ++i) {
            const float x = kernels::load_as_float(view.data, static_cast<int64_t>(i), src_type);
            ASSERT_EQ(got[i], kernels::quantise(x, scale, type))
                << name_of(type) << " " << to_string(isa) << " 0x" << std::hex << values[i];
          }
        }
      }
    }
  }
}

TEST(Fp8Rows, RowScaleIsTheKernelsRowScaleWhateverTheRowHolds) {
  constexpr int64_t kCols = 1000, kStride = 1003, kRows = 12;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> rows(static_cast<size_t>(kRows * kStride), 0.0f);
  for (int64_t r = 0; r < kRows; ++r) {
    float* row = rows.data() + r * kStride;
    const float magnitude = std::ldexp(1.0f, static_cast<int>(r * 23) - 140);
    for (int64_t c = 0; c < kCols; ++c) row[c] = normal(rng) * magnitude;
  }
  rows[1 * kStride + 7] = nan;     // beside finite values
  rows[2 * kStride + 999] = -inf;  // the last element
  for (int64_t c = 0; c < kCols; ++c) rows[static_cast<size_t>(3 * kStride + c)] = -0.0f;
  for (int64_t c = 0; c < kCols; ++c) {  // nothing finite and non-zero
    rows[static_cast<size_t>(4 * kStride + c)] = c % 2 != 0 ? nan : -inf;
  }
  rows[5 * kStride + 500] = std::numeric_limits<float>::max();
  rows[6 * kStride + 0] = -kernels::bits_to_float(1u);  // only the smallest subnormal
  for (int64_t c = 1; c < kCols; ++c) rows[static_cast<size_t>(6 * kStride + c)] = 0.0f;
  std::vector<uint16_t> bf16(rows.size()), f16(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    bf16[i] = kernels::float_to_bf16(rows[i]);
    f16[i] = kernels::float_to_f16(rows[i]);
  }
  const kernels::SourceView views[] = {{rows.data(), ElemType::kFloat32, kCols, kStride},
                                       {bf16.data(), ElemType::kBFloat16, kCols, kStride},
                                       {f16.data(), ElemType::kFloat16, kCols, kStride}};
  for (const kernels::SourceView& view : views) {
    for (ElemType type : kFp8Types) {
      for (CopyIsa isa : every_isa()) {
        for (int64_t r = 0; r < kRows; ++r) {
          EXPECT_EQ(bits_of(fp8_row_scale(view, r, type, isa)),
                    bits_of(kernels::source_row_scale(view, r, type)))
              << name_of(type) << " " << to_string(isa) << " source "
              << static_cast<int>(view.type) << " row " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace hss::detail
