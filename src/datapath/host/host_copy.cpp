#include "datapath/host/host_copy.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>

#include "datapath/host/copy_workers.hpp"
#include "hss/kernels/convert.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HSS_HOST_X86 1
#else
#define HSS_HOST_X86 0
#endif

namespace hss::detail {
namespace {

// ---- The rule per CPU family (docs/perf.md, "Host copy strategy"). Data, not code paths: the
// first row matching the vendor and family range decides; no row matches = kUnknownCpu.
struct CpuRule {
  const char* vendor;
  uint32_t family_min, family_max;
  HostStores copies, widening;
  const char* reason;
  /// Parts of a split copy are at least this large (the family's crossover / 2, docs/perf.md
  /// "Copy threads"): below 2x it a call stays on the calling thread.
  uint64_t min_bytes_per_copy_thread;
};

constexpr CpuRule kCpuRules[] = {
    {"AuthenticAMD", 0x17, 0xff, HostStores::kStreaming, HostStores::kStreaming,
     "AMD Zen: streaming stores skip the read-for-ownership of each destination line "
     "(EPYC Zen 3 measured, docs/perf.md)",
     kMinBytesPerCopyThread},
    {"GenuineIntel", 0x6, 0x6, HostStores::kRegular, HostStores::kRegular,
     "Intel family 6: memcpy (rep movsb) beat streaming stores on Sapphire Rapids (issue 22)",
     kMinBytesPerCopyThread},
};
constexpr CpuRule kUnknownCpu = {
    "",
    0,
    0,
    HostStores::kRegular,
    HostStores::kRegular,
    "no rule for this CPU: regular stores, glibc memcpy streams above its own threshold",
    kMinBytesPerCopyThread};

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", v);
  return buf;
}

CpuIdentity detect_cpu() {
  CpuIdentity id;
#if HSS_HOST_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    id.vendor = vendor;
  }
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    uint32_t family = (a >> 8) & 0xf;
    uint32_t model = (a >> 4) & 0xf;
    if (family == 0xf) family += (a >> 20) & 0xff;
    if (family == 0x6 || family >= 0xf) model |= ((a >> 16) & 0xf) << 4;
    id.family = family;
    id.model = model;
  }
  __builtin_cpu_init();
  id.sse2 = __builtin_cpu_supports("sse2") != 0;
  id.avx2 = __builtin_cpu_supports("avx2") != 0;  // checks the OS saves the YMM state too
#endif
  return id;
}

std::string describe_cpu(const CpuIdentity& cpu, CopyIsa isa) {
  if (cpu.vendor.empty()) return std::string("non-x86, ") + to_string(isa) + " loops";
  return cpu.vendor + " family " + hex(cpu.family) + " model " + hex(cpu.model) + ", " +
         to_string(isa) + " loops";
}

std::string describe_bytes(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 20) && bytes % (uint64_t{1} << 20) == 0) {
    return std::to_string(bytes >> 20) + " MiB";
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " bytes";
}

/// "copies streaming, widening regular for calls >= 8 MiB (why)".
std::string describe_choice(const HostCopyStats& s, const std::string& why) {
  std::string text;
  if (s.copies == s.widening) {
    text = s.copies == HostStores::kStreaming ? "streaming stores" : "regular stores";
  } else {
    text = "copies " + std::string(to_string(s.copies)) + ", widening " +
           std::string(to_string(s.widening));
  }
  if (s.copies == HostStores::kStreaming || s.widening == HostStores::kStreaming) {
    text += " for calls >= " + describe_bytes(s.stream_threshold_bytes) + ", regular below";
  } else {
    text += " at every size";
  }
  return text + " (" + std::string(to_string(s.chosen_by)) + ": " + why + ")";
}

CopyIsa isa_of(const CpuIdentity& cpu) {
  if (cpu.avx2) return CopyIsa::kAvx2;
  return cpu.sse2 ? CopyIsa::kSse2 : CopyIsa::kPortable;
}

/// A threshold fixed by configuration: every large call streams, copies and widening alike.
HostCopy fixed(uint64_t threshold, HostCopySource source, const char* why) {
  HostCopy h;
  h.isa = isa_of(this_cpu());
  if (h.isa != CopyIsa::kPortable) h.info.copies = h.info.widening = HostStores::kStreaming;
  h.info.stream_threshold_bytes = threshold;
  h.info.min_bytes_per_copy_thread = rule_for(this_cpu()).info.min_bytes_per_copy_thread;
  h.info.chosen_by = source;
  h.info.cpu = describe_cpu(this_cpu(), h.isa);
  h.info.summary = describe_choice(h.info, why);
  return h;
}

