// host_store / host_restore (data_path.hpp): the segments of a call laid end to end are one flat
// range of elements; a call on one thread copies it all, a call split over copy workers gives
// each thread a contiguous part of it. The stores each part uses (host_copy.hpp) depend on the
// bytes of the whole call, so every split writes what one thread would.
#include <algorithm>
#include <cstdint>

#include "datapath/data_path.hpp"
#include "datapath/host/copy_workers.hpp"
#include "datapath/host/fp8_rows.hpp"
#include "datapath/host/host_copy.hpp"
#include "hss/kernels/elem_visit.hpp"

namespace hss::detail {
namespace {

using kernels::ElemType;

static_assert(HostCopyContext{}.min_split_bytes == kMinBytesPerCopyThread,
              "data_path.hpp spells the default of copy_workers.hpp");

/// Split points fall on multiples of this many elements (64 bytes of float32), so two threads
/// rarely share a destination cache line.
constexpr int64_t kSplitAlignElems = 16;

/// Which of a call's operations stream, from the bytes the whole call writes.
Streaming streaming_for(const HostCopy& strategy, uint64_t bytes) {
  return {bytes >= strategy.copy_stream_bytes(), bytes >= strategy.widen_stream_bytes()};
}

// Calls run(first_flat, n) for the pieces of [flat, flat + count) that stay inside one row, or once
// for the whole range when rows are contiguous.
template <typename RunFn>
void for_each_row_run(int64_t flat, int64_t count, int64_t cols, bool contiguous, RunFn&& run) {
  if (contiguous) {
    run(flat, count);
    return;
  }
  while (count > 0) {
    const int64_t n = std::min(cols - flat % cols, count);
    run(flat, n);
    flat += n;
    count -= n;
  }
}

/// Calls piece(segment, first, n) for the part [first, first + n) of each segment that lies in
/// [begin, end) of the segments' elements laid end to end.
template <typename Segment, typename PieceFn>
void for_each_in_range(std::span<const Segment> segments, int64_t begin, int64_t end,
                       PieceFn&& piece) {
  int64_t offset = 0;
  for (const Segment& seg : segments) {
    if (offset >= end) break;
    const int64_t lo = std::max(begin, offset);
    const int64_t hi = std::min(end, offset + seg.count);
    if (lo < hi) piece(seg, lo - offset, hi - lo);
    offset += seg.count;
  }
}

/// Element p of `parts` split points of [0, total).
int64_t split_point(int64_t total, size_t parts, size_t p) {
  if (p >= parts) return total;
  const int64_t at = total / static_cast<int64_t>(parts) * static_cast<int64_t>(p);
  return at / kSplitAlignElems * kSplitAlignElems;
}

/// Runs body(begin, end) over the flat range [0, total) of a call writing `bytes`: once on the
/// calling thread, or in parts over the context's workers. Each part fences its own streaming
/// stores before it returns, so they are ordered before the caller publishes anything.
/// How many threads copy a call writing `bytes` (1: the calling thread alone).
size_t parts_for(const HostCopyContext& context, uint64_t bytes) {
  if (context.workers == nullptr) return 1;
  return std::min<uint64_t>(static_cast<uint64_t>(context.workers->threads()),
                            bytes / std::max<uint64_t>(context.min_split_bytes, 1));
}

/// True when the call is plain copies on the calling thread: contiguous rows, one part, no
/// streaming stores, and every segment already of the destination type. Such a call is one
/// copy_bytes per segment (small items, an engine step's batch): what the general walk below
/// computes for it, without its per-piece bookkeeping.
template <typename Segment, typename SameType>
bool plain_copies(const HostCopyContext& context, bool contiguous, uint64_t bytes,
                  const Streaming& streaming, std::span<const Segment> segments,
                  SameType&& same_type) {
  if (!contiguous || streaming.any() || parts_for(context, bytes) > 1) return false;
  return std::all_of(segments.begin(), segments.end(), same_type);
}

template <typename Body>
void run_parts(const HostCopyContext& context, int64_t total, uint64_t bytes,
               const Streaming& streaming, Body&& body) {
  const size_t parts = parts_for(context, bytes);
  if (parts <= 1) {
    body(int64_t{0}, total);
    end_streaming(streaming.any());
    return;
  }
  auto part = [&](size_t p) {
    body(split_point(total, parts, p), split_point(total, parts, p + 1));
    end_streaming(streaming.any());
  };
  context.workers->run(parts, part);
}

}  // namespace

void host_store(const kernels::SourceView& src, std::span<const kernels::WriteSegment> segments,
                const HostCopyContext& context) {
  const HostCopy& strategy = context.strategy ? *context.strategy : default_host_copy();
  const bool contiguous = src.row_stride == src.cols;
  int64_t total = 0;
  uint64_t bytes = 0;
  for (const kernels::WriteSegment& seg : segments) {
    total += seg.count;
    bytes += static_cast<uint64_t>(seg.count) * kernels::elem_bytes(seg.dst_type);
  }
  const Streaming streaming = streaming_for(strategy, bytes);
  const auto src_bytes = static_cast<int64_t>(kernels::elem_bytes(src.type));
  if (plain_copies(context, contiguous, bytes, streaming, segments,
                   [&](const kernels::WriteSegment& seg) { return seg.dst_type == src.type; })) {
    const auto* base = static_cast<const unsigned char*>(src.data);
    for (const kernels::WriteSegment& seg : segments) {
      copy_bytes(seg.dst, base + (seg.src_row0 * src.row_stride + seg.src_elem) * src_bytes,
                 static_cast<size_t>(seg.count * src_bytes), false, strategy.isa);
    }
    return;
  }
  run_parts(context, total, bytes, streaming, [&](int64_t begin, int64_t end) {
    for_each_in_range(
        segments, begin, end, [&](const kernels::WriteSegment& seg, int64_t first, int64_t n) {
          auto* dst = static_cast<unsigned char*>(seg.dst);
          if (kernels::is_scaled(seg.dst_type)) {
            // The segment lies in one row (the planner splits scaled entries by row). Each part
            // of a split computes the row's scale from the whole source row, so every part and
            // the scale agree; the part holding the row's first element writes the scale.
            const int64_t row = seg.src_row0 + seg.src_elem / src.cols;
            const float scale = fp8_row_scale(src, row, seg.dst_type, strategy.isa);
            if (first == 0 && seg.src_elem % src.cols == 0) *seg.scale = scale;
            fp8_quantise_run(kernels::source_address(src, seg.src_row0, seg.src_elem + first),
                             src.type, dst + first, n, scale, seg.dst_type, strategy.isa);
            return;
          }
          const auto dst_bytes = static_cast<int64_t>(kernels::elem_bytes(seg.dst_type));
          for_each_row_run(
              seg.src_elem + first, n, src.cols, contiguous, [&](int64_t flat, int64_t k) {
                // Contiguous rows: the flat offset is the element offset (no division).
                const void* from = contiguous
                                       ? static_cast<const unsigned char*>(src.data) +
                                             (seg.src_row0 * src.row_stride + flat) * src_bytes
                                       : kernels::source_address(src, seg.src_row0, flat);
                void* to = dst + (flat - seg.src_elem) * dst_bytes;
                if (seg.dst_type == src.type) {
                  copy_bytes(to, from, static_cast<size_t>(k * src_bytes), streaming.copies,
                             strategy.isa);
                } else {  // only widening to float32 is ever planned
                  widen(from, src.type, static_cast<float*>(to), k, streaming, strategy.isa);
                }
              });
        });
  });
}

void host_restore(std::span<const kernels::GatherSegment> segments, const kernels::OutputView& out,
                  const HostCopyContext& context) {
  const HostCopy& strategy = context.strategy ? *context.strategy : default_host_copy();
  const bool contiguous = out.row_stride == out.cols;
  const auto out_bytes = static_cast<int64_t>(kernels::elem_bytes(out.type));
  int64_t total = 0;
  for (const kernels::GatherSegment& seg : segments) total += seg.count;
  const auto bytes = static_cast<uint64_t>(total * out_bytes);
  const Streaming streaming = streaming_for(strategy, bytes);
  if (plain_copies(context, contiguous, bytes, streaming, segments,
                   [&](const kernels::GatherSegment& seg) { return seg.src_type == out.type; })) {
    auto* base = static_cast<unsigned char*>(out.data);
    for (const kernels::GatherSegment& seg : segments) {
      copy_bytes(base + seg.dst_elem * out_bytes, seg.src,
                 static_cast<size_t>(seg.count * out_bytes), false, strategy.isa);
    }
    return;
  }
  run_parts(context, total, bytes, streaming, [&](int64_t begin, int64_t end) {
    for_each_in_range(
        segments, begin, end,
        [&](const kernels::GatherSegment& seg, int64_t first_in_seg, int64_t n_seg) {
          const auto* src = static_cast<const unsigned char*>(seg.src);
          if (kernels::is_scaled(seg.src_type)) {  // one row: one scale
            const int64_t flat = seg.dst_elem + first_in_seg;
            void* to = contiguous ? static_cast<unsigned char*>(out.data) + flat * out_bytes
                                  : kernels::output_address(out, flat);
            fp8_dequantise_run(src + first_in_seg, seg.src_type, *seg.scale, to, out.type, n_seg);
            return;
          }
          const auto esize = static_cast<int64_t>(kernels::elem_bytes(seg.src_type));
          for_each_row_run(
              seg.dst_elem + first_in_seg, n_seg, out.cols, contiguous,
              [&](int64_t flat, int64_t n) {
                const int64_t first = flat - seg.dst_elem;
                void* to = contiguous ? static_cast<unsigned char*>(out.data) + flat * out_bytes
                                      : kernels::output_address(out, flat);
                if (seg.src_type == out.type) {  // bit-identical copy
                  copy_bytes(to, src + first * esize, static_cast<size_t>(n * esize),
                             streaming.copies, strategy.isa);
                } else if (out.type == ElemType::kFloat32) {
                  widen(src + first * esize, seg.src_type, static_cast<float*>(to), n, streaming,
                        strategy.isa);
                } else {  // narrowing to 16 bits: the kernels' per-element function, nearest-even
                  const kernels::GatherSegment piece{src + first * esize, 0, n, seg.src_type};
                  const kernels::OutputView row{to, n, n, out.type};
                  for (int64_t i = 0; i < n; ++i) kernels::restore_element(piece, i, row);
                }
              });
        });
  });
}

}  // namespace hss::detail
