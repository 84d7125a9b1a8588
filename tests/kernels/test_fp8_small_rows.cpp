// The two domains of the FP8 error bound (convert.hpp, "Per-row quantisation"), split where
// amax / max_finite becomes a float32 subnormal: at and above the edge the scale is normal and the
// bound is amax / 28 (E4M3) or amax / 14 (E5M2); below it the scale is rounded up to a multiple
// of 2^-149, nothing saturates, and the bound is amax / 16 or amax / 8. Both sides of the edge,
// and the region near amax = 2^-139 where a scale rounded to nearest saturated the row's largest
// element (an error of amax / 8).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "hss/kernels/convert.hpp"

namespace hss::kernels {
namespace {

constexpr ElemType kTypes[] = {ElemType::kFp8E4M3, ElemType::kFp8E5M2};
constexpr uint32_t kMinNormalBits = 0x00800000u;  // FLT_MIN, 2^-126
static_assert(kMinNormalBits == kFloat32MinNormalBits);

/// amax at which the scale of type `t` is FLT_MIN exactly: the lowest amax of the normal domain.
float edge_of(ElemType t) { return fp8_max(t) * bits_to_float(kMinNormalBits); }

/// The worst |restored - x| / amax over rows whose largest magnitude is `amax` (the row holds
/// +-amax and random values below it, and values just under amax).
double worst_error(float amax, ElemType t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> x = {amax, -amax, std::nextafter(amax, 0.0f)};
  for (int i = 0; i < 253; ++i) x.push_back(unit(rng) * amax);
  float row_amax = 0.0f;
  for (const float v : x) row_amax = amax_add(row_amax, v);
  EXPECT_EQ(row_amax, amax);
  const float scale = row_scale(row_amax, t);
  double worst = 0.0;
  for (const float v : x) {
    const float back = dequantise(quantise(v, scale, t), scale, t);
    worst = std::max(worst, std::fabs(static_cast<double>(back) - v) / amax);
  }
  return worst;
}

/// The documented bound of each domain, with float32's rounding (2^-150 absolute below the edge).
double normal_bound(ElemType t) { return t == ElemType::kFp8E4M3 ? 1.0 / 28 : 1.0 / 14; }
double subnormal_bound(ElemType t, float amax) {
  return (t == ElemType::kFp8E4M3 ? 1.0 / 16 : 1.0 / 8) + std::ldexp(1.0, -150) / amax;
}

TEST(Fp8SmallRows, AtTheEdgeTheScaleIsNormalAndTheBoundIsAmaxOver28Or14) {
  for (const ElemType t : kTypes) {
    const float edge = edge_of(t);
    EXPECT_EQ(float_to_bits(row_scale(edge, t)), kMinNormalBits);
    for (const float amax : {edge, std::nextafter(edge, 1.0f), edge * 1.75f, edge * 64.0f}) {
      EXPECT_LE(worst_error(amax, t, 1), normal_bound(t) * (1 + 1e-5)) << amax;
    }
  }
}

TEST(Fp8SmallRows, JustBelowTheEdgeTheScaleIsSubnormalAndNothingSaturates) {
  for (const ElemType t : kTypes) {
    // The first amax under the edge whose scale is subnormal (1 ulp under, amax / max still
    // rounds to FLT_MIN), and a little further down.
    for (const float below : {edge_of(t) * (1.0f - 0x1p-23f), edge_of(t) * 0.999f}) {
      const float scale = row_scale(below, t);
      EXPECT_LT(float_to_bits(scale), kMinNormalBits) << below;
      EXPECT_LE(below / scale, fp8_max(t)) << below;  // the largest code, unsaturated
      EXPECT_LE(worst_error(below, t, 2), subnormal_bound(t, below)) << below;
    }
  }
}

TEST(Fp8SmallRows, SubnormalScalesAreRoundedUpSoAmaxNeverExceedsTheLargestCode) {
  // Every amax from 2^-149 up to the edge, 64 per binade: amax / scale <= max_finite, and the
  // scale is the least multiple of 2^-149 with that property (one step down would saturate).
  for (const ElemType t : kTypes) {
    for (float amax = bits_to_float(1u); amax < edge_of(t); amax *= 1.0111f) {
      amax = std::max(amax, std::nextafter(amax, 1.0f));
      const float scale = row_scale(amax, t);
      ASSERT_GT(scale, 0.0f) << amax;
      ASSERT_LE(amax / scale, fp8_max(t)) << amax;
      const uint32_t bits = float_to_bits(scale);
      if (bits > 1u) {
        ASSERT_GT(amax / bits_to_float(bits - 1u), fp8_max(t)) << amax;
      }
    }
  }
}

TEST(Fp8SmallRows, RowsNearTwoToTheMinus139StayWithinAmaxOver16) {
  // Where the scale rounded to nearest saturated the largest element (amax / 8 for E4M3).
  for (const ElemType t : kTypes) {
    uint32_t seed = 10;
    for (float amax = std::ldexp(1.0f, -145); amax < std::ldexp(1.0f, -130); amax *= 1.037f) {
      ASSERT_LE(worst_error(amax, t, ++seed), subnormal_bound(t, amax)) << amax;
    }
  }
}

TEST(Fp8SmallRows, ASubnormalRowOfTwoToTheMinus149RestoresExactly) {
  for (const ElemType t : kTypes) {
    const float tiny = bits_to_float(1u);
    const float scale = row_scale(tiny, t);
    EXPECT_EQ(scale, tiny);
    EXPECT_EQ(dequantise(quantise(tiny, scale, t), scale, t), tiny);
    EXPECT_EQ(dequantise(quantise(-tiny, scale, t), scale, t), -tiny);
  }
}

}  // namespace
}  // namespace hss::kernels
