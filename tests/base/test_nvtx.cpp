// Every pipeline stage is a range in domain "hss": the trace hook sees the same pushes and pops
// as NVTX, on host-only builds too.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>

#include "hss/hss.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

struct Recorder {
  std::mutex mutex;
  std::map<std::string, int> pushes, pops;
  static void hook(std::string_view name, bool push, void* self) {
    auto* r = static_cast<Recorder*>(self);
    std::lock_guard lock(r->mutex);
    (push ? r->pushes : r->pops)[std::string(name)]++;
  }
};

TEST(Trace, StoreRetrieveAndEvictEmitBalancedRanges) {
  Recorder recorder;
  trace::set_range_hook(&Recorder::hook, &recorder);
  ASSERT_NO_FATAL_FAILURE(test::run_every_stage_once());
  trace::set_range_hook(nullptr);
  for (const char* name : {"store", "store/keys", "store/alloc", "store/gather_cast", "evict",
                           "retrieve", "retrieve/walk", "retrieve/assemble"}) {
    EXPECT_GE(recorder.pushes[name], 1) << name;
    EXPECT_EQ(recorder.pushes[name], recorder.pops[name]) << name;
  }
  EXPECT_EQ(recorder.pushes["store"], 2);
  EXPECT_EQ(recorder.pushes["evict"], 2);
}

}  // namespace
}  // namespace hss
