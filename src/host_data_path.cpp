#include <cstring>

#include "data_path.hpp"

namespace hss::detail {
namespace {

using kernels::ElemType;

// Widening loops: plain enough for the compiler to vectorise the bfloat16 case.
void widen(const void* src, ElemType type, float* dst, int64_t n) {
  if (type == ElemType::kFloat32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if (type == ElemType::kBFloat16) {
    const auto* in = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::bf16_to_float(in[i]);
  } else {
    const auto* in = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::f16_to_float(in[i]);
  }
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

}  // namespace

void host_store(const kernels::SourceView& src, std::span<const kernels::WriteSegment> segments) {
  const bool contiguous = src.row_stride == src.cols;
  const auto src_bytes = static_cast<int64_t>(kernels::elem_bytes(src.type));
  for (const kernels::WriteSegment& seg : segments) {
    auto* dst = static_cast<unsigned char*>(seg.dst);
    const auto dst_bytes = static_cast<int64_t>(kernels::elem_bytes(seg.dst_type));
    for_each_row_run(seg.src_elem, seg.count, src.cols, contiguous, [&](int64_t flat, int64_t n) {
      const void* from = kernels::source_address(src, seg.src_row0, flat);
      void* to = dst + (flat - seg.src_elem) * dst_bytes;
      if (seg.dst_type == src.type) {
        std::memcpy(to, from, static_cast<size_t>(n * src_bytes));
      } else {  // only widening to float32 is ever planned
        widen(from, src.type, static_cast<float*>(to), n);
      }
    });
  }
}

void host_restore(std::span<const kernels::GatherSegment> segments, const kernels::OutputView& out) {
  const bool contiguous = out.row_stride == out.cols;
  for (const kernels::GatherSegment& seg : segments) {
    const auto* src = static_cast<const unsigned char*>(seg.src);
    const auto esize = static_cast<int64_t>(kernels::elem_bytes(seg.src_type));
    for_each_row_run(seg.dst_elem, seg.count, out.cols, contiguous, [&](int64_t flat, int64_t n) {
      widen(src + (flat - seg.dst_elem) * esize, seg.src_type, kernels::output_address(out, flat),
            n);
    });
  }
}

}  // namespace hss::detail
