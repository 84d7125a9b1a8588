#pragma once
// How the CUDA kernels split the store's and the restore's segments into per-block tiles, and the
// per-tile copy loop they run. Everything here is HSS_HOST_DEVICE so the CPU tests run the exact
// loop a thread block runs (tests/kernels/test_kernel_logic.cpp emulates the lanes of a block).
//
// A tile is a GatherSegment (restore) or a WriteSegment (store) no longer than kTileBytes of
// source that, when rows are strided, stays inside one row: its source and destination are then
// both contiguous, and a run of 16-byte vectors covers everything but a scalar head and tail.
// Scalar elements go through store_element / restore_element (layout.hpp); vector lanes through
// the same conversion functions (convert.hpp), so both paths produce identical bits.

#include <cstdint>
#include <cstring>

#include "hss/kernels/convert.hpp"
#include "hss/kernels/elem_visit.hpp"
#include "hss/kernels/host_device.hpp"
#include "hss/kernels/layout.hpp"

namespace hss::kernels {

/// Source bytes one thread block moves per tile: 256 threads x 4 vectors x 16 bytes.
inline constexpr int kBlockThreads = 256;
inline constexpr int kUnroll = 4;
inline constexpr int64_t kVectorBytes = 16;
inline constexpr int64_t kTileBytes = kBlockThreads * kUnroll * kVectorBytes;

/// Elements of type `t` in one tile (a multiple of every vector width).
HSS_HOST_DEVICE constexpr int64_t tile_elems(ElemType t) {
  return kTileBytes / static_cast<int64_t>(elem_bytes(t));
}

/// Calls tile(offset, n) for consecutive pieces of flat elements [flat, flat + count), each at most
/// max_elems long and, unless `contiguous`, inside one row of `cols` elements. offset counts from
/// `flat`.
template <typename TileFn>
HSS_HOST_DEVICE void for_each_tile(int64_t flat, int64_t count, int64_t cols, bool contiguous,
                                   int64_t max_elems, TileFn&& tile) {
  int64_t offset = 0;
  while (offset < count) {
    int64_t n = count - offset;
    if (!contiguous) {
      const int64_t left_in_row = cols - (flat + offset) % cols;
      n = n < left_in_row ? n : left_in_row;
    }
    n = n < max_elems ? n : max_elems;
    tile(offset, n);
    offset += n;
  }
}

/// A run of `count` elements split into a scalar head (until the source is 16-byte aligned),
/// `vectors` 16-byte source vectors and a scalar tail. vectors == 0 when the destination is not
/// 16-byte aligned once the source is (mismatched phase) or an element is misaligned.
struct VectorPlan {
  int64_t head = 0;
  int64_t vectors = 0;
  int64_t tail_begin = 0;  ///< first element of the scalar tail (head + vectors * per_vector)
};

HSS_HOST_DEVICE VectorPlan plan_vectors(uint64_t src_addr, uint64_t dst_addr, int64_t count,
                                        int64_t src_esize, int64_t dst_esize) {
  VectorPlan plan;
  if (src_addr % static_cast<uint64_t>(src_esize) != 0 ||
      dst_addr % static_cast<uint64_t>(dst_esize) != 0) {
    return plan;  // all scalar
  }
  const int64_t per_vector = kVectorBytes / src_esize;
  int64_t head =
      static_cast<int64_t>((kVectorBytes - src_addr % kVectorBytes) % kVectorBytes) / src_esize;
  head = head < count ? head : count;
  // A vector's destination is 16 bytes (same width), 32 (widening) or 8 (narrowing float32 to
  // 16 bits): it must be aligned to the access that writes it.
  const int64_t dst_vector_bytes = kVectorBytes / src_esize * dst_esize;
  const auto dst_align =
      static_cast<uint64_t>(dst_vector_bytes < kVectorBytes ? dst_vector_bytes : kVectorBytes);
  const uint64_t dst_at_vectors = dst_addr + static_cast<uint64_t>(head * dst_esize);
  if (dst_at_vectors % dst_align != 0) return plan;
  plan.head = head;
  plan.vectors = (count - head) / per_vector;
  plan.tail_begin = head + plan.vectors * per_vector;
  return plan;
}

/// Where a store segment starts in the staging buffer: the first offset >= cursor whose phase
/// modulo 16 lets the kernel's vector loop run (the destination is 16-byte aligned where the
/// source first is). Staging stays contiguous per segment, so one D2H copy moves it.
HSS_HOST_DEVICE int64_t staging_offset(int64_t cursor, uint64_t src_addr, int64_t src_esize,
                                       int64_t dst_esize) {
  const int64_t aligned = (cursor + kVectorBytes - 1) / kVectorBytes * kVectorBytes;
  if (src_addr % static_cast<uint64_t>(src_esize) != 0) return aligned;
  const auto src_phase_elems = static_cast<int64_t>(src_addr % kVectorBytes) / src_esize;
  return aligned + (src_phase_elems * dst_esize) % kVectorBytes;
}

/// 16 bytes held in registers on the device (one 128-bit load/store) and in memory on the host.
struct alignas(16) Vec16 {
  uint32_t w[4];
};

/// Sources are read once and not written while a kernel runs (the caller's tensor on its own
/// stream; pool blocks whose copies have landed), so the read-only path is safe.
HSS_HOST_DEVICE Vec16 load_vec16(const void* p) {
  HSS_DEVICE_ACCESS(p, 16, false);
#if defined(__CUDA_ARCH__)
  const uint4 v = __ldg(static_cast<const uint4*>(p));
  return Vec16{{v.x, v.y, v.z, v.w}};
#else
  Vec16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}

HSS_HOST_DEVICE void store_vec16(void* p, const Vec16& v) {
  HSS_DEVICE_ACCESS(p, 16, true);
#if defined(__CUDA_ARCH__)
  *static_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
#else
  std::memcpy(p, &v, sizeof v);
#endif
}

/// 8 bytes (one 64-bit store on the device): a narrowed vector of four 16-bit elements.
HSS_HOST_DEVICE void store_vec8(void* p, uint32_t lo, uint32_t hi) {
  HSS_DEVICE_ACCESS(p, 8, true);
#if defined(__CUDA_ARCH__)
  *static_cast<uint2*>(p) = make_uint2(lo, hi);
#else
  const uint32_t w[2] = {lo, hi};
  std::memcpy(p, w, sizeof w);
#endif
}

/// Half k (0..7) of a 16-byte vector of 16-bit elements, little-endian like the memory it came
/// from.
HSS_HOST_DEVICE uint16_t half_of(const Vec16& v, int k) {
  return static_cast<uint16_t>(v.w[k / 2] >> (16 * (k % 2)));
}

/// Converts one 16-byte source vector of type S to D and stores it at `dst`: 16 bytes when S and
/// D have the same width, 32 bytes when 16-bit elements widen to float32, 8 bytes when float32
/// narrows to 16 bits (nearest-even). Same-width different types (float16 <-> bfloat16) go
/// through float32, exactly like the scalar path.
template <ElemType S, ElemType D>
HSS_HOST_DEVICE void convert_store_vec16(const Vec16& in, void* dst) {
  if constexpr (S == D) {
    store_vec16(dst, in);
  } else if constexpr (D == ElemType::kFloat32) {
    Vec16 out[2];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < 8; ++k) {
      const uint16_t h = half_of(in, k);
      const float f = half_to_float<S>(h);
      out[k / 4].w[k % 4] = float_to_bits(f);
    }
    store_vec16(dst, out[0]);
    store_vec16(static_cast<unsigned char*>(dst) + kVectorBytes, out[1]);
  } else if constexpr (S == ElemType::kFloat32) {
    uint32_t h[4];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < 4; ++k) h[k] = narrow_from_float<D>(bits_to_float(in.w[k]));
    store_vec8(dst, h[0] | (h[1] << 16), h[2] | (h[3] << 16));
  } else {
    Vec16 out;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < 4; ++k) {
      uint32_t pair = 0;
      for (int j = 0; j < 2; ++j) {
        const uint16_t h = half_of(in, 2 * k + j);
        const float f = half_to_float<S>(h);
        pair |= static_cast<uint32_t>(narrow_from_float<D>(f)) << (16 * j);
      }
      out.w[k] = pair;
    }
    store_vec16(dst, out);
  }
}

