// float32 -> 16-bit restore outputs: the conversions over every 16-bit pattern (each value
// round-trips; each midpoint between neighbours rounds to the even one), and a lane-by-lane
// emulation of the restore kernel, for every (storage, output) type pair, equal bit for bit to
// the host path (src/datapath/host/host_data_path.cpp).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "datapath/data_path.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/kernels/tiling.hpp"

namespace hss::kernels {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

bool is_nan16(uint16_t h, bool bf16) {
  return bf16 ? ((h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0)
              : ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0);
}

template <typename Widen, typename Narrow>
void expect_every_pattern_round_trips_and_midpoints_tie_to_even(Widen widen, Narrow narrow,
                                                                bool bf16) {
  for (uint32_t p = 0; p <= 0xFFFF; ++p) {
    const auto h = static_cast<uint16_t>(p);
    const float f = widen(h);
    if (is_nan16(h, bf16)) {
      ASSERT_TRUE(is_nan16(narrow(f), bf16)) << std::hex << p;
      continue;
    }
    ASSERT_EQ(narrow(f), h) << std::hex << p;
    // The midpoint to the next larger magnitude (same sign) rounds to whichever of the two is
    // even; just below it rounds down, just above it rounds up.
    const auto next = static_cast<uint16_t>(h + 1);
    if (is_nan16(next, bf16) || std::isinf(f) || std::isinf(widen(next))) continue;
    if ((next & 0x8000u) != (h & 0x8000u)) continue;
    const double mid = (static_cast<double>(f) + static_cast<double>(widen(next))) / 2.0;
    const auto mid_f = static_cast<float>(mid);
    if (static_cast<double>(mid_f) != mid) continue;  // not representable in float32
    const uint16_t even = (h & 1u) == 0 ? h : next;
    ASSERT_EQ(narrow(mid_f), even) << std::hex << p;
    uint32_t bits;
    std::memcpy(&bits, &mid_f, 4);
    ASSERT_EQ(narrow(from_bits(bits - 1)), h) << std::hex << p;  // magnitude just below
    ASSERT_EQ(narrow(from_bits(bits + 1)), next) << std::hex << p;
  }
}

TEST(KernelNarrowing, Float16EveryPatternRoundTripsAndTiesToEven) {
  expect_every_pattern_round_trips_and_midpoints_tie_to_even(f16_to_float, float_to_f16, false);
}

TEST(KernelNarrowing, BFloat16EveryPatternRoundTripsAndTiesToEven) {
  expect_every_pattern_round_trips_and_midpoints_tie_to_even(bf16_to_float, float_to_bf16, true);
}

TEST(KernelNarrowing, Float16OverflowUnderflowAndSpecials) {
  EXPECT_EQ(float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65519.996f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);  // the tie above the largest finite goes to inf
  EXPECT_EQ(float_to_f16(1e10f), 0x7C00);
  EXPECT_EQ(float_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(float_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -40)), 0x0000);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the first normal
  EXPECT_TRUE(is_nan16(float_to_f16(std::nanf("")), false));
}

// Restore emulation: every thread of a block, every (storage, output) pair, aligned and shifted
// sources, padded outputs.
std::vector<unsigned char> random_pool(size_t bytes, ElemType type, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> pool(bytes);
  if (type == ElemType::kFloat32) {  // finite floats across many magnitudes (and some ties)
    std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
    std::uniform_int_distribution<int> exp(-30, 20);
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
      float f = std::ldexp(mant(rng), exp(rng));
      if (i % 64 == 0) f = 1.0f + std::ldexp(1.0f, -8);  // a bf16 tie
      std::memcpy(pool.data() + i, &f, 4);
    }
  } else {
    for (auto& b : pool) b = static_cast<unsigned char>(rng());
  }
  return pool;
}

void expect_restore_matches_host(ElemType src_type, ElemType out_type, int64_t cols, int64_t stride,
                                 int64_t src_shift) {
  const auto esize = static_cast<int64_t>(elem_bytes(src_type));
  const auto osize = static_cast<int64_t>(elem_bytes(out_type));
  const int64_t rows = 5;
  auto pool = random_pool(static_cast<size_t>((rows * cols + src_shift) * esize + 64), src_type,
                          static_cast<uint32_t>(cols * 31 + src_shift));
  const int64_t split = 2 * cols + 3;
  const GatherSegment segs[2] = {
      {pool.data() + src_shift * esize, 0, split, src_type},
      {pool.data() + (src_shift + split) * esize, split, rows * cols - split, src_type}};
  std::vector<unsigned char> got(static_cast<size_t>(rows * stride * osize), 0xAB);
  std::vector<unsigned char> want = got;
  const OutputView out_got{got.data(), cols, stride, out_type};
  const OutputView out_want{want.data(), cols, stride, out_type};
  for (const GatherSegment& seg : segs) {
    for_each_tile(seg.dst_elem, seg.count, cols, stride == cols, tile_elems(src_type),
                  [&](int64_t o, int64_t n) {
                    const GatherSegment tile{static_cast<const unsigned char*>(seg.src) + o * esize,
                                             seg.dst_elem + o, n, seg.src_type};
                    for (int lane = 0; lane < kBlockThreads; ++lane) {
                      restore_tile_any(tile, out_got, lane, kBlockThreads);
                    }
                  });
  }
  detail::host_restore(segs, out_want);
  ASSERT_EQ(got, want) << "src " << static_cast<int>(src_type) << " out "
                       << static_cast<int>(out_type) << " cols " << cols << " stride " << stride
                       << " shift " << src_shift;
}

TEST(KernelNarrowing, RestoreEmulationMatchesHostPathForEveryTypePair) {
  const ElemType types[] = {ElemType::kFloat32, ElemType::kFloat16, ElemType::kBFloat16};
  for (ElemType src : types) {
    for (ElemType out : types) {
      for (int64_t cols : {8, 13, 2051}) {
        for (int64_t pad : {0, 3}) {
          for (int64_t shift : {0, 1, 4})
            expect_restore_matches_host(src, out, cols, cols + pad, shift);
        }
      }
    }
  }
}

TEST(KernelNarrowing, SameTypeRestoreIsABitCopyNaNPayloadsIncluded) {
  const uint16_t stored[4] = {0x7C01, 0xFE55, 0x7F81, 0x0001};  // sNaN f16, qNaN f16, sNaN bf16
  for (ElemType t : {ElemType::kFloat16, ElemType::kBFloat16}) {
    uint16_t out[4] = {};
    const GatherSegment seg{stored, 0, 4, t};
    detail::host_restore({&seg, 1}, OutputView{out, 4, 4, t});
    EXPECT_EQ(std::memcmp(out, stored, sizeof out), 0);
  }
}

}  // namespace
}  // namespace hss::kernels
