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
  {
    Config c = test::store_config(16, 32, 2);
    ChunkedTokenDatabase db(16, false);
    HiddenStateStore store(c, db);
    const auto a = test::make_tokens(32, 1), b = test::make_tokens(32, 2);
    const auto ra = test::make_rows(a, 0, 0, 32), rb = test::make_rows(b, 0, 0, 32);
    ASSERT_EQ(store.store_hidden_states(a, test::view_of(ra, 32)), 2);
    ASSERT_EQ(store.store_hidden_states(b, test::view_of(rb, 32)), 2);  // evicts a
    ASSERT_TRUE(store.retrieve_hidden_states(b).has_value());
  }
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
