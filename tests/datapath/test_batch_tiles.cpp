// The tiling of the batch kernels' launch tables (src/datapath/batch_tiles.hpp) and their host twins,
// on the CPU: every element covered once, tables resumed across jobs, and the twins equal to the
// host path for every type pair, odd widths, 2-byte offsets and strides. (The batched device
// calls themselves run on the CUDA path in tests/gpu/test_device_batch_rules.cpp.)

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "datapath/batch_tiles.hpp"
#include "datapath/data_path.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/kernels/tiling.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

// Host twins of the batch kernels: every lane of a block, one tile after another, through the
// kernels' own per-lane loops (as the CUDA runtime model's twins run them).
void run_store_tiles_on_host(std::span<const kernels::BatchStoreTile> tiles) {
  for (const kernels::BatchStoreTile& tile : tiles) {
    for (int lane = 0; lane < kernels::kBlockThreads; ++lane) {
      kernels::store_tile_any(tile.src, tile.seg, lane, kernels::kBlockThreads);
    }
  }
}

void run_restore_tiles_on_host(std::span<const kernels::BatchRestoreTile> tiles) {
  for (const kernels::BatchRestoreTile& tile : tiles) {
    for (int lane = 0; lane < kernels::kBlockThreads; ++lane) {
      kernels::restore_tile_any(tile.seg, tile.out, lane, kernels::kBlockThreads);
    }
  }
}

// ---- the launch tables

TEST(BatchTiles, TablesCoverEveryElementOnceAndResumeAcrossTables) {
  // Two jobs: a strided f32 source (cols 5, stride 7) in two segments and a contiguous bf16 one;
  // tables of 2 tiles so that tiling resumes mid-segment and across jobs.
  std::vector<float> src_a(4 * 7);
  for (size_t i = 0; i < src_a.size(); ++i) src_a[i] = static_cast<float>(i) + 0.5f;
  std::vector<uint16_t> src_b(6 * 5);
  for (size_t i = 0; i < src_b.size(); ++i) {
    src_b[i] = kernels::float_to_bf16(static_cast<float>(i) * 0.25f);
  }
  std::vector<float> pool(4 * 5 + 6 * 5, -1.0f);
  const kernels::WriteSegment segs_a[] = {{pool.data(), 0, 0, 8, kernels::ElemType::kFloat32},
                                          {pool.data() + 8, 0, 8, 12, kernels::ElemType::kFloat32}};
  const kernels::WriteSegment segs_b[] = {
      {pool.data() + 20, 1, 0, 30 - 5, kernels::ElemType::kFloat32}};  // rows 1..5
  const detail::StoreJob jobs[] = {
      {{src_a.data(), kernels::ElemType::kFloat32, 5, 7}, segs_a},
      {{nullptr, kernels::ElemType::kFloat32, 5, 5}, {}},  // an empty job is skipped
      {{src_b.data(), kernels::ElemType::kBFloat16, 5, 5}, segs_b}};
  detail::TileCursor cursor;
  std::vector<kernels::BatchStoreTile> table(2);
  size_t tables = 0, tiles = 0;
  for (size_t n; (n = detail::fill_store_tiles(jobs, cursor, table)) > 0; ++tables) {
    tiles += n;
    for (size_t i = 0; i < n; ++i) {
      const auto& t = table[i];
      // Strided sources: a tile stays inside one row.
      if (t.src.row_stride != t.src.cols) {
        EXPECT_LE(t.seg.src_elem % t.src.cols + t.seg.count, t.src.cols);
      }
    }
    run_store_tiles_on_host(std::span(table.data(), n));
  }
  EXPECT_EQ(cursor.job, 3u);
  EXPECT_EQ(tables, 3u);
  // Job a: 0-4 | 5-7 (segment 0), 8-9 | 10-14 | 15-19 (segment 1), each inside a source row;
  // job b: its 25 contiguous elements in one tile.
  EXPECT_EQ(tiles, 6u);
  for (int64_t e = 0; e < 20; ++e) {
    EXPECT_EQ(pool[static_cast<size_t>(e)], src_a[static_cast<size_t>(e / 5 * 7 + e % 5)]) << e;
  }
  for (int64_t e = 0; e < 25; ++e) {
    EXPECT_EQ(pool[static_cast<size_t>(20 + e)],
              kernels::bf16_to_float(src_b[static_cast<size_t>(5 + e)]))
        << e;
  }

  // Restore tables back into a strided f16 output (cols 5, stride 6) from the pool.
  std::vector<uint16_t> out(9 * 6, 0xFFFF);
  const kernels::GatherSegment gathers[] = {
      {pool.data(), 0, 20, kernels::ElemType::kFloat32},
      {pool.data() + 20, 20, 25, kernels::ElemType::kFloat32}};
  const detail::RestoreJob restores[] = {
      {gathers, {out.data(), 5, 6, kernels::ElemType::kFloat16}}};
  detail::TileCursor rc;
  std::vector<kernels::BatchRestoreTile> rtable(2);
  size_t rtiles = 0;
  for (size_t n; (n = detail::fill_restore_tiles(restores, rc, rtable)) > 0;) {
    rtiles += n;
    run_restore_tiles_on_host(std::span(rtable.data(), n));
  }
  EXPECT_EQ(rtiles, 9u);  // one per output row
  for (int64_t e = 0; e < 45; ++e) {
    EXPECT_EQ(out[static_cast<size_t>(e / 5 * 6 + e % 5)],
              kernels::float_to_f16(pool[static_cast<size_t>(e)]))
        << e;
  }
  for (int64_t r = 0; r < 9; ++r) EXPECT_EQ(out[static_cast<size_t>(r * 6 + 5)], 0xFFFF) << r;
}

