// The 8-bit formats and the per-row quantiser (hss/kernels/fp8.hpp, convert.hpp): exact codes,
// rounding, saturation, special values, and the error bound the docs state.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "hss/kernels/convert.hpp"
#include "hss/kernels/layout.hpp"

namespace hss::kernels {
namespace {

float from_bits(uint32_t bits) { return bits_to_float(bits); }

TEST(Fp8E4M3, KnownEncodings) {
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3(-2.0f), 0xC0);
  EXPECT_EQ(float_to_e4m3(0.5f), 0x30);
  EXPECT_EQ(float_to_e4m3(1.125f), 0x39);
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-448.0f), 0xFE);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -6)), 0x08);  // smallest normal
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(float_to_e4m3(std::ldexp(7.0f, -9)), 0x07);  // largest subnormal
}

TEST(Fp8E4M3, RoundsToNearestEven) {
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);  // halfway 1 and 1.125: the even code (1)
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);  // halfway 1.125 and 1.25: the even code (1.25)
  EXPECT_EQ(float_to_e4m3(1.07f), 0x39);    // above halfway
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);   // half the smallest subnormal: 0
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.0f, -10)), 0x02);   // 1.5 units: to 2 (even)
  EXPECT_EQ(float_to_e4m3(std::ldexp(15.0f, -10)), 0x08);  // 7.5 units: carries into normal
  EXPECT_EQ(float_to_e4m3(1e-30f), 0x00);
  EXPECT_EQ(float_to_e4m3(from_bits(1)), 0x00);  // a float32 subnormal
}

TEST(Fp8E4M3, SaturatesFiniteOverflowAndMapsSpecials) {
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);  // would round to 480 (the NaN code): saturates
  EXPECT_EQ(float_to_e4m3(1e6f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::max()), 0xFE);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7F);  // no inf: NaN
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFF);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(Fp8E4M3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float f = e4m3_to_float(code);
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_e4m3(f), code) << c;
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8E5M2, KnownEncodingsAndSpecials) {
  EXPECT_EQ(float_to_e5m2(1.0f), 0x3C);
  EXPECT_EQ(float_to_e5m2(-1.5f), 0xBE);
  EXPECT_EQ(float_to_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(float_to_e5m2(1e9f), 0x7B);  // saturates
  EXPECT_EQ(float_to_e5m2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_EQ(float_to_e5m2(1.125f), 0x3C);  // halfway 1 and 1.25: even (1)
  EXPECT_EQ(float_to_e5m2(1.375f), 0x3E);  // halfway 1.25 and 1.5: even (1.5)
  EXPECT_EQ(float_to_e5m2(std::numeric_limits<float>::infinity()), 0x7C);
  EXPECT_EQ(float_to_e5m2(-std::numeric_limits<float>::infinity()), 0xFC);
  EXPECT_EQ(float_to_e5m2(std::numeric_limits<float>::quiet_NaN()), 0x7E);
  EXPECT_EQ(e5m2_to_float(0x7C), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(e5m2_to_float(0x7E)));
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float f = e5m2_to_float(code);
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_e5m2(f), code) << c;
  }
}

/// Reference encoder in double arithmetic: the nearest finite code by value, ties to the even
/// code, saturating; the codes' values from the decoder.
uint8_t reference_encode(float f, float (*decode)(uint8_t), uint8_t max_code) {
  const double a = std::fabs(static_cast<double>(f));
  uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= max_code; ++c) {
    const double err = std::fabs(static_cast<double>(decode(static_cast<uint8_t>(c))) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  if (a > decode(max_code)) best = max_code;
  return static_cast<uint8_t>((std::signbit(f) ? 0x80 : 0) | best);
}

TEST(Fp8Encode, MatchesADoubleReferenceOnRandomValuesAndEveryMidpoint) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-20.0f, 18.0f);
  std::vector<float> values;
  for (int i = 0; i < 20000; ++i) {
    const float v = std::exp2(exponent(rng));
    values.push_back((i & 1) != 0 ? -v : v);
  }
  for (int c = 0; c < 0x7F; ++c) {  // midpoints and their neighbours, both formats
    for (float (*decode)(uint8_t) : {e4m3_to_float, e5m2_to_float}) {
      const float lo = decode(static_cast<uint8_t>(c));
      const float hi = decode(static_cast<uint8_t>(c + 1));
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const float mid = lo + (hi - lo) / 2;
      values.insert(values.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)});
    }
  }
  for (const float v : values) {
    ASSERT_EQ(float_to_e4m3(v), reference_encode(v, e4m3_to_float, 0x7E)) << v;
    ASSERT_EQ(float_to_e5m2(v), reference_encode(v, e5m2_to_float, 0x7B)) << v;
  }
}

