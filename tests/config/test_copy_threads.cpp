// hidden_state_copy_threads: auto (the default) against the CPUs the constructing thread may
// use, the cgroup quota, the cap; workers started lazily; the split size per part.
#include <gtest/gtest.h>
#include <sched.h>

#include <cstring>
#include <optional>
#include <thread>

#include "config/copy_threads.hpp"
#include "datapath/host/copy_workers.hpp"
#include "datapath/host/host_copy.hpp"
#include "hss/hss.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using detail::choose_copy_threads;
using detail::CpuBudget;
using detail::parse_cgroup_cpu_max;

TEST(CopyThreads, CgroupCpuMaxParses) {
  EXPECT_EQ(parse_cgroup_cpu_max("max 100000"), std::nullopt);
  EXPECT_EQ(parse_cgroup_cpu_max("max 100000\n"), std::nullopt);
  EXPECT_EQ(parse_cgroup_cpu_max("200000 100000"), 2.0);
  EXPECT_EQ(parse_cgroup_cpu_max("150000 100000"), 1.5);
  EXPECT_EQ(parse_cgroup_cpu_max("50000 100000"), 0.5);
  EXPECT_EQ(parse_cgroup_cpu_max(""), std::nullopt);
  EXPECT_EQ(parse_cgroup_cpu_max("-1 100000"), std::nullopt);  // cgroup v1: no quota
  EXPECT_EQ(parse_cgroup_cpu_max("abc 100000"), std::nullopt);
  EXPECT_EQ(parse_cgroup_cpu_max("100000 0"), std::nullopt);
  EXPECT_EQ(parse_cgroup_cpu_max("100000"), std::nullopt);
}

TEST(CopyThreads, UsableCpusAreTheMaskLoweredByTheQuotaRoundedUp) {
  EXPECT_EQ((CpuBudget{4, std::nullopt}).usable(), 4);
  EXPECT_EQ((CpuBudget{4, 2.0}).usable(), 2);
  EXPECT_EQ((CpuBudget{4, 1.5}).usable(), 2);
  EXPECT_EQ((CpuBudget{4, 0.5}).usable(), 1);
  EXPECT_EQ((CpuBudget{2, 16.0}).usable(), 2);  // a quota above the mask does not add CPUs
  EXPECT_EQ((CpuBudget{0, std::nullopt}).usable(), 1);
}

TEST(CopyThreads, AutoIsTheUsableCpusCappedAndOneOnOneCpu) {
  const auto one = choose_copy_threads(std::nullopt, {1, std::nullopt});
  EXPECT_EQ(one.threads, 1);
  EXPECT_TRUE(one.automatic);
  const auto six = choose_copy_threads(std::nullopt, {6, std::nullopt});
  EXPECT_EQ(six.threads, 6);
  EXPECT_EQ(six.reason, "auto: 6 CPUs in the affinity mask");
  const auto big = choose_copy_threads(std::nullopt, {96, std::nullopt});
  EXPECT_EQ(big.threads, detail::kAutoCopyThreadsCap);
  EXPECT_NE(big.reason.find("capped at 8"), std::string::npos) << big.reason;
  const auto quota = choose_copy_threads(std::nullopt, {96, 3.0});
  EXPECT_EQ(quota.threads, 3);
  EXPECT_NE(quota.reason.find("cgroup quota 3 CPUs"), std::string::npos) << quota.reason;
  // An explicit count is kept, whatever the machine.
  const auto fixed = choose_copy_threads(int64_t{12}, {1, 0.5});
  EXPECT_EQ(fixed.threads, 12);
  EXPECT_FALSE(fixed.automatic);
  EXPECT_EQ(fixed.reason, "hidden_state_copy_threads 12");
}

/// The CPU count of the calling thread's mask, as the test reads it itself.
int mask_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  EXPECT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
  return CPU_COUNT(&mask);
}

TEST(CopyThreads, AStoreBuiltOnAThreadPinnedToOneCpuCopiesAlone) {
  Config config = test::store_config(16, 32, 4);
  ChunkedTokenDatabase db(16, false);
  std::optional<HostCopyStats> pinned;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    EXPECT_EQ(config.effective_copy_threads(), 1);
    const HiddenStateStore store(config, db);
    pinned = store.stats().host_copy;
  });
  t.join();
  ASSERT_TRUE(pinned);
  EXPECT_EQ(pinned->copy_threads, 1);
  EXPECT_TRUE(pinned->copy_threads_auto);
  EXPECT_EQ(pinned->copy_threads_reason.rfind("auto: 1 CPUs in the affinity mask", 0), 0u)
      << pinned->copy_threads_reason;
  // Here: the whole mask, lowered by the quota, capped.
  const detail::CpuBudget budget = detail::this_thread_cpu_budget();
  EXPECT_EQ(budget.affinity, mask_cpus());
  const HiddenStateStore store(config, db);
  const HostCopyStats here = store.stats().host_copy;
  EXPECT_EQ(here.copy_threads, std::min(budget.usable(), detail::kAutoCopyThreadsCap));
  EXPECT_EQ(here.copy_threads, config.effective_copy_threads());
  EXPECT_TRUE(here.copy_threads_auto);
  EXPECT_EQ(here.copy_workers_started, 0);
}

TEST(CopyThreads, WorkersStartOnTheFirstSplitCallOnly) {
  detail::CopyWorkers workers(3);
  EXPECT_EQ(workers.threads(), 3);
  EXPECT_EQ(workers.started(), 0);
  int ran = 0;
  auto alone = [&](size_t) { ++ran; };
  workers.run(1, alone);  // one part: the calling thread, nothing started
  EXPECT_EQ(ran, 1);
  EXPECT_EQ(workers.started(), 0);
  std::atomic<int> parts{0};
  auto split = [&](size_t) { parts.fetch_add(1); };
  workers.run(3, split);
  EXPECT_EQ(parts.load(), 3);
  EXPECT_EQ(workers.started(), 2);
  EXPECT_EQ(workers.split_runs(), 1u);
}

TEST(CopyThreads, TheSplitSizeIsTheFamilysUnlessConfigured) {
  Config config = test::store_config(16, 32, 4);
  ChunkedTokenDatabase db(16, false);
  const HiddenStateStore family(config, db);
  EXPECT_EQ(family.stats().host_copy.min_bytes_per_copy_thread,
            detail::rule_for(detail::this_cpu()).info.min_bytes_per_copy_thread);
  config.tuning.copy_split_bytes = 65536;
  const HiddenStateStore configured(config, db);
  EXPECT_EQ(configured.stats().host_copy.min_bytes_per_copy_thread, 65536u);
  config.tuning.copy_split_bytes = 4095;
  EXPECT_THROW(config.validate(), ConfigError);
}

}  // namespace
}  // namespace hss