// The batch kernels' host twins against the host path, for every supported (source, storage)
// pair, every (storage, output) pair, odd widths, 2-byte base offsets and strided views, many jobs
// in one table: bit-identical (the same per-element functions; this checks the tiling and the
// per-tile views).
TEST(BatchTiles, TwinsEqualTheHostPathForEveryTypePairWidthAndOffset) {
  using kernels::ElemType;
  const std::pair<ElemType, ElemType> store_pairs[] = {{ElemType::kFloat32, ElemType::kFloat32},
                                                       {ElemType::kFloat16, ElemType::kFloat32},
                                                       {ElemType::kBFloat16, ElemType::kFloat32},
                                                       {ElemType::kFloat16, ElemType::kFloat16},
                                                       {ElemType::kBFloat16, ElemType::kBFloat16}};
  const ElemType types[] = {ElemType::kFloat32, ElemType::kFloat16, ElemType::kBFloat16};
  const int64_t widths[] = {1, 7, 2051};
  const int64_t rows = 5;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  // Sources, kept alive for the whole table.
  std::vector<std::vector<std::byte>> sources, pools_twin, pools_host;
  std::vector<std::vector<kernels::WriteSegment>> segs_twin, segs_host;
  std::vector<detail::StoreJob> jobs;
  std::vector<std::pair<ElemType, int64_t>> job_shape;  // storage type, cols
  for (const auto& [src_type, dst_type] : store_pairs) {
    for (const int64_t cols : widths) {
      for (const int64_t pad : {int64_t{0}, int64_t{3}}) {
        const size_t offset = src_type == ElemType::kFloat32 ? 0 : 2;
        const int64_t stride = cols + pad;
        const size_t esize = kernels::elem_bytes(src_type);
        auto& src = sources.emplace_back(offset + static_cast<size_t>(rows * stride) * esize);
        for (int64_t i = 0; i < rows * stride; ++i) {
          test::write_as(static_cast<DType>(static_cast<int>(src_type)), dist(rng),
                         src.data() + offset + static_cast<size_t>(i) * esize);
        }
        const kernels::SourceView view{src.data() + offset, src_type, cols, stride};
        // Two segments: rows 1..2 and rows 3..4 (src_row0 = 1), the second split mid-row.
        const int64_t elems = 4 * cols;
        const size_t dst_esize = kernels::elem_bytes(dst_type);
        auto& twin = pools_twin.emplace_back(static_cast<size_t>(elems) * dst_esize, std::byte{1});
        auto& host = pools_host.emplace_back(twin);
        const int64_t cut = elems / 2 + 1;
        segs_twin.push_back({{twin.data(), 1, 0, cut, dst_type},
                             {twin.data() + cut * dst_esize, 1, cut, elems - cut, dst_type}});
        segs_host.push_back({{host.data(), 1, 0, cut, dst_type},
                             {host.data() + cut * dst_esize, 1, cut, elems - cut, dst_type}});
        detail::host_store(view, segs_host.back());
        jobs.push_back({view, segs_twin.back()});
        job_shape.emplace_back(dst_type, cols);
      }
    }
  }
  detail::TileCursor cursor;
  std::vector<kernels::BatchStoreTile> table(detail::kBatchTilesPerTable);
  const size_t n = detail::fill_store_tiles(jobs, cursor, table);
  EXPECT_EQ(cursor.job, jobs.size());  // every job in one table: one launch
  run_store_tiles_on_host(std::span(table.data(), n));
  for (size_t j = 0; j < jobs.size(); ++j) EXPECT_EQ(pools_twin[j], pools_host[j]) << "store " << j;

  // Restores of every pool above into every output type, strided and not, in one table.
  std::vector<std::vector<kernels::GatherSegment>> gathers;
  std::vector<std::vector<std::byte>> outs_twin, outs_host;
  std::vector<detail::RestoreJob> restores;
  gathers.reserve(jobs.size() * 6);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const auto [storage, cols] = job_shape[j];
    const int64_t elems = 4 * cols;
    const size_t src_esize = kernels::elem_bytes(storage);
    for (const ElemType out_type : types) {
      for (const int64_t pad : {int64_t{0}, int64_t{5}}) {
        const int64_t stride = cols + pad;
        const size_t out_esize = kernels::elem_bytes(out_type);
        auto& twin =
            outs_twin.emplace_back(static_cast<size_t>(4 * stride) * out_esize, std::byte{0x77});
        auto& host = outs_host.emplace_back(twin);
        // Two gathers: the pool's second half first, to flat output elements out of order.
        const int64_t half = elems / 2;
        auto& g = gathers.emplace_back(std::vector<kernels::GatherSegment>{
            {pools_host[j].data() + half * src_esize, half, elems - half, storage},
            {pools_host[j].data(), 0, half, storage}});
        detail::host_restore(g, {host.data(), cols, stride, out_type});
        restores.push_back({g, {twin.data(), cols, stride, out_type}});
      }
    }
  }
  detail::TileCursor rc;
  std::vector<kernels::BatchRestoreTile> rtable(detail::kBatchTilesPerTable);
  const size_t rn = detail::fill_restore_tiles(restores, rc, rtable);
  EXPECT_EQ(rc.job, restores.size());
  run_restore_tiles_on_host(std::span(rtable.data(), rn));
  for (size_t r = 0; r < restores.size(); ++r) {
    EXPECT_EQ(outs_twin[r], outs_host[r]) << "restore " << r;
  }
}

}  // namespace
}  // namespace hss