/// The loop of one tile, run by lane `lane` of `lanes` (a thread of a block on the device; a loop
/// over lanes in the tests), over `count` elements of SrcEsize bytes at `src` into elements of
/// DstEsize bytes at `dst`: the vector run with kUnroll 16-byte loads in flight per lane, each
/// converted by vector(in, dst_of_vector), the rest via scalar(i), which must write element i
/// exactly like the vector path. Shared by the unscaled copies (copy_tile) and the FP8 tiles
/// (fp8_tiling.hpp).
template <int64_t SrcEsize, int64_t DstEsize, typename ScalarFn, typename VectorFn>
HSS_HOST_DEVICE void tile_loop(const void* src, void* dst, int64_t count, int lane, int lanes,
                               ScalarFn&& scalar, VectorFn&& vector) {
  constexpr int64_t per_vector = kVectorBytes / SrcEsize;
  const auto src_addr = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(src));
  const auto dst_addr = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(dst));
  const VectorPlan plan = plan_vectors(src_addr, dst_addr, count, SrcEsize, DstEsize);

  for (int64_t i = lane; i < plan.head; i += lanes) scalar(i);
  const auto* vsrc = static_cast<const unsigned char*>(src) + plan.head * SrcEsize;
  auto* vdst = static_cast<unsigned char*>(dst) + plan.head * DstEsize;
  const int64_t stride = static_cast<int64_t>(lanes) * kUnroll;
  for (int64_t base = lane; base < plan.vectors; base += stride) {
    Vec16 regs[kUnroll] = {};  // GCC cannot see that only loaded lanes are stored
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + static_cast<int64_t>(u) * lanes;
      if (v < plan.vectors) regs[u] = load_vec16(vsrc + v * kVectorBytes);
    }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + static_cast<int64_t>(u) * lanes;
      if (v < plan.vectors) vector(regs[u], vdst + v * per_vector * DstEsize);
    }
  }
  // With no vector run, head == tail_begin == 0 and the tail is the whole tile.
  for (int64_t i = plan.tail_begin + lane; i < count; i += lanes) scalar(i);
}