/// The threshold the config fixes, if any: HSS_STREAM_THRESHOLD_KB when it set the value
/// (Config::with_env_overrides), else hidden_state_stream_threshold_bytes.
std::optional<HostCopy> configured(const Config& config) {
  if (!config.tuning.stream_threshold_bytes) return std::nullopt;
  const auto threshold = static_cast<uint64_t>(*config.tuning.stream_threshold_bytes);
  if (std::ranges::find(config.env_overrides, "HSS_STREAM_THRESHOLD_KB") !=
      config.env_overrides.end()) {
    return fixed(threshold, HostCopySource::kEnvironment, "HSS_STREAM_THRESHOLD_KB");
  }
  return fixed(threshold, HostCopySource::kConfig, "hidden_state_stream_threshold_bytes");
}

// ---- The loops.

#if HSS_HOST_X86
/// Bytes before `p` reaches an `align`-byte boundary, at most n.
size_t head_bytes(const void* p, size_t align, size_t n) {
  return std::min(n, (align - reinterpret_cast<uintptr_t>(p) % align) % align);
}

void stream_copy_sse2(unsigned char* d, const unsigned char* s, size_t n) {
  const size_t head = head_bytes(d, 16, n);
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

__attribute__((target("avx2"))) void stream_copy_avx2(unsigned char* d, const unsigned char* s,
                                                      size_t n) {
  const size_t head = head_bytes(d, 32, n);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= 128; n -= 128, d += 128, s += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), e);
  }
  for (; n >= 32; n -= 32, d += 32, s += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  }
  std::memcpy(d, s, n);
}

/// bfloat16 -> float32 is a 16-bit shift: zeros interleaved below each value, 8 at a time.
template <bool kStream>
void widen_sse2(const uint16_t* in, float* out, int64_t n) {
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

/// The same, 16 at a time: zero-extend to 32 bits, shift left by 16.
template <bool kStream>
__attribute__((target("avx2"))) void widen_avx2(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  if constexpr (kStream) {  // 32-byte aligned destination
    for (; i < n && reinterpret_cast<uintptr_t>(out + i) % 32 != 0; ++i) {
      out[i] = kernels::bf16_to_float(in[i]);
    }
  }
  for (; i + 16 <= n; i += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 8));
    const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(a), 16);
    const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16);
    auto* o = reinterpret_cast<__m256i*>(out + i);
    if constexpr (kStream) {
      _mm256_stream_si256(o, lo);
      _mm256_stream_si256(o + 1, hi);
    } else {
      _mm256_storeu_si256(o, lo);
      _mm256_storeu_si256(o + 1, hi);
    }
  }
  for (; i < n; ++i) out[i] = kernels::bf16_to_float(in[i]);
}
#endif

// ---- Calibration.

constexpr uint64_t kRegularPieceBytes = uint64_t{4} << 20;  // one default chunk: 256 x 4096 x 4

