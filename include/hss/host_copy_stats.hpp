#pragma once
// The host copy strategy of a store, part of HiddenStateStats: which stores its large host copies
// use on this machine and why (docs/perf.md, "Host copy strategy"), and its copy threads.
// A plain value: safe to copy and read from any thread.

#include <cstdint>
#include <string>
#include <string_view>

#include "hss/detail/stats_fields.hpp"

namespace hss {

/// How a host copy writes its destination.
enum class HostStores {
  kRegular,    ///< through the cache: glibc memcpy (rep movsb or vector stores), our vector loops
  kStreaming,  ///< non-temporal stores: no read-for-ownership, the data not left in cache
};

/// What decided the strategy.
enum class HostCopySource {
  kCalibration,  ///< a short calibration on the first pool large enough (once per process)
  kCpuRule,      ///< the rule for the CPU family (pool too small to calibrate, or a near-tie)
  kConfig,       ///< hidden_state_stream_threshold_bytes
  kEnvironment,  ///< HSS_STREAM_THRESHOLD_KB (a debugging override)
};

struct HostCopyStats {
  /// Same-type copies (and the widening casts, bfloat16/float16 to float32) of calls writing at
  /// least stream_threshold_bytes. Smaller calls always use regular stores.
  HostStores copies = HostStores::kRegular;
  HostStores widening = HostStores::kRegular;
  uint64_t stream_threshold_bytes = 0;
  HostCopySource chosen_by = HostCopySource::kCpuRule;
  std::string cpu;      ///< what the rule read: vendor, family, model, vector width of the loops
  std::string summary;  ///< one line for logs and `hss info`: the choice and its reason
  /// The calibration's throughput of each candidate in GB/s (0 when none ran).
  double regular_copy_gbps = 0, streaming_copy_gbps = 0;
  double regular_widen_gbps = 0, streaming_widen_gbps = 0;
  /// Threads a large host copy may be split over (hidden_state_copy_threads, or what `auto`
  /// chose), whether `auto` chose it, and the reason in one line.
  int64_t copy_threads = 1;
  bool copy_threads_auto = false;
  std::string copy_threads_reason;
  /// Copy workers running now: they start on the first split copy, so a store whose calls all
  /// stay below 2 x min_bytes_per_copy_thread has none.
  int64_t copy_workers_started = 0;
  /// A call is split only into parts of at least this many bytes (the CPU family's measured
  /// crossover, docs/perf.md "Copy threads"): smaller copies stay on the calling thread.
  uint64_t min_bytes_per_copy_thread = 0;
  uint64_t split_copies = 0;  ///< host copies that ran on more than one thread
};

/// HostCopyStats's fields, each once, in the order stats() reports them: the Python dict is
/// built from this list, the stub and docs/stats.md are checked against it
/// (hss/detail/stats_fields.hpp).
template <detail::MaybeConst<HostCopyStats> Self, class Visit>
constexpr void for_each_field(Self& s, Visit&& visit) {
  visit("copies", s.copies);
  visit("widening", s.widening);
  visit("stream_threshold_bytes", s.stream_threshold_bytes);
  visit("chosen_by", s.chosen_by);
  visit("cpu", s.cpu);
  visit("summary", s.summary);
  visit("regular_copy_gbps", s.regular_copy_gbps);
  visit("streaming_copy_gbps", s.streaming_copy_gbps);
  visit("regular_widen_gbps", s.regular_widen_gbps);
  visit("streaming_widen_gbps", s.streaming_widen_gbps);
  visit("copy_threads", s.copy_threads);
  visit("copy_threads_auto", s.copy_threads_auto);
  visit("copy_threads_reason", s.copy_threads_reason);
  visit("copy_workers_started", s.copy_workers_started);
  visit("min_bytes_per_copy_thread", s.min_bytes_per_copy_thread);
  visit("split_copies", s.split_copies);
}

[[nodiscard]] constexpr std::string_view to_string(HostStores stores) {
  return stores == HostStores::kStreaming ? "streaming" : "regular";
}

[[nodiscard]] constexpr std::string_view to_string(HostCopySource source) {
  switch (source) {
    case HostCopySource::kCalibration:
      return "calibration";
    case HostCopySource::kCpuRule:
      return "cpu rule";
    case HostCopySource::kConfig:
      return "config";
    case HostCopySource::kEnvironment:
      return "environment";
  }
  return "unknown";
}

}  // namespace hss