/// reference_encode for every float32, NaN and infinities included, by bisection over the
/// codes' values (increasing from code 0 to max_code): fast enough for a sweep of 2^24 patterns.
class SweepReference {
 public:
  SweepReference(float (*decode)(uint8_t), uint8_t max_code, uint8_t nan_code, uint8_t inf_code)
      : max_code_(max_code), nan_code_(nan_code), inf_code_(inf_code) {
    for (int c = 0; c <= max_code; ++c) value_.push_back(decode(static_cast<uint8_t>(c)));
  }

  [[nodiscard]] uint8_t operator()(float f) const {
    const uint8_t sign = std::signbit(f) ? 0x80 : 0;
    if (std::isnan(f)) return static_cast<uint8_t>(sign | nan_code_);
    if (std::isinf(f)) return static_cast<uint8_t>(sign | inf_code_);
    const double a = std::fabs(static_cast<double>(f));
    if (a >= value_[max_code_]) return static_cast<uint8_t>(sign | max_code_);
    int lo = 0, hi = max_code_;  // value(lo) <= a < value(hi)
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      (value_[static_cast<size_t>(mid)] <= a ? lo : hi) = mid;
    }
    const double below = a - value_[static_cast<size_t>(lo)];
    const double above = value_[static_cast<size_t>(hi)] - a;
    const int code = below < above || (below == above && (lo & 1) == 0) ? lo : hi;
    return static_cast<uint8_t>(sign | code);
  }

 private:
  std::vector<double> value_;
  uint8_t max_code_, nan_code_, inf_code_;
};

TEST(Fp8Encode, MatchesTheReferenceOverASweepOfFloat32BitPatterns) {
  // Every value of the top 24 bits (sign, exponent, the mantissa's top 15: every rounding
  // boundary of both formats lies on them), with a pseudo-random low byte and with a low byte
  // of 0 (exact ties, exact codes).
  const SweepReference e4m3(e4m3_to_float, 0x7E, 0x7F, 0x7F);
  const SweepReference e5m2(e5m2_to_float, 0x7B, 0x7E, 0x7C);
  for (uint32_t p = 0; p < (1u << 24); ++p) {
    for (uint32_t bits : {(p << 8) | ((p * 0x9E3779B1u) >> 24), p << 8}) {
      const float v = from_bits(bits);
      ASSERT_EQ(float_to_e4m3(v), e4m3(v)) << std::hex << bits;
      ASSERT_EQ(float_to_e5m2(v), e5m2(v)) << std::hex << bits;
    }
  }
}

TEST(Fp8Quantise, ScaleIsAmaxOverTheLargestFiniteValue) {
  EXPECT_EQ(row_scale(448.0f, ElemType::kFp8E4M3), 1.0f);
  EXPECT_EQ(row_scale(896.0f, ElemType::kFp8E4M3), 2.0f);
  EXPECT_EQ(row_scale(57344.0f, ElemType::kFp8E5M2), 1.0f);
  EXPECT_EQ(row_scale(0.0f, ElemType::kFp8E4M3), 1.0f);          // a zero row
  EXPECT_GT(row_scale(from_bits(1), ElemType::kFp8E4M3), 0.0f);  // never zero
  // The row's largest element maps onto the largest finite code, exactly.
  const float scale = row_scale(3.5f, ElemType::kFp8E4M3);
  EXPECT_EQ(quantise(3.5f, scale, ElemType::kFp8E4M3), 0x7E);
  EXPECT_EQ(quantise(-3.5f, scale, ElemType::kFp8E4M3), 0xFE);
}

TEST(Fp8Quantise, AmaxIgnoresNonFiniteElements) {
  float amax = 0.0f;
  for (float x : {1.0f, -3.0f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), 2.0f}) {
    amax = amax_add(amax, x);
  }
  EXPECT_EQ(amax, 3.0f);
}

