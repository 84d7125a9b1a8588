#pragma once
// The host path's copy loops, and the strategy that picks their stores for this machine.
//
// Why a choice: a large host copy can write through the cache (regular stores: glibc memcpy's
// rep movsb or vector loop, our vector loops for widening casts) or around it (non-temporal,
// "streaming" stores). Which one is faster depends on the CPU and its memory, not on hsstore:
//   * AMD EPYC (Zen 3, two VMs, docs/perf.md): regular stores read every destination line for
//     ownership first, 3 bytes of DRAM traffic per byte copied instead of 2; streaming won by
//     1.3-1.6x for calls of 8 MiB and more.
//   * Intel Sapphire Rapids (issue 22): glibc memcpy (rep movsb) usually beat the streaming copy.
// So each store takes its strategy, in this order of precedence:
//   1. hidden_state_stream_threshold_bytes (HSS_STREAM_THRESHOLD_KB, a debugging aid, overrides
//      it through Config::with_env_overrides; stats say "environment" then): calls
//      writing at least that many bytes stream, copies and widening casts alike;
//   2. else a calibration, once per process, on the first pool of at least
//      kCalibrationArenaBytes, while that pool is still empty: regular and streaming candidates of
//      a copy and of a bfloat16 widening each write kCalibrationBytes of the pool, in pairs
//      (regular and streaming back to back) over kCalibrationRounds rounds. The median of the
//      rounds' streaming / regular ratios decides: a side faster by more than kCalibrationMargin
//      wins; a near-tie keeps the rule's choice. Streaming is then used from kDefaultStreamThresholdBytes on.
//   3. else the rule for the CPU family (kCpuRules in host_copy.cpp; docs/perf.md).
// Calls below the threshold always use regular stores: their destination is likely in cache.
//
// Thread safety: every function may be called from any thread. choose_host_copy calibrates at
// most once per process; concurrent callers wait for that one calibration (~100 ms). A HostCopy is
// an immutable value.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "hss/config.hpp"
#include "hss/host_copy_stats.hpp"
#include "hss/kernels/convert.hpp"

namespace hss::detail {

/// A threshold no call reaches: regular stores at every size.
inline constexpr uint64_t kNeverStream = std::numeric_limits<uint64_t>::max();
/// Where streaming starts when a rule or the calibration picks it. Measured on AMD EPYC
/// (docs/perf.md): 4 MiB lost 40% on 4 MiB calls, 16 MiB was 5-10% slower on `mixed`.
inline constexpr uint64_t kDefaultStreamThresholdBytes = uint64_t{8} << 20;

inline constexpr uint64_t kCalibrationBytes = uint64_t{32} << 20;
inline constexpr uint64_t kCalibrationArenaBytes = 2 * kCalibrationBytes;  // source + destination
inline constexpr int kCalibrationRounds = 5;
inline constexpr double kCalibrationMargin = 0.05;

/// Vector width of the copy loops: AVX2 where the CPU has it, SSE2 on other x86-64, plain C++
/// (memcpy and scalar casts, never streaming) elsewhere.
enum class CopyIsa : uint8_t { kPortable, kSse2, kAvx2 };

[[nodiscard]] constexpr const char* to_string(CopyIsa isa) {
  return isa == CopyIsa::kAvx2 ? "avx2" : (isa == CopyIsa::kSse2 ? "sse2" : "portable");
}

/// A store's strategy. `info` is what stats().host_copy reports (the store adds copy_threads and
/// split_copies).
struct HostCopy {
  HostCopyStats info;
  CopyIsa isa = CopyIsa::kPortable;

  /// Same-type copies of calls writing at least this many bytes stream (kNeverStream: none).
  [[nodiscard]] uint64_t copy_stream_bytes() const {
    return info.copies == HostStores::kStreaming ? info.stream_threshold_bytes : kNeverStream;
  }
  /// Widening casts likewise.
  [[nodiscard]] uint64_t widen_stream_bytes() const {
    return info.widening == HostStores::kStreaming ? info.stream_threshold_bytes : kNeverStream;
  }
};

/// The CPU as the rule reads it (CPUID).
struct CpuIdentity {
  std::string vendor;  ///< "AuthenticAMD", "GenuineIntel", ...; empty off x86
  uint32_t family = 0;
  uint32_t model = 0;
  bool sse2 = false;
  bool avx2 = false;
};
[[nodiscard]] const CpuIdentity& this_cpu();

/// The rule for `cpu`'s family: the strategy when nothing was calibrated or configured.
[[nodiscard]] HostCopy rule_for(const CpuIdentity& cpu);

/// Best seconds of each calibration candidate, each writing `bytes` bytes, and the median over
/// the rounds of streaming / regular seconds measured back to back (0: not measured; decide()
/// then compares the bests).
struct CalibrationTimes {
  uint64_t bytes = 0;
  double regular_copy = 0, streaming_copy = 0, regular_widen = 0, streaming_widen = 0;
  double copy_ratio = 0, widen_ratio = 0;
};
/// Times the candidates in `arena` (at least kCalibrationArenaBytes, overwritten).
[[nodiscard]] CalibrationTimes calibrate(std::span<std::byte> arena, CopyIsa isa);
/// The calibration's choice: a side faster by more than kCalibrationMargin (the rounds' median
/// ratio) wins, a near-tie keeps `rule`'s stores.
[[nodiscard]] HostCopy decide(const CalibrationTimes& times, const HostCopy& rule);

/// The strategy of a store with `config` whose empty pool is `free_arena` (precedence above).
[[nodiscard]] HostCopy choose_host_copy(const Config& config, std::span<std::byte> free_arena);
/// This machine's rule, or HSS_STREAM_THRESHOLD_KB when set: what host_store and host_restore
/// use when the caller names no strategy (the simulated and CUDA paths' host-side copies).
[[nodiscard]] const HostCopy& default_host_copy();

// ---- The loops. Any alignment of either side; `stream` is ignored by kPortable.

/// Which of a call's operations stream (from the bytes the whole call writes: HostCopy's
/// copy_stream_bytes and widen_stream_bytes). The default streams nothing.
struct Streaming {
  bool copies = false;
  bool widening = false;
  [[nodiscard]] bool any() const { return copies || widening; }
};

/// memcpy, or a non-temporal copy when `stream`.
void copy_bytes(void* dst, const void* src, size_t bytes, bool stream, CopyIsa isa);
/// bfloat16 -> float32 (a 16-bit shift: exact), non-temporal stores when `stream`.
void widen_bf16(const uint16_t* in, float* out, int64_t n, bool stream, CopyIsa isa);
/// n elements of `type` widened to float32 (exact; a plain copy for float32), with the stores
/// `streaming` picks for a copy or a widening. The host path's one widening cast: its float32
/// stores and restores, and fp8_rows.cpp's 16-bit rows a block at a time.
void widen(const void* src, kernels::ElemType type, float* dst, int64_t n,
           const Streaming& streaming, CopyIsa isa);
/// Streaming stores are weakly ordered: the thread that issued them fences before the data is
/// published (a mutex release does not order non-temporal stores).
void end_streaming(bool streamed);

}  // namespace hss::detail
