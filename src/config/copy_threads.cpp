#include "config/copy_threads.hpp"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace hss::detail {
namespace {

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

/// cgroup v1: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
std::optional<double> cgroup_v1_cpus() {
  const std::string quota = read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
  const std::string period = read_first_line("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  if (quota.empty() || period.empty()) return std::nullopt;
  return parse_cgroup_cpu_max(quota + " " + period);
}

}  // namespace

int CpuBudget::usable() const {
  int cpus = std::max(affinity, 1);
  if (cgroup_cpus && *cgroup_cpus > 0) {
    // A quota of 1.5 CPUs lets 2 threads run part of the time: round up, as the Go and Java
    // runtimes do for their default parallelism.
    const double quota = std::ceil(*cgroup_cpus);
    if (quota < static_cast<double>(cpus)) cpus = std::max(static_cast<int>(quota), 1);
  }
  return cpus;
}

std::optional<double> parse_cgroup_cpu_max(const std::string& text) {
  std::istringstream in(text);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return std::nullopt;
  char* end = nullptr;
  const double q = std::strtod(quota.c_str(), &end);
  if (end == quota.c_str() || *end != '\0' || !std::isfinite(q) || q <= 0) return std::nullopt;
  return q / period;
}

CpuBudget this_thread_cpu_budget() noexcept {
  CpuBudget budget;
  try {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof mask, &mask) == 0) budget.affinity = CPU_COUNT(&mask);
    budget.cgroup_cpus = parse_cgroup_cpu_max(read_first_line("/sys/fs/cgroup/cpu.max"));
    if (!budget.cgroup_cpus) budget.cgroup_cpus = cgroup_v1_cpus();
  } catch (...) {  // an allocation failure while reading: count it as no limit
  }
  return budget;
}

CopyThreadsChoice choose_copy_threads(const std::optional<int64_t>& configured,
                                      const CpuBudget& budget) {
  CopyThreadsChoice choice;
  if (configured) {
    choice.threads = static_cast<int>(std::max<int64_t>(*configured, 1));
    choice.reason = "hidden_state_copy_threads " + std::to_string(*configured);
    return choice;
  }
  choice.automatic = true;
  const int usable = budget.usable();
  choice.threads = std::min(usable, kAutoCopyThreadsCap);
  choice.reason = "auto: " + std::to_string(budget.affinity) + " CPUs in the affinity mask";
  if (budget.cgroup_cpus) {
    std::ostringstream quota;
    quota << *budget.cgroup_cpus;
    choice.reason += ", cgroup quota " + quota.str() + " CPUs";
  }
  if (usable > kAutoCopyThreadsCap) {
    choice.reason += ", capped at " + std::to_string(kAutoCopyThreadsCap);
  }
  return choice;
}

}  // namespace hss::detail
