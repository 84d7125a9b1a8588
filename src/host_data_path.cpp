#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "data_path.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#define HSS_HOST_STREAMING 1
#else
#define HSS_HOST_STREAMING 0
#endif

namespace hss::detail {
namespace {

using kernels::ElemType;

// Calls that write at least the threshold use non-temporal (streaming) stores. Measured on the
// 2-core CI VM (docs/perf.md): glibc's memcpy only streams above 3/4 of the L3 (240 MiB there),
// so pool-block-sized pieces (1-4 MiB each) went through the cache: every destination line was
// read for ownership first, 1.5x the DRAM traffic of the copy itself. Streaming stores skip that
// read; below a few MiB the destination is likely cache-resident and ordinary stores win. The
// threshold is Config::hidden_state_stream_threshold_bytes; HSS_STREAM_THRESHOLD_KB overrides it
// (a debugging aid: the CI runs the store suites once with it forced to 0).
size_t stream_threshold(uint64_t configured) {
  static const std::optional<size_t> env_override = []() -> std::optional<size_t> {
    if (const char* v = std::getenv("HSS_STREAM_THRESHOLD_KB")) {
      return static_cast<size_t>(std::strtoull(v, nullptr, 10)) << 10;
    }
    return std::nullopt;
  }();
  return env_override.value_or(static_cast<size_t>(configured));
}

#if HSS_HOST_STREAMING
/// memcpy with 16-byte non-temporal stores (any alignment of either side).
void stream_copy(void* dst, const void* src, size_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t head = std::min(n, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  for (; n >= 16; n -= 16, d += 16, s += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  }
  std::memcpy(d, s, n);
}

/// bfloat16 -> float32 is a 16-bit shift: interleaving zeros below each value does 8 at a time.
template <bool kStream>
void widen_bf16(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  if constexpr (kStream) {  // streaming stores need a 16-byte aligned destination
    for (; i < n && reinterpret_cast<uintptr_t>(out + i) % 16 != 0; ++i) {
      out[i] = kernels::bf16_to_float(in[i]);
    }
  }
  const __m128i zero = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    auto* o = reinterpret_cast<__m128i*>(out + i);
    if constexpr (kStream) {
      _mm_stream_si128(o, _mm_unpacklo_epi16(zero, v));
      _mm_stream_si128(o + 1, _mm_unpackhi_epi16(zero, v));
    } else {
      _mm_storeu_si128(o, _mm_unpacklo_epi16(zero, v));
      _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(zero, v));
    }
  }
  for (; i < n; ++i) out[i] = kernels::bf16_to_float(in[i]);
}
#endif

/// Copies n elements of `type` from src to dst (same type).
void copy_elems(const void* src, void* dst, int64_t n, ElemType type, bool stream) {
  const auto bytes = static_cast<size_t>(n) * kernels::elem_bytes(type);
#if HSS_HOST_STREAMING
  if (stream) {
    stream_copy(dst, src, bytes);
    return;
  }
#else
  (void)stream;
#endif
  std::memcpy(dst, src, bytes);
}

/// Widens n elements of `type` to float32 (a plain copy for float32).
void widen(const void* src, ElemType type, float* dst, int64_t n, bool stream) {
  if (type == ElemType::kFloat32) {
    copy_elems(src, dst, n, type, stream);
  } else if (type == ElemType::kBFloat16) {
    const auto* in = static_cast<const uint16_t*>(src);
#if HSS_HOST_STREAMING
    if (stream) {
      widen_bf16<true>(in, dst, n);
    } else {
      widen_bf16<false>(in, dst, n);
    }
#else
    (void)stream;
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::bf16_to_float(in[i]);
#endif
  } else {  // float16 is rare on this path: the exact scalar conversion is enough
    const auto* in = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::f16_to_float(in[i]);
  }
}

/// Streaming stores are weakly ordered: fence them before the caller publishes the data (the
/// store marks entries READY under a mutex, whose release does not order non-temporal stores).
void end_stream(bool stream) {
#if HSS_HOST_STREAMING
  if (stream) _mm_sfence();
#else
  (void)stream;
#endif
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

void host_store(const kernels::SourceView& src, std::span<const kernels::WriteSegment> segments,
                uint64_t stream_threshold_bytes) {
  const bool contiguous = src.row_stride == src.cols;
  size_t total = 0;
  for (const kernels::WriteSegment& seg : segments) {
    total += static_cast<size_t>(seg.count) * kernels::elem_bytes(seg.dst_type);
  }
  const bool stream = total >= stream_threshold(stream_threshold_bytes);
  for (const kernels::WriteSegment& seg : segments) {
    auto* dst = static_cast<unsigned char*>(seg.dst);
    const auto dst_bytes = static_cast<int64_t>(kernels::elem_bytes(seg.dst_type));
    for_each_row_run(seg.src_elem, seg.count, src.cols, contiguous, [&](int64_t flat, int64_t n) {
      const void* from = kernels::source_address(src, seg.src_row0, flat);
      void* to = dst + (flat - seg.src_elem) * dst_bytes;
      if (seg.dst_type == src.type) {
        copy_elems(from, to, n, src.type, stream);
      } else {  // only widening to float32 is ever planned
        widen(from, src.type, static_cast<float*>(to), n, stream);
      }
    });
  }
  end_stream(stream);
}

void host_restore(std::span<const kernels::GatherSegment> segments, const kernels::OutputView& out,
                  uint64_t stream_threshold_bytes) {
  const bool contiguous = out.row_stride == out.cols;
  const auto out_bytes = static_cast<int64_t>(kernels::elem_bytes(out.type));
  size_t total = 0;
  for (const kernels::GatherSegment& seg : segments) {
    total += static_cast<size_t>(seg.count * out_bytes);
  }
  const bool stream = total >= stream_threshold(stream_threshold_bytes);
  for (const kernels::GatherSegment& seg : segments) {
    const auto* src = static_cast<const unsigned char*>(seg.src);
    const auto esize = static_cast<int64_t>(kernels::elem_bytes(seg.src_type));
    for_each_row_run(seg.dst_elem, seg.count, out.cols, contiguous, [&](int64_t flat, int64_t n) {
      const int64_t first = flat - seg.dst_elem;
      void* to = kernels::output_address(out, flat);
      if (seg.src_type == out.type) {  // bit-identical copy
        copy_elems(src + first * esize, to, n, out.type, stream);
      } else if (out.type == ElemType::kFloat32) {
        widen(src + first * esize, seg.src_type, static_cast<float*>(to), n, stream);
      } else {  // narrowing to 16 bits: the kernels' per-element function, nearest-even
        const kernels::GatherSegment piece{src + first * esize, 0, n, seg.src_type};
        const kernels::OutputView row{to, n, n, out.type};
        for (int64_t i = 0; i < n; ++i) kernels::restore_element(piece, i, row);
      }
    });
  }
  end_stream(stream);
}

}  // namespace hss::detail
