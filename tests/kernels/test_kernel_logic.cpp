// The per-element and per-tile logic of the CUDA kernels, run on the CPU: the conversions over
// every 16-bit pattern, the layout addressing, the tiling, and a lane-by-lane emulation of a
// thread block that must match the host path bit for bit.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "datapath/data_path.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/kernels/layout.hpp"
#include "hss/kernels/tiling.hpp"

namespace hss::kernels {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// IEEE binary16 decoded the textbook way.
float f16_reference(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  float magnitude;
  if (exponent == 0x1F) {
    magnitude = mantissa == 0 ? std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else {
    magnitude = std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

// bfloat16: 8-bit exponent (bias 127), 7-bit mantissa.
float bf16_reference(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exponent = (h >> 7) & 0xFF;
  const int mantissa = h & 0x7F;
  float magnitude;
  if (exponent == 0xFF) {
    magnitude = mantissa == 0 ? std::numeric_limits<float>::infinity()
                              : std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -133);
  } else {
    magnitude = std::ldexp(static_cast<float>(128 + mantissa), exponent - 134);
  }
  return sign ? -magnitude : magnitude;
}

TEST(KernelConvert, F16ToFloatIsExactForEveryBitPattern) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float got = f16_to_float(half);
    const float want = f16_reference(half);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      EXPECT_EQ(bits_of(got) >> 31, h >> 15u) << std::hex << h;               // sign kept
      EXPECT_EQ((bits_of(got) >> 13) & 0x3FFu, h & 0x3FFu) << std::hex << h;  // payload kept
    } else {
      ASSERT_EQ(bits_of(got), bits_of(want)) << std::hex << h;  // also tells -0 from +0
    }
  }
}

TEST(KernelConvert, Bf16ToFloatIsExactForEveryBitPattern) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float got = bf16_to_float(half);
    const float want = bf16_reference(half);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      EXPECT_EQ(bits_of(got), h << 16) << std::hex << h;
    } else {
      ASSERT_EQ(bits_of(got), bits_of(want)) << std::hex << h;
    }
  }
}

TEST(KernelConvert, FloatToBf16RoundTripsEveryBf16Value) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << std::hex << h;
    } else {
      ASSERT_EQ(float_to_bf16(f), h) << std::hex << h;
    }
  }
}

TEST(KernelConvert, FloatToBf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808000u)), 0x3F80u);             // tie, even below: down
  EXPECT_EQ(float_to_bf16(from_bits(0x3F818000u)), 0x3F82u);             // tie, odd below: up
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808001u)), 0x3F81u);             // above the tie: up
  EXPECT_EQ(float_to_bf16(from_bits(0x3F807FFFu)), 0x3F80u);             // below the tie: down
  EXPECT_EQ(float_to_bf16(from_bits(0xBF818000u)), 0xBF82u);             // sign does not matter
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80u);  // overflows to inf
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80u);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000u);
  const uint16_t nan = float_to_bf16(from_bits(0x7F800001u));  // payload only in low bits
  EXPECT_TRUE(std::isnan(bf16_to_float(nan)));
}

TEST(KernelLayout, ForEachBlockPieceNeverStraddlesABlock) {
  struct Piece {
    int64_t block, byte_offset, first, n;
  };
  std::vector<Piece> pieces;
  // 4-byte elements, 64-byte blocks = 16 elements per block; elements [10, 50).
  for_each_block_piece(10, 40, 4, 64, [&](int64_t b, int64_t off, int64_t first, int64_t n) {
    pieces.push_back({b, off, first, n});
  });
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[0].block, 0);
  EXPECT_EQ(pieces[0].byte_offset, 40);
  EXPECT_EQ(pieces[0].first, 10);
  EXPECT_EQ(pieces[0].n, 6);
  EXPECT_EQ(pieces[1].block, 1);
  EXPECT_EQ(pieces[1].byte_offset, 0);
  EXPECT_EQ(pieces[1].n, 16);
  EXPECT_EQ(pieces[2].block, 2);
  EXPECT_EQ(pieces[2].n, 16);
  EXPECT_EQ(pieces[3].block, 3);
  EXPECT_EQ(pieces[3].first, 48);
  EXPECT_EQ(pieces[3].n, 2);
}

