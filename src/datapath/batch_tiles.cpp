#include "datapath/batch_tiles.hpp"

#include <algorithm>

#include "hss/kernels/tiling.hpp"

namespace hss::detail {

using kernels::elem_bytes;
using kernels::tile_elems;

namespace {

/// Advances the cursor past segment `count` elements long once it is fully tiled.
template <typename Job>
void next_segment_if_done(std::span<const Job> jobs, TileCursor& cursor, int64_t count) {
  if (cursor.consumed < count) return;
  cursor.consumed = 0;
  if (++cursor.segment == jobs[cursor.job].segments.size()) {
    cursor.segment = 0;
    ++cursor.job;
  }
}

/// Skips jobs without segments so that the cursor names a real segment or the end.
template <typename Job>
void skip_empty_jobs(std::span<const Job> jobs, TileCursor& cursor) {
  while (cursor.job < jobs.size() && cursor.segment >= jobs[cursor.job].segments.size()) {
    cursor.segment = 0;
    cursor.consumed = 0;
    ++cursor.job;
  }
}

}  // namespace

size_t fill_store_tiles(std::span<const StoreJob> jobs, TileCursor& cursor,
                        std::span<kernels::BatchStoreTile> table) {
  size_t n = 0;
  for (skip_empty_jobs(jobs, cursor); cursor.job < jobs.size() && n < table.size();
       skip_empty_jobs(jobs, cursor)) {
    const StoreJob& job = jobs[cursor.job];
    const kernels::WriteSegment& seg = job.segments[cursor.segment];
    const bool contiguous = job.src.row_stride == job.src.cols;
    const int64_t max_elems = tile_elems(job.src.type);
    const auto dst_esize = static_cast<int64_t>(elem_bytes(seg.dst_type));
    while (cursor.consumed < seg.count && n < table.size()) {
      const int64_t first = seg.src_elem + cursor.consumed;
      int64_t m = std::min(seg.count - cursor.consumed, max_elems);
      if (!contiguous) m = std::min(m, job.src.cols - first % job.src.cols);
      table[n++] = {job.src,
                    {static_cast<unsigned char*>(seg.dst) + cursor.consumed * dst_esize,
                     seg.src_row0, first, m, seg.dst_type, seg.scale}};
      cursor.consumed += m;
    }
    next_segment_if_done(jobs, cursor, seg.count);
  }
  return n;
}

size_t fill_restore_tiles(std::span<const RestoreJob> jobs, TileCursor& cursor,
                          std::span<kernels::BatchRestoreTile> table) {
  size_t n = 0;
  for (skip_empty_jobs(jobs, cursor); cursor.job < jobs.size() && n < table.size();
       skip_empty_jobs(jobs, cursor)) {
    const RestoreJob& job = jobs[cursor.job];
    const kernels::GatherSegment& seg = job.segments[cursor.segment];
    const bool contiguous = job.out.row_stride == job.out.cols;
    const int64_t max_elems = tile_elems(seg.src_type);
    const auto src_esize = static_cast<int64_t>(elem_bytes(seg.src_type));
    while (cursor.consumed < seg.count && n < table.size()) {
      const int64_t flat = seg.dst_elem + cursor.consumed;
      int64_t m = std::min(seg.count - cursor.consumed, max_elems);
      if (!contiguous) m = std::min(m, job.out.cols - flat % job.out.cols);
      table[n++] = {{static_cast<const unsigned char*>(seg.src) + cursor.consumed * src_esize, flat,
                     m, seg.src_type, seg.scale},
                    job.out};
      cursor.consumed += m;
    }
    next_segment_if_done(jobs, cursor, seg.count);
  }
  return n;
}

bool tiles_left(std::span<const StoreJob> jobs, TileCursor& cursor) {
  skip_empty_jobs(jobs, cursor);
  return cursor.job < jobs.size();
}

bool tiles_left(std::span<const RestoreJob> jobs, TileCursor& cursor) {
  skip_empty_jobs(jobs, cursor);
  return cursor.job < jobs.size();
}

}  // namespace hss::detail