TEST(Fp8Quantise, FiniteCodesNeverDequantiseToInfinity) {
  const float big = std::numeric_limits<float>::max();
  for (ElemType t : {ElemType::kFp8E4M3, ElemType::kFp8E5M2}) {
    const float scale = row_scale(big, t);
    const uint8_t code = quantise(big, scale, t);
    const float back = dequantise(code, scale, t);
    EXPECT_TRUE(std::isfinite(back));
    EXPECT_LE(std::fabs(back - big), big / 14.0f);
    EXPECT_TRUE(std::isfinite(dequantise(quantise(-big, scale, t), scale, t)));
  }
}

/// Per element |restored - x| <= amax * bound, over random-normal rows and several magnitudes.
void expect_error_bound(ElemType t, double bound) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double worst = 0.0;
  for (float magnitude : {1e-20f, 1e-3f, 1.0f, 300.0f, 1e30f}) {
    for (int row = 0; row < 64; ++row) {
      std::vector<float> x(512);
      float amax = 0.0f;
      for (float& v : x) {
        v = normal(rng) * magnitude;
        amax = amax_add(amax, v);
      }
      const float scale = row_scale(amax, t);
      for (float v : x) {
        const float back = dequantise(quantise(v, scale, t), scale, t);
        const double err = std::fabs(static_cast<double>(back) - v) / amax;
        worst = std::max(worst, err);
        ASSERT_LE(err, bound * (1 + 1e-5)) << v << " amax " << amax;
      }
    }
  }
  EXPECT_GT(worst, bound / 4);  // the bound is near what happens, not vacuous
}

TEST(Fp8Quantise, E4M3ErrorIsAtMostAmaxOver28) { expect_error_bound(ElemType::kFp8E4M3, 1.0 / 28); }
TEST(Fp8Quantise, E5M2ErrorIsAtMostAmaxOver14) { expect_error_bound(ElemType::kFp8E5M2, 1.0 / 14); }

TEST(Fp8Quantise, NormalRangeElementsHaveRelativeErrorAtMostTwoToTheMinusFour) {
  const float amax = 10.0f;
  const float scale = row_scale(amax, ElemType::kFp8E4M3);
  for (float x = 0.2f; x <= amax; x *= 1.013f) {  // x / scale >= 2^-6 from 0.0014 on
    const float back =
        dequantise(quantise(x, scale, ElemType::kFp8E4M3), scale, ElemType::kFp8E4M3);
    EXPECT_LE(std::fabs(back - x), std::ldexp(x, -4) * (1 + 1e-6f)) << x;
  }
}

TEST(Fp8Layout, RestoreElementDequantisesWithTheSegmentsScale) {
  const uint8_t codes[4] = {0x38, 0xC0, 0x7E, 0x00};  // 1, -2, 448, 0
  const float scale = 0.25f;
  const GatherSegment seg{codes, 0, 4, ElemType::kFp8E4M3, &scale};
  float out[4] = {};
  uint16_t out_bf16[4] = {};
  const OutputView view{out, 4, 4, ElemType::kFloat32};
  const OutputView view_bf16{out_bf16, 4, 4, ElemType::kBFloat16};
  for (int64_t i = 0; i < 4; ++i) {
    restore_element(seg, i, view);
    restore_element(seg, i, view_bf16);
  }
  EXPECT_EQ(out[0], 0.25f);
  EXPECT_EQ(out[1], -0.5f);
  EXPECT_EQ(out[2], 112.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(bf16_to_float(out_bf16[2]), 112.0f);
}

TEST(Fp8Layout, StoreElementQuantisesAgainstItsRowsScale) {
  const float rows[2][3] = {{1.0f, -4.0f, 2.0f}, {0.0f, 0.0f, 0.0f}};
  const SourceView src{rows, ElemType::kFloat32, 3, 3};
  uint8_t out[6] = {};
  for (int64_t i = 0; i < 6; ++i) store_element(src, 0, i, out, i, ElemType::kFp8E4M3);
  EXPECT_EQ(out[1], 0xFE);  // -amax: -448
  EXPECT_EQ(e4m3_to_float(out[0]), 112.0f);
  EXPECT_EQ(e4m3_to_float(out[2]), 224.0f);
  EXPECT_EQ(out[3], 0x00);  // a zero row: zero codes (scale 1)
  EXPECT_EQ(source_row_scale(src, 0, ElemType::kFp8E4M3), 4.0f / 448.0f);
  EXPECT_EQ(source_row_scale(src, 1, ElemType::kFp8E4M3), 1.0f);
}

}  // namespace
}  // namespace hss::kernels
