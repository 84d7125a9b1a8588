#pragma once
// The kernels' FP8 tiles: the store quantises a tile of one source row against the row's scale
// and the restore dequantises a tile of codes into a float32, bfloat16 or float16 output. The
// rules are convert.hpp's (row_scale, quantise_as, dequantise_as), the ones the host path runs
// (src/datapath/host/fp8_rows.cpp), so a row has the same codes and the same scale in the pool
// whichever path stored it.
//
// An FP8 tile lies in one row (the store's planners cut scaled entries per row and granule,
// row_format.hpp), and the row's scale needs the whole row's amax, which the threads of a block
// find together: each lane folds its share (row_amax_bits_part), the block reduces the shares
// (a maximum: any grouping gives source_row_scale's value), then every lane quantises its
// elements (quantise_tile). On the device the reduction is the kernels' (kernels/gather_cast.cu:
// warp shuffles and shared memory); on the host, quantise_tile_lanes runs the lanes one after
// another (the CUDA model's twins and the CPU tests). The tile that starts the row writes its
// scale (write_row_scale); every other tile of the row computes the same one.
//
// Restore needs no cooperation: the scale is in the pool beside the codes (GatherSegment::scale).

#include <cstdint>
#include <cstring>

#include "hss/kernels/convert.hpp"
#include "hss/kernels/elem_visit.hpp"
#include "hss/kernels/host_device.hpp"
#include "hss/kernels/layout.hpp"
#include "hss/kernels/tiling.hpp"