TEST(KernelLayout, ForEachBlockPieceWithNothingToDoCallsNothing) {
  int calls = 0;
  for_each_block_piece(5, 0, 2, 32, [&](int64_t, int64_t, int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(KernelLayout, SourceAndOutputAddressesFollowTheRowStride) {
  std::vector<uint16_t> src(10 * 8);
  const SourceView s{src.data(), ElemType::kBFloat16, /*cols=*/5, /*row_stride=*/8};
  // Chunk starting at row 2, flat element 7 = row 3, col 2.
  EXPECT_EQ(source_address(s, 2, 7), static_cast<const void*>(src.data() + 3 * 8 + 2));
  std::vector<float> out(6 * 7);
  const OutputView o{out.data(), /*cols=*/5, /*row_stride=*/7};
  EXPECT_EQ(output_address(o, 0), out.data());
  EXPECT_EQ(output_address(o, 5), out.data() + 7);
  EXPECT_EQ(output_address(o, 13), out.data() + 2 * 7 + 3);
}

TEST(KernelLayout, StoreAndRestoreElementConvertOneElement) {
  const uint16_t bf[2] = {0x3F80, 0xC000};  // 1.0, -2.0
  const SourceView s{bf, ElemType::kBFloat16, 2, 2};
  float widened[2];
  store_element(s, 0, 1, widened, 0, ElemType::kFloat32);
  EXPECT_EQ(widened[0], -2.0f);
  uint16_t kept[1];
  store_element(s, 0, 0, kept, 0, ElemType::kBFloat16);
  EXPECT_EQ(kept[0], 0x3F80);

  const uint16_t f16[3] = {0x3C00, 0x4000, 0x7C00};  // 1, 2, inf
  float out[4] = {0, 0, 0, 0};
  const OutputView o{out, 2, 2};
  const GatherSegment seg{f16, /*dst_elem=*/1, /*count=*/3, ElemType::kFloat16};
  for (int64_t i = 0; i < seg.count; ++i) restore_element(seg, i, o);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], 2.0f);
  EXPECT_TRUE(std::isinf(out[3]));
}

// ---------------------------------------------------------------------------------------------
// tiling

struct Tile {
  int64_t offset, n;
};

std::vector<Tile> tiles_of(int64_t flat, int64_t count, int64_t cols, bool contiguous,
                           int64_t max_elems) {
  std::vector<Tile> tiles;
  for_each_tile(flat, count, cols, contiguous, max_elems, [&](int64_t o, int64_t n) {
    tiles.push_back({o, n});
  });
  return tiles;
}

TEST(KernelTiling, TileSizeIsOneBlockOfVectors) {
  EXPECT_EQ(kTileBytes, 16 * 1024);
  EXPECT_EQ(tile_elems(ElemType::kFloat32), 4096);
  EXPECT_EQ(tile_elems(ElemType::kFloat16), 8192);
}

TEST(KernelTiling, ContiguousRunsSplitAtTheTileSize) {
  const auto tiles = tiles_of(3, 10, 4, /*contiguous=*/true, 4);
  ASSERT_EQ(tiles.size(), 3u);
  EXPECT_EQ(tiles[0].offset, 0);
  EXPECT_EQ(tiles[0].n, 4);
  EXPECT_EQ(tiles[1].offset, 4);
  EXPECT_EQ(tiles[2].offset, 8);
  EXPECT_EQ(tiles[2].n, 2);
}

TEST(KernelTiling, StridedRunsAlsoSplitAtRowEnds) {
  // cols = 5: elements [3, 15) are rows 0 (3..4), 1 (5..9), 2 (10..14); max 3 per tile.
  const auto tiles = tiles_of(3, 12, 5, /*contiguous=*/false, 3);
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 2}, {2, 3}, {5, 2}, {7, 3}, {10, 2}};
  ASSERT_EQ(tiles.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(tiles[i].offset, want[i].first) << i;
    EXPECT_EQ(tiles[i].n, want[i].second) << i;
  }
}

TEST(KernelTiling, EmptyRunHasNoTiles) { EXPECT_TRUE(tiles_of(7, 0, 4, false, 16).empty()); }

