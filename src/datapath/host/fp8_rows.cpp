// The host path's 8-bit rows, bit for bit convert.hpp's per-element rules, as loops that GCC
// vectorises on the x86-64 baseline (SSE2; checked with -fopt-info-vec):
// * amax: a running maximum of finite_magnitude_bits as integers (a float maximum reduction does
//   not vectorise without -ffinite-math-only; an integer one does, and gives the same bits).
// * quantise: quantise_as straight off a float32 row (16-bit rows a block at a time, widened by
//   the host path's widen, host_copy.hpp);
//   fp8.hpp's encode is branch-free so the loop vectorises; with CopyIsa::kAvx2 (the CPU has it:
//   host_copy.hpp) the same loops compiled for AVX2.
// * dequantise: a row of n >= 256 codes first dequantises all 256 codes against its scale (one
//   vectorised pass over the tabulated code values), then is one table lookup per element; a
//   shorter piece of a row dequantises each element from the tabulated code values.
#include "datapath/host/fp8_rows.hpp"

#include <algorithm>
#include <array>

#include "hss/kernels/elem_visit.hpp"

#if defined(__x86_64__) || defined(__i386__)
#define HSS_FP8_ROWS_X86 1
#else
#define HSS_FP8_ROWS_X86 0
#endif

namespace hss::detail {
namespace {

using kernels::ElemType;

/// Widened elements per block for the 16-bit sources (on the stack, in L1).
constexpr int64_t kBlock = 256;
/// From this many codes on, a run dequantises through a per-row table of the 256 codes.
constexpr int64_t kRowTableMin = 256;

template <ElemType T>
struct CodeValues {
  std::array<float, 256> value{};
  CodeValues() {
    for (unsigned c = 0; c < 256; ++c) {
      const auto code = static_cast<uint8_t>(c);
      value[c] =
          T == ElemType::kFp8E5M2 ? kernels::e5m2_to_float(code) : kernels::e4m3_to_float(code);
    }
  }
};

template <ElemType T>
const std::array<float, 256>& code_values() {
  static const CodeValues<T> table;
  return table.value;
}

/// The running maximum of finite_magnitude_bits over n floats (as int32: every such value is
/// below 0x7F800000, and a signed maximum vectorises on SSE2 where an unsigned one needs SSE4.1).
int32_t amax_bits(const float* __restrict x, int64_t n, int32_t amax) {
  for (int64_t i = 0; i < n; ++i) {
    const auto bits = static_cast<int32_t>(kernels::finite_magnitude_bits(x[i]));
    amax = bits > amax ? bits : amax;
  }
  return amax;
}

/// The quantiser's loops, compiled once per instruction set below (a 16-bit block widens in the
/// loops of `isa`; the block is in L1, so regular stores).
template <ElemType S, ElemType T>
__attribute__((always_inline)) inline void quantise_loops(const void* src, uint8_t* __restrict dst,
                                                          int64_t n, float scale, CopyIsa isa) {
  if constexpr (S == ElemType::kFloat32) {
    const auto* __restrict in = static_cast<const float*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::quantise_as<T>(in[i], scale);
  } else {
    float wide[kBlock];
    const auto* in = static_cast<const uint16_t*>(src);
    for (int64_t at = 0; at < n; at += kBlock) {
      const int64_t k = std::min(kBlock, n - at);
      widen(in + at, S, wide, k, Streaming{}, isa);
      uint8_t* __restrict out = dst + at;
      for (int64_t i = 0; i < k; ++i) out[i] = kernels::quantise_as<T>(wide[i], scale);
    }
  }
}

template <ElemType S, ElemType T>
void quantise_from(const void* src, uint8_t* dst, int64_t n, float scale, CopyIsa isa) {
  quantise_loops<S, T>(src, dst, n, scale, isa);
}

#if HSS_FP8_ROWS_X86
/// The same loops 8 lanes wide: about twice the baseline's rate (docs/perf.md, FP8 storage).
template <ElemType S, ElemType T>
__attribute__((target("avx2"))) void quantise_from_avx2(const void* src, uint8_t* dst, int64_t n,
                                                        float scale) {
  quantise_loops<S, T>(src, dst, n, scale, CopyIsa::kAvx2);
}
#endif

/// n codes into `out` of element type Out (float, or uint16_t bits of the 16-bit type D).
template <ElemType T, ElemType D, typename Out>
void dequantise_into(const uint8_t* src, Out* __restrict out, int64_t n, float scale) {
  const std::array<float, 256>& values = code_values<T>();
  auto convert = [](float v) {
    if constexpr (D == ElemType::kFloat32) {
      return v;
    } else {
      return kernels::narrow_from_float<D>(v);
    }
  };
  if (n < kRowTableMin) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = convert(kernels::dequantise_value(values[src[i]], scale));
    return;
  }
  Out row[256];
  for (size_t c = 0; c < 256; ++c) row[c] = convert(kernels::dequantise_value(values[c], scale));
  for (int64_t i = 0; i < n; ++i) out[i] = row[src[i]];
}

}  // namespace

float fp8_row_scale(const kernels::SourceView& src, int64_t row, ElemType type, CopyIsa isa) {
  const auto* base = static_cast<const unsigned char*>(src.data) +
                     row * src.row_stride * static_cast<int64_t>(kernels::elem_bytes(src.type));
  int32_t amax = 0;
  kernels::visit_elem_type(src.type, [&]<ElemType S>() {
    if constexpr (S == ElemType::kFloat32) {
      amax = amax_bits(reinterpret_cast<const float*>(base), src.cols, amax);
    } else {
      float wide[kBlock];
      const auto* in = reinterpret_cast<const uint16_t*>(base);
      for (int64_t at = 0; at < src.cols; at += kBlock) {
        const int64_t k = std::min(kBlock, src.cols - at);
        widen(in + at, S, wide, k, Streaming{}, isa);
        amax = amax_bits(wide, k, amax);
      }
    }
  });
  return kernels::row_scale(kernels::bits_to_float(static_cast<uint32_t>(amax)), type);
}

void fp8_quantise_run(const void* src, ElemType src_type, uint8_t* dst, int64_t n, float scale,
                      ElemType type, CopyIsa isa) {
  kernels::visit_elem_type(src_type, [&]<ElemType S>() {
    kernels::visit_fp8_type(type, [&]<ElemType T>() {
#if HSS_FP8_ROWS_X86
      if (isa == CopyIsa::kAvx2) {
        quantise_from_avx2<S, T>(src, dst, n, scale);
        return;
      }
#endif
      quantise_from<S, T>(src, dst, n, scale, isa);
    });
  });
}

void fp8_dequantise_run(const uint8_t* src, ElemType type, float scale, void* dst,
                        ElemType out_type, int64_t n) {
  kernels::visit_fp8_type(type, [&]<ElemType T>() {
    kernels::visit_elem_type(out_type, [&]<ElemType D>() {
      if constexpr (D == ElemType::kFloat32) {
        dequantise_into<T, D>(src, static_cast<float*>(dst), n, scale);
      } else {
        dequantise_into<T, D>(src, static_cast<uint16_t*>(dst), n, scale);
      }
    });
  });
}

std::span<const float, 256> fp8_code_values(ElemType type) {
  if (type == ElemType::kFp8E5M2) return code_values<ElemType::kFp8E5M2>();
  return code_values<ElemType::kFp8E4M3>();
}

}  // namespace hss::detail
