#pragma once
// Where a hidden-state entry's elements live and how rows map between the caller's tensors, the
// pool and the restored prefix. Shared by the kernels (kernels/*.cu) and the host path
// (src/datapath/host/host_data_path.cpp).
//
// An entry is `rows x cols` elements of its storage type, row-major, laid over a list of pool
// blocks of `block_bytes` each: entry element e lives in block (e * esize) / block_bytes at byte
// (e * esize) % block_bytes. block_bytes is a multiple of 16, so no element straddles two blocks
// and a block start is 16-byte aligned. An 8-bit (scaled) entry has the same element layout,
// followed by its rows' float32 scales (src/format/row_format.hpp, ScaleLayout::kRowF32Trailing);
// its segments then lie inside one row each and carry the address of that row's scale.

#include <cstdint>

#include "hss/kernels/convert.hpp"
#include "hss/kernels/host_device.hpp"

namespace hss::kernels {

/// The largest byte span of a caller's view (hss/detail/checked.hpp rejects larger ones before
/// any loop or kernel runs). With it, every (row * row_stride + col) * element size and every flat
/// element index below stays under 2^48 and fits in int64_t.
inline constexpr int64_t kMaxViewBytes = int64_t{1} << 48;

/// Host-side check of the bound above: rows x cols with row_stride elements of esize bytes spans
/// at most kMaxViewBytes ((rows - 1) * row_stride + cols elements), computed without overflow.
constexpr bool view_fits(int64_t rows, int64_t cols, int64_t row_stride, int64_t esize) {
  if (rows < 0 || cols < 0 || row_stride < 0 || esize <= 0) return false;
  if (rows == 0) return true;
  int64_t elems = 0;
  int64_t bytes = 0;
  if (__builtin_mul_overflow(rows - 1, row_stride, &elems)) return false;
  if (__builtin_add_overflow(elems, cols, &elems)) return false;
  if (__builtin_mul_overflow(elems, esize, &bytes)) return false;
  return bytes <= kMaxViewBytes;
}

/// A caller's 2-D input (row_stride in elements).
struct SourceView {
  const void* data = nullptr;
  ElemType type = ElemType::kFloat32;
  int64_t cols = 0;
  int64_t row_stride = 0;
};

/// A 2-D restore output of element type `type` (row_stride in elements).
struct OutputView {
  void* data = nullptr;
  int64_t cols = 0;
  int64_t row_stride = 0;
  ElemType type = ElemType::kFloat32;
};

/// A run of elements contiguous in the pool (inside one block) and in the flat prefix order.
/// Restore copies `count` elements from `src` (storage type `src_type`) to flat output elements
/// [dst_elem, dst_elem + count), flat index = row * cols + col of the output.
struct GatherSegment {
  const void* src = nullptr;
  int64_t dst_elem = 0;
  int64_t count = 0;
  ElemType src_type = ElemType::kFloat32;
  /// Scaled storage types: the segment lies in one row, and this is that row's scale in the
  /// pool. nullptr otherwise.
  const float* scale = nullptr;
};

/// A run of elements contiguous in the pool (inside one block) that a store fills from the
/// caller's tensor: flat chunk elements [src_elem, src_elem + count) of the chunk whose first row
/// is caller row `src_row0`, converted to `dst_type`.
struct WriteSegment {
  void* dst = nullptr;
  int64_t src_row0 = 0;
  int64_t src_elem = 0;
  int64_t count = 0;
  ElemType dst_type = ElemType::kFloat32;
  /// Scaled storage types: the segment lies in one row, and this is where that row's scale goes
  /// in the pool (written by the segment that starts the row). nullptr otherwise.
  float* scale = nullptr;
};

/// One tile of a batched store (one launch for every item of a batch on a stream). The items are
/// different tensors, possibly of different types, so each tile carries its source view. `seg.dst`
/// is a pool address the device writes through its mapping (device-mapped pinned memory): no
/// staging, no copy stream.
struct BatchStoreTile {
  SourceView src;
  WriteSegment seg;
};

/// One tile of a batched restore: each item of the batch has its own output.
struct BatchRestoreTile {
  GatherSegment seg;
  OutputView out;
};

/// Address of flat element `flat` (row-major over `cols`) of a strided tensor.
HSS_HOST_DEVICE const void* source_address(const SourceView& s, int64_t row0, int64_t flat) {
  const int64_t row = row0 + flat / s.cols;
  const int64_t col = flat % s.cols;
  const auto* base = static_cast<const unsigned char*>(s.data);
  return base + (row * s.row_stride + col) * static_cast<int64_t>(elem_bytes(s.type));
}

/// Output address of flat prefix element `flat`.
HSS_HOST_DEVICE void* output_address(const OutputView& o, int64_t flat) {
  return static_cast<unsigned char*>(o.data) + ((flat / o.cols) * o.row_stride + flat % o.cols) *
                                                   static_cast<int64_t>(elem_bytes(o.type));
}

/// The scale of source row `row` stored as the 8-bit type `t` (convert.hpp, row_scale): one pass
/// over the row's cols elements.
HSS_HOST_DEVICE float source_row_scale(const SourceView& s, int64_t row, ElemType t) {
  const auto* base = static_cast<const unsigned char*>(s.data) +
                     row * s.row_stride * static_cast<int64_t>(elem_bytes(s.type));
  float amax = 0.0f;
  for (int64_t c = 0; c < s.cols; ++c) amax = amax_add(amax, load_as_float(base, c, s.type));
  return row_scale(amax, t);
}

/// Writes source element `flat` of a store (already widened or kept at 16 bits, or quantised
/// against its row's scale) into `dst[i]`.
HSS_HOST_DEVICE void store_element(const SourceView& s, int64_t row0, int64_t flat, void* dst,
                                   int64_t i, ElemType dst_type) {
  const void* src = source_address(s, row0, flat);
  switch (dst_type) {
    case ElemType::kFp8E4M3:
    case ElemType::kFp8E5M2: {  // the row's scale recomputed: O(cols), a scalar reference only
      const float scale = source_row_scale(s, row0 + flat / s.cols, dst_type);
      HSS_DEVICE_ACCESS(static_cast<uint8_t*>(dst) + i, 1, true);
      static_cast<uint8_t*>(dst)[i] = quantise(load_as_float(src, 0, s.type), scale, dst_type);
      return;
    }
    case ElemType::kFloat32: {
      const float value = load_as_float(src, 0, s.type);
      HSS_DEVICE_ACCESS(static_cast<float*>(dst) + i, 4, true);
      static_cast<float*>(dst)[i] = value;
      return;
    }
    case ElemType::kFloat16:
    case ElemType::kBFloat16:  // native 16-bit storage keeps the caller's bits
      HSS_DEVICE_ACCESS(src, 2, false);
      HSS_DEVICE_ACCESS(static_cast<uint16_t*>(dst) + i, 2, true);
      static_cast<uint16_t*>(dst)[i] = *static_cast<const uint16_t*>(src);
      return;
  }
}

/// Restores element i of a segment into the output: the stored bits when the output has the
/// storage type (bit-identical, NaN payloads included), else widened to float32 and, for a 16-bit
/// output, rounded to nearest-even.
HSS_HOST_DEVICE void restore_element(const GatherSegment& seg, int64_t i, const OutputView& out) {
  void* dst = output_address(out, seg.dst_elem + i);
  if (seg.src_type == out.type) {
    switch (out.type) {
      case ElemType::kFloat32:
        HSS_DEVICE_ACCESS(static_cast<const float*>(seg.src) + i, 4, false);
        HSS_DEVICE_ACCESS(dst, 4, true);
        *static_cast<float*>(dst) = static_cast<const float*>(seg.src)[i];
        return;
      case ElemType::kFloat16:
      case ElemType::kBFloat16:
        HSS_DEVICE_ACCESS(static_cast<const uint16_t*>(seg.src) + i, 2, false);
        HSS_DEVICE_ACCESS(dst, 2, true);
        *static_cast<uint16_t*>(dst) = static_cast<const uint16_t*>(seg.src)[i];
        return;
      case ElemType::kFp8E4M3:  // never an output type (outputs are hss::DType views)
      case ElemType::kFp8E5M2:
        break;
    }
  }
  if (is_scaled(seg.src_type)) {
    HSS_DEVICE_ACCESS(seg.scale, 4, false);
    HSS_DEVICE_ACCESS(static_cast<const uint8_t*>(seg.src) + i, 1, false);
    store_from_float(dst, 0, out.type,
                     dequantise(static_cast<const uint8_t*>(seg.src)[i], *seg.scale, seg.src_type));
    return;
  }
  store_from_float(dst, 0, out.type, load_as_float(seg.src, i, seg.src_type));
}

/// Splits flat entry elements [first, first + count) into the pieces that lie in one block each.
/// Calls piece(block_index, byte_offset_in_block, first_elem_of_piece, elems_in_piece).
template <typename PieceFn>
HSS_HOST_DEVICE void for_each_block_piece(int64_t first, int64_t count, int64_t esize,
                                          int64_t block_bytes, PieceFn&& piece) {
  if (count <= 0) return;
  const int64_t per_block = block_bytes / esize;
  // One division for the first piece (none when it starts in block 0, the common case); every
  // later piece starts its block. Divisions cost tens of cycles each on this per-chunk path.
  int64_t block = 0;
  int64_t in_block = first;
  if (first >= per_block) {
    block = first / per_block;
    in_block = first - block * per_block;
  }
  while (count > 0) {
    const int64_t n = (per_block - in_block) < count ? (per_block - in_block) : count;
    piece(block, in_block * esize, first, n);
    first += n;
    count -= n;
    ++block;
    in_block = 0;
  }
}

}  // namespace hss::kernels