TEST(KernelTiling, PlanVectorsAlignedBothSides) {
  const VectorPlan p = plan_vectors(0x1000, 0x2000, 37, 4, 4);
  EXPECT_EQ(p.head, 0);
  EXPECT_EQ(p.vectors, 9);
  EXPECT_EQ(p.tail_begin, 36);
}

TEST(KernelTiling, PlanVectorsScalarHeadUntilTheSourceIsAligned) {
  // bf16 source 6 bytes past alignment: 5 head elements; float32 destination aligned after them.
  const VectorPlan p = plan_vectors(0x1006, 0x2000 - 5 * 4 + 16, 40, 2, 4);
  EXPECT_EQ(p.head, 5);
  EXPECT_EQ(p.vectors, 4);
  EXPECT_EQ(p.tail_begin, 37);
}

TEST(KernelTiling, PlanVectorsGivesUpOnMismatchedPhase) {
  const VectorPlan p = plan_vectors(0x1004, 0x2000, 40, 4, 4);
  EXPECT_EQ(p.vectors, 0);
  EXPECT_EQ(p.head, 0);
  EXPECT_EQ(p.tail_begin, 0);
  const VectorPlan odd = plan_vectors(0x1001, 0x2001, 40, 2, 2);  // misaligned elements
  EXPECT_EQ(odd.vectors, 0);
  EXPECT_EQ(odd.tail_begin, 0);
}

TEST(KernelTiling, PlanVectorsShortRunIsAllScalar) {
  // One element before the source is aligned: no vector, every element in head or tail once.
  const VectorPlan p = plan_vectors(0x1008, 0x2008, 1, 4, 4);
  EXPECT_EQ(p.vectors, 0);
  EXPECT_EQ(p.head, p.tail_begin);
  const VectorPlan q = plan_vectors(0x1008, 0x2008, 3, 4, 4);  // 2 head, then 1 < one vector
  EXPECT_EQ(q.vectors, 0);
  EXPECT_EQ(q.head, q.tail_begin);
}

