#pragma once
// How many threads split a store's large host copies (hidden_state_copy_threads): `auto`, the
// default, is the CPUs the constructing thread may run on (its affinity mask, lowered by the
// cgroup CPU quota), capped at kAutoCopyThreadsCap; 1 on a single CPU. Why the calling thread's
// mask and not torch's thread count: docs/design.md, "Copy threads". The workers themselves:
// copy_workers.hpp.
//
// Thread safety: every function may be called from any thread; this_thread_cpu_budget reads the
// calling thread's mask.

#include <cstdint>
#include <optional>
#include <string>

namespace hss::detail {

/// The most threads `auto` gives one copy. Beyond a few threads one copy is bound by the socket's
/// memory bandwidth, and the engine's own threads (tokenizer, scheduler, NCCL proxies) want cores
/// at the same moments; docs/perf.md, "Copy threads", has the curve and why 8.
inline constexpr int kAutoCopyThreadsCap = 8;

/// The CPUs this process may use, as `auto` reads them.
struct CpuBudget {
  int affinity = 1;  ///< CPUs in the calling thread's affinity mask
  std::optional<double>
      cgroup_cpus;  ///< the cgroup CPU quota in CPUs (quota / period); unset: none
  /// min(affinity, ceil(cgroup_cpus)), at least 1.
  [[nodiscard]] int usable() const;
};
/// Reads the calling thread's affinity mask and the cgroup's cpu.max (v2) or
/// cpu.cfs_quota_us / cpu.cfs_period_us (v1). Never throws: what cannot be read counts as no limit
/// (the mask as 1 CPU).
[[nodiscard]] CpuBudget this_thread_cpu_budget() noexcept;
/// Parses a cgroup v2 cpu.max line ("max 100000" or "150000 100000"): CPUs, or unset for "max"
/// or text that is not a quota.
[[nodiscard]] std::optional<double> parse_cgroup_cpu_max(const std::string& text);

/// What a store runs with: the thread count and how it was chosen.
struct CopyThreadsChoice {
  int threads = 1;
  bool automatic = false;
  std::string reason;  ///< one line for stats and `hss info`
};
/// `configured` (hidden_state_copy_threads; unset = auto) against `budget`.
[[nodiscard]] CopyThreadsChoice choose_copy_threads(const std::optional<int64_t>& configured,
                                                    const CpuBudget& budget);

}  // namespace hss::detail