/// The body of one unscaled tile, run by one lane: moves `count` elements from `src` (type S) to
/// `dst` (type D), vectors through convert_store_vec16, the rest via scalar(i), which must write
/// element i exactly like the vector path (store_element / restore_element).
template <ElemType S, ElemType D, typename ScalarFn>
HSS_HOST_DEVICE void copy_tile(const void* src, void* dst, int64_t count, int lane, int lanes,
                               ScalarFn&& scalar) {
  tile_loop<elem_bytes(S), elem_bytes(D)>(
      src, dst, count, lane, lanes, scalar,
      [](const Vec16& in, void* out) { convert_store_vec16<S, D>(in, out); });
}

/// One store tile: source element address and staging destination, run by one lane.
template <ElemType S, ElemType D>
HSS_HOST_DEVICE void store_tile(const SourceView& src, const WriteSegment& tile, int lane,
                                int lanes) {
  copy_tile<S, D>(
      source_address(src, tile.src_row0, tile.src_elem), tile.dst, tile.count, lane, lanes,
      [&](int64_t i) { store_element(src, tile.src_row0, tile.src_elem + i, tile.dst, i, D); });
}

/// Dispatches a store tile on its source and storage types (block-uniform; elem_visit.hpp): an
/// unsupported pair writes nothing (the store checks the pair before any tile exists). The
/// batched store kernel and its host twin (src/datapath/batch_tiles.cpp) both run exactly this.
HSS_HOST_DEVICE void store_tile_any(const SourceView& src, const WriteSegment& tile, int lane,
                                    int lanes) {
  (void)visit_store_pair(src.type, tile.dst_type, [&]<ElemType S, ElemType D>() {
    store_tile<S, D>(src, tile, lane, lanes);
  });
}

/// One restore tile from storage type S into an output of type D, run by one lane.
template <ElemType S, ElemType D>
HSS_HOST_DEVICE void restore_tile(const GatherSegment& tile, const OutputView& out, int lane,
                                  int lanes) {
  copy_tile<S, D>(tile.src, output_address(out, tile.dst_elem), tile.count, lane, lanes,
                  [&](int64_t i) { restore_element(tile, i, out); });
}

/// An FP8 restore tile (fp8_tiling.hpp, included at the end of this file).
template <ElemType T, ElemType D>
HSS_HOST_DEVICE void dequantise_tile(const GatherSegment& tile, const OutputView& out, int lane,
                                     int lanes);

/// Dispatches a restore tile on its (block-uniform) storage type for output type D: an unscaled
/// type's copy, or an 8-bit type's dequantisation against the tile's row scale.
template <ElemType D>
HSS_HOST_DEVICE void restore_tile_to(const GatherSegment& tile, const OutputView& out, int lane,
                                     int lanes) {
  if (visit_elem_type(tile.src_type,
                      [&]<ElemType S>() { restore_tile<S, D>(tile, out, lane, lanes); })) {
    return;
  }
  (void)visit_fp8_type(tile.src_type,
                       [&]<ElemType T>() { dequantise_tile<T, D>(tile, out, lane, lanes); });
}

/// Dispatches a restore tile on its storage type and the output type (the batched restore
/// kernel and the CPU tests; the single restore kernel is instantiated per output type and calls
/// restore_tile_to directly).
HSS_HOST_DEVICE void restore_tile_any(const GatherSegment& tile, const OutputView& out, int lane,
                                      int lanes) {
  (void)visit_elem_type(out.type, [&]<ElemType D>() { restore_tile_to<D>(tile, out, lane, lanes); });
}

}  // namespace hss::kernels

#include "hss/kernels/fp8_tiling.hpp"  // IWYU pragma: export (dequantise_tile)