TEST(KernelTiling, StagingOffsetMatchesTheSourcePhase) {
  const int64_t sizes[][2] = {{4, 4}, {2, 4}, {2, 2}};
  for (const auto& size : sizes) {
    for (uint64_t src = 0x1000; src < 0x1010; src += static_cast<uint64_t>(size[0])) {
      for (int64_t cursor : {0, 1, 15, 16, 100}) {
        const int64_t off = staging_offset(cursor, src, size[0], size[1]);
        EXPECT_GE(off, cursor);
        EXPECT_LT(off, cursor + 32);
        const VectorPlan p =
            plan_vectors(src, 0x8000 + static_cast<uint64_t>(off), 64, size[0], size[1]);
        EXPECT_GT(p.vectors, 0) << "src " << src << " cursor " << cursor;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// A thread block, emulated lane by lane, against the host path.

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

template <ElemType S, ElemType D>
void run_store_block(const SourceView& src, const WriteSegment& seg, bool contiguous, int lanes) {
  const auto desize = static_cast<int64_t>(elem_bytes(D));
  for_each_tile(seg.src_elem, seg.count, src.cols, contiguous, tile_elems(S),
                [&](int64_t o, int64_t n) {
                  const WriteSegment tile{static_cast<unsigned char*>(seg.dst) + o * desize,
                                          seg.src_row0, seg.src_elem + o, n, D};
                  for (int lane = 0; lane < lanes; ++lane) store_tile<S, D>(src, tile, lane, lanes);
                });
}

template <ElemType S, ElemType D>
void expect_store_matches_host(int64_t cols, int64_t stride, int64_t src_shift, int64_t dst_shift) {
  const int64_t rows = 9;
  const auto sesize = static_cast<int64_t>(elem_bytes(S));
  const auto desize = static_cast<int64_t>(elem_bytes(D));
  auto source = random_bytes(static_cast<size_t>((rows * stride + src_shift) * sesize + 64), 7);
  // Keep float32 sources finite-or-not as they come: the copy is bitwise either way.
  const SourceView src{source.data() + src_shift * sesize, S, cols, stride};
  const int64_t row0 = 2, first = 3, count = 5 * cols + 1;
  std::vector<unsigned char> got(static_cast<size_t>((count + dst_shift) * desize + 64), 0);
  std::vector<unsigned char> want = got;
  const WriteSegment seg_got{got.data() + dst_shift * desize, row0, first, count, D};
  const WriteSegment seg_want{want.data() + dst_shift * desize, row0, first, count, D};
  for (int lanes : {1, 3, kBlockThreads}) {
    std::fill(got.begin(), got.end(), 0);
    run_store_block<S, D>(src, seg_got, stride == cols, lanes);
    detail::host_store(src, std::span<const WriteSegment>(&seg_want, 1));
    ASSERT_EQ(got, want) << "cols " << cols << " stride " << stride << " src_shift " << src_shift
                         << " dst_shift " << dst_shift << " lanes " << lanes;
  }
}

template <ElemType S, ElemType D>
void expect_store_matches_host_all_layouts() {
  for (int64_t cols : {8, 13, 4096}) {
    for (int64_t pad : {0, 3, 8}) {
      for (int64_t src_shift : {0, 1, 4}) {
        for (int64_t dst_shift : {0, 1, 4}) {
          expect_store_matches_host<S, D>(cols, cols + pad, src_shift, dst_shift);
        }
      }
    }
  }
}

TEST(KernelEmulation, StoreF32MatchesHostPath) {
  expect_store_matches_host_all_layouts<ElemType::kFloat32, ElemType::kFloat32>();
}
TEST(KernelEmulation, StoreF16WidenedMatchesHostPath) {
  expect_store_matches_host_all_layouts<ElemType::kFloat16, ElemType::kFloat32>();
}
TEST(KernelEmulation, StoreBf16WidenedMatchesHostPath) {
  expect_store_matches_host_all_layouts<ElemType::kBFloat16, ElemType::kFloat32>();
}
TEST(KernelEmulation, StoreF16NativeMatchesHostPath) {
  expect_store_matches_host_all_layouts<ElemType::kFloat16, ElemType::kFloat16>();
}
TEST(KernelEmulation, StoreBf16NativeMatchesHostPath) {
  expect_store_matches_host_all_layouts<ElemType::kBFloat16, ElemType::kBFloat16>();
}

void expect_restore_matches_host(ElemType type, int64_t cols, int64_t stride, int64_t src_shift) {
  const auto esize = static_cast<int64_t>(elem_bytes(type));
  const int64_t rows = 7;
  auto pool = random_bytes(static_cast<size_t>((rows * cols + src_shift) * esize + 64), 11);
  // Two segments: a long one from a shifted source and a short one, like two pool blocks.
  const int64_t split = 3 * cols + 2;
  const GatherSegment segs[2] = {
      {pool.data() + src_shift * esize, 0, split, type},
      {pool.data() + (src_shift + split) * esize, split, rows * cols - split, type}};
  std::vector<float> got(static_cast<size_t>(rows * stride), -1.0f);
  std::vector<float> want = got;
  const OutputView out_got{got.data(), cols, stride};
  const OutputView out_want{want.data(), cols, stride};
  for (const GatherSegment& seg : segs) {
    for_each_tile(seg.dst_elem, seg.count, cols, stride == cols, tile_elems(type),
                  [&](int64_t o, int64_t n) {
                    const GatherSegment tile{static_cast<const unsigned char*>(seg.src) + o * esize,
                                             seg.dst_elem + o, n, seg.src_type};
                    for (int lane = 0; lane < kBlockThreads; ++lane) {
                      restore_tile_any(tile, out_got, lane, kBlockThreads);
                    }
                  });
  }
  detail::host_restore(segs, out_want);
  ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << "type " << static_cast<int>(type) << " cols " << cols << " stride " << stride << " shift "
      << src_shift;
}

TEST(KernelEmulation, RestoreMatchesHostPathForEveryStorageType) {
  for (ElemType type : {ElemType::kFloat32, ElemType::kFloat16, ElemType::kBFloat16}) {
    for (int64_t cols : {8, 13, 4096}) {
      for (int64_t pad : {0, 5}) {
        for (int64_t shift : {0, 1, 4}) expect_restore_matches_host(type, cols, cols + pad, shift);
      }
    }
  }
}

}  // namespace
}  // namespace hss::kernels