double seconds(const std::chrono::steady_clock::time_point& start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

const CpuIdentity& this_cpu() {
  static const CpuIdentity cpu = detect_cpu();
  return cpu;
}

HostCopy rule_for(const CpuIdentity& cpu) {
  const CpuRule* rule = &kUnknownCpu;
  for (const CpuRule& r : kCpuRules) {
    if (cpu.vendor == r.vendor && cpu.family >= r.family_min && cpu.family <= r.family_max) {
      rule = &r;
      break;
    }
  }
  HostCopy h;
  h.isa = isa_of(cpu);
  if (h.isa != CopyIsa::kPortable) {  // no streaming loops to pick off x86
    h.info.copies = rule->copies;
    h.info.widening = rule->widening;
  }
  h.info.stream_threshold_bytes = kDefaultStreamThresholdBytes;
  h.info.min_bytes_per_copy_thread = rule->min_bytes_per_copy_thread;
  h.info.chosen_by = HostCopySource::kCpuRule;
  h.info.cpu = describe_cpu(cpu, h.isa);
  h.info.summary = describe_choice(h.info, rule->reason);
  return h;
}

CalibrationTimes calibrate(std::span<std::byte> arena, CopyIsa isa) {
  CalibrationTimes t;
  if (arena.size() < kCalibrationArenaBytes) return t;
  t.bytes = kCalibrationBytes;
  std::byte* src = arena.data();
  std::byte* dst = arena.data() + kCalibrationBytes;
  // Regular copies go through memcpy one chunk at a time, as a store does: pieces below every
  // glibc non-temporal threshold, so this times memcpy's regular path.
  auto regular_copy = [&] {
    for (uint64_t off = 0; off < kCalibrationBytes; off += kRegularPieceBytes) {
      std::memcpy(dst + off, src + off, kRegularPieceBytes);
    }
  };
  auto streaming_copy = [&] {
    for (uint64_t off = 0; off < kCalibrationBytes; off += kRegularPieceBytes) {
      copy_bytes(dst + off, src + off, kRegularPieceBytes, true, isa);
    }
    end_streaming(true);
  };
  const auto* bf16 = reinterpret_cast<const uint16_t*>(src);
  auto* f32 = reinterpret_cast<float*>(dst);
  const auto widen_n = static_cast<int64_t>(kCalibrationBytes / sizeof(float));
  auto regular_widen = [&] { widen_bf16(bf16, f32, widen_n, false, isa); };
  auto streaming_widen = [&] {
    widen_bf16(bf16, f32, widen_n, true, isa);
    end_streaming(true);
  };
  // Pairs, not four independent bests: each round times a regular candidate and its streaming
  // twin back to back (which goes first alternates), and the choice is the median over the rounds
  // of streaming / regular. A neighbour's burst then spoils one pair of one round, not the
  // decision: best-of-3 of independent times picked regular copies on this AMD VM under a load of
  // 5 (docs/perf.md), where streaming is 1.3-1.6x faster.
  struct Pair {
    std::function<void()> regular, streaming;
    double *best_regular, *best_streaming, *median_ratio;
    double ratios[kCalibrationRounds] = {};
  };
  Pair pairs[] = {
      {regular_copy, streaming_copy, &t.regular_copy, &t.streaming_copy, &t.copy_ratio},
      {regular_widen, streaming_widen, &t.regular_widen, &t.streaming_widen, &t.widen_ratio}};
  auto timed = [](const std::function<void()>& run) {
    const auto start = std::chrono::steady_clock::now();
    run();
    return seconds(start);
  };
  for (Pair& p : pairs) {  // warm-up: TLB, caches, frequency
    p.regular();
    p.streaming();
    *p.best_regular = *p.best_streaming = 1e30;
  }
  for (int round = 0; round < kCalibrationRounds; ++round) {
    for (Pair& p : pairs) {
      double regular = 0, streaming = 0;
      if (round % 2 == 0) {
        regular = timed(p.regular);
        streaming = timed(p.streaming);
      } else {
        streaming = timed(p.streaming);
        regular = timed(p.regular);
      }
      *p.best_regular = std::min(*p.best_regular, regular);
      *p.best_streaming = std::min(*p.best_streaming, streaming);
      p.ratios[round] = streaming / regular;
    }
  }
  for (Pair& p : pairs) {
    std::sort(std::begin(p.ratios), std::end(p.ratios));
    *p.median_ratio = p.ratios[kCalibrationRounds / 2];
  }
  return t;
}

HostCopy decide(const CalibrationTimes& t, const HostCopy& rule) {
  HostCopy h = rule;
  if (t.bytes == 0 || rule.isa == CopyIsa::kPortable) return h;
  // ratio = streaming time / regular time: the rounds' median, else (no rounds) the bests'.
  auto pick = [](double ratio, double regular, double streaming, HostStores ruled) {
    if (ratio <= 0) ratio = regular > 0 ? streaming / regular : 1;
    if (ratio < 1 - kCalibrationMargin) return HostStores::kStreaming;
    if (ratio * (1 - kCalibrationMargin) > 1) return HostStores::kRegular;
    return ruled;
  };
  h.info.copies = pick(t.copy_ratio, t.regular_copy, t.streaming_copy, rule.info.copies);
  h.info.widening = pick(t.widen_ratio, t.regular_widen, t.streaming_widen, rule.info.widening);
  h.info.chosen_by = HostCopySource::kCalibration;
  auto gbps = [&](double s) { return s > 0 ? static_cast<double>(t.bytes) / s / 1e9 : 0.0; };
  h.info.regular_copy_gbps = gbps(t.regular_copy);
  h.info.streaming_copy_gbps = gbps(t.streaming_copy);
  h.info.regular_widen_gbps = gbps(t.regular_widen);
  h.info.streaming_widen_gbps = gbps(t.streaming_widen);
  char figures[256];
  std::snprintf(figures, sizeof figures,
                "%llu MiB written: copy regular %.1f / streaming %.1f GB/s, widen regular %.1f / "
                "streaming %.1f GB/s (best); streaming / regular time, median of %d paired rounds: "
                "copy %.2f, widen %.2f; ties within %.0f%% go to the cpu rule",
                static_cast<unsigned long long>(t.bytes >> 20), h.info.regular_copy_gbps,
                h.info.streaming_copy_gbps, h.info.regular_widen_gbps, h.info.streaming_widen_gbps,
                kCalibrationRounds, t.copy_ratio, t.widen_ratio, kCalibrationMargin * 100);
  h.info.summary = describe_choice(h.info, figures);
  return h;
}

HostCopy choose_host_copy(const Config& config, std::span<std::byte> free_arena) {
  if (auto fixed_by_config = configured(config)) return *std::move(fixed_by_config);
  // One calibration per process: the machine does not change, and a store constructed later
  // should not pay for it again. The first pool large enough runs it while it is empty.
  static std::mutex mutex;
  static std::optional<HostCopy> calibrated;
  std::lock_guard lock(mutex);
  if (calibrated) return *calibrated;
  const HostCopy rule = rule_for(this_cpu());
  if (free_arena.size() < kCalibrationArenaBytes || rule.isa == CopyIsa::kPortable) return rule;
  calibrated = decide(calibrate(free_arena, rule.isa), rule);
  return *calibrated;
}

const HostCopy& default_host_copy() {
  // Without a store: the default config as the environment overrides it (as a store would).
  static const HostCopy value = [] {
    return configured(Config().with_env_overrides()).value_or(rule_for(this_cpu()));
  }();
  return value;
}

void copy_bytes(void* dst, const void* src, size_t bytes, bool stream, CopyIsa isa) {
#if HSS_HOST_X86
  if (stream && isa != CopyIsa::kPortable) {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    if (isa == CopyIsa::kAvx2) {
      stream_copy_avx2(d, s, bytes);
    } else {
      stream_copy_sse2(d, s, bytes);
    }
    return;
  }
#else
  (void)stream;
  (void)isa;
#endif
  std::memcpy(dst, src, bytes);
}

void widen_bf16(const uint16_t* in, float* out, int64_t n, bool stream, CopyIsa isa) {
#if HSS_HOST_X86
  if (isa == CopyIsa::kAvx2) {
    stream ? widen_avx2<true>(in, out, n) : widen_avx2<false>(in, out, n);
    return;
  }
  if (isa == CopyIsa::kSse2) {
    stream ? widen_sse2<true>(in, out, n) : widen_sse2<false>(in, out, n);
    return;
  }
#else
  (void)stream;
  (void)isa;
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = kernels::bf16_to_float(in[i]);
}

void widen(const void* src, kernels::ElemType type, float* dst, int64_t n,
           const Streaming& streaming, CopyIsa isa) {
  using kernels::ElemType;
  switch (type) {
    case ElemType::kFloat32:
      copy_bytes(dst, src, static_cast<size_t>(n) * sizeof(float), streaming.copies, isa);
      return;
    case ElemType::kBFloat16:
      widen_bf16(static_cast<const uint16_t*>(src), dst, n, streaming.widening, isa);
      return;
    case ElemType::kFloat16: {  // rare on this path: the exact scalar conversion is enough
      const auto* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = kernels::f16_to_float(in[i]);
      return;
    }
    case ElemType::kFp8E4M3:  // never planned: scaled rows go through fp8_dequantise_run
    case ElemType::kFp8E5M2:
      for (int64_t i = 0; i < n; ++i) dst[i] = kernels::load_as_float(src, i, type);
      return;
  }
}

void end_streaming(bool streamed) {
#if HSS_HOST_X86
  if (streamed) _mm_sfence();
#else
  (void)streamed;
#endif
}

}  // namespace hss::detail