namespace hss::kernels {

/// The source row an FP8 store tile lies in.
HSS_HOST_DEVICE int64_t tile_row(const SourceView& src, const WriteSegment& tile) {
  return tile.src_row0 + tile.src_elem / src.cols;
}

/// Lane `lane`'s share of the amax of source row `row`: the largest finite_magnitude_bits of its
/// elements lane, lane + lanes, ... (the bits of a non-negative float order as the float does).
template <ElemType S>
HSS_HOST_DEVICE uint32_t row_amax_bits_part(const SourceView& src, int64_t row, int lane,
                                            int lanes) {
  const auto* base = static_cast<const unsigned char*>(src.data) +
                     row * src.row_stride * static_cast<int64_t>(elem_bytes(S));
  uint32_t amax = 0;
  for (int64_t c = lane; c < src.cols; c += lanes) {
    const uint32_t bits = finite_magnitude_bits(load_as_float(base, c, S));
    amax = bits > amax ? bits : amax;
  }
  return amax;
}

/// Writes the row's scale when `tile` starts its row and carries the scale's address.
HSS_HOST_DEVICE void write_row_scale(const SourceView& src, const WriteSegment& tile, float scale) {
  if (tile.scale == nullptr || tile.src_elem % src.cols != 0) return;
  HSS_DEVICE_ACCESS(tile.scale, 4, true);
  *tile.scale = scale;
}

/// 4 bytes (one 32-bit store on the device): the codes of a vector of four float32 elements.
HSS_HOST_DEVICE void store_vec4(void* p, uint32_t w) {
  HSS_DEVICE_ACCESS(p, 4, true);
#if defined(__CUDA_ARCH__)
  *static_cast<uint32_t*>(p) = w;
#else
  std::memcpy(p, &w, sizeof w);
#endif
}

/// Quantises one 16-byte source vector of type S (4 float32 or 8 16-bit elements) against
/// `scale` into codes of T at `dst` (4 or 8 bytes).
template <ElemType S, ElemType T>
HSS_HOST_DEVICE void quantise_store_vec16(const Vec16& in, void* dst, float scale) {
  if constexpr (S == ElemType::kFloat32) {
    uint32_t w = 0;
    for (int k = 0; k < 4; ++k) {
      w |= static_cast<uint32_t>(quantise_as<T>(bits_to_float(in.w[k]), scale)) << (8 * k);
    }
    store_vec4(dst, w);
  } else {
    uint32_t w[2] = {0, 0};
    for (int k = 0; k < 8; ++k) {
      const float f = half_to_float<S>(half_of(in, k));
      w[k / 4] |= static_cast<uint32_t>(quantise_as<T>(f, scale)) << (8 * (k % 4));
    }
    store_vec8(dst, w[0], w[1]);
  }
}

/// Lane `lane`'s part of an FP8 store tile, given its row's scale: source type S, codes of T.
template <ElemType S, ElemType T>
HSS_HOST_DEVICE void quantise_tile(const SourceView& src, const WriteSegment& tile, float scale,
                                   int lane, int lanes) {
  const void* first = source_address(src, tile.src_row0, tile.src_elem);
  auto* codes = static_cast<uint8_t*>(tile.dst);
  tile_loop<elem_bytes(S), 1>(
      first, tile.dst, tile.count, lane, lanes,
      [&](int64_t i) {  // the tile lies in one row: its source is contiguous
        const float x = load_as_float(first, i, S);
        HSS_DEVICE_ACCESS(codes + i, 1, true);
        codes[i] = quantise_as<T>(x, scale);
      },
      [&](const Vec16& in, void* out) { quantise_store_vec16<S, T>(in, out, scale); });
}

/// A whole FP8 store tile with the block's `lanes` lanes run one after another: every lane's
/// share of the amax, the scale, then every lane's codes. Host code (the model's twins, tests).
template <ElemType S, ElemType T>
void quantise_tile_lanes(const SourceView& src, const WriteSegment& tile, int lanes) {
  if (tile.count <= 0) return;
  uint32_t amax = 0;
  for (int lane = 0; lane < lanes; ++lane) {
    const uint32_t part = row_amax_bits_part<S>(src, tile_row(src, tile), lane, lanes);
    amax = part > amax ? part : amax;
  }
  const float scale = row_scale(bits_to_float(amax), T);
  write_row_scale(src, tile, scale);
  for (int lane = 0; lane < lanes; ++lane) quantise_tile<S, T>(src, tile, scale, lane, lanes);
}

/// Calls fn.template operator()<S, T>() for an FP8 store pair: an unscaled source type S and an
/// 8-bit storage type T. False (nothing called) for any other pair.
template <typename Fn>
HSS_HOST_DEVICE bool visit_quantise_pair(ElemType src, ElemType dst, Fn&& fn) {
  bool called = false;
  (void)visit_elem_type(src, [&]<ElemType S>() {
    called = visit_fp8_type(dst, [&]<ElemType T>() { fn.template operator()<S, T>(); });
  });
  return called;
}

/// quantise_tile_lanes for the pair a tile names at run time (the batched store's host twin); an
/// unsupported pair writes nothing.
inline void quantise_tile_lanes_any(const SourceView& src, const WriteSegment& tile, int lanes) {
  (void)visit_quantise_pair(src.type, tile.dst_type, [&]<ElemType S, ElemType T>() {
    quantise_tile_lanes<S, T>(src, tile, lanes);
  });
}

/// Dequantises 16 codes of T against `scale` into 16 elements of D at `dst` (64 or 32 bytes).
template <ElemType T, ElemType D>
HSS_HOST_DEVICE void dequantise_store_vec16(const Vec16& in, void* dst, float scale) {
  auto* out = static_cast<unsigned char*>(dst);
  if constexpr (D == ElemType::kFloat32) {
    for (int q = 0; q < 4; ++q) {
      Vec16 v;
      for (int k = 0; k < 4; ++k) {
        const auto code = static_cast<uint8_t>(in.w[q] >> (8 * k));
        v.w[k] = float_to_bits(dequantise_as<T>(code, scale));
      }
      store_vec16(out + q * kVectorBytes, v);
    }
  } else {
    for (int h = 0; h < 2; ++h) {
      Vec16 v;
      for (int k = 0; k < 4; ++k) {
        const uint32_t word = in.w[2 * h + k / 2];
        const auto lo = static_cast<uint8_t>(word >> (16 * (k % 2)));
        const auto hi = static_cast<uint8_t>(word >> (16 * (k % 2) + 8));
        v.w[k] = static_cast<uint32_t>(narrow_from_float<D>(dequantise_as<T>(lo, scale))) |
                 (static_cast<uint32_t>(narrow_from_float<D>(dequantise_as<T>(hi, scale))) << 16);
      }
      store_vec16(out + h * kVectorBytes, v);
    }
  }
}

/// Lane `lane`'s part of an FP8 restore tile: codes of T into an output of type D.
template <ElemType T, ElemType D>
HSS_HOST_DEVICE void dequantise_tile(const GatherSegment& tile, const OutputView& out, int lane,
                                     int lanes) {
  if (tile.count <= 0) return;
  HSS_DEVICE_ACCESS(tile.scale, 4, false);
  const float scale = *tile.scale;
  tile_loop<1, elem_bytes(D)>(
      tile.src, output_address(out, tile.dst_elem), tile.count, lane, lanes,
      [&](int64_t i) { restore_element(tile, i, out); },
      [&](const Vec16& in, void* dst) { dequantise_store_vec16<T, D>(in, dst, scale); });
}

}  // namespace hss::kernels
