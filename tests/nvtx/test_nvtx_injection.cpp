// The ranges reach NVTX itself: run with NVTX_INJECTION64_PATH pointing at the recorder library
// (tests/nvtx/recorder.cpp), which the NVTX loader injects on the first NVTX call.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "hss/hss.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using EventsFn = std::vector<std::string> (*)();

TEST(NvtxInjection, StoreRetrieveAndEvictRangesReachNvtxInDomainHss) {
  const char* path = std::getenv("NVTX_INJECTION64_PATH");
  ASSERT_NE(path, nullptr) << "run through ctest: it sets NVTX_INJECTION64_PATH";
  ASSERT_NO_FATAL_FAILURE(test::run_every_stage_once());
  // The loader has dlopen'ed the library already; RTLD_NOLOAD fails if it has not.
  void* handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr) << "the NVTX loader did not inject " << path;
  auto events_fn = reinterpret_cast<EventsFn>(dlsym(handle, "hss_test_nvtx_events"));
  ASSERT_NE(events_fn, nullptr);
  const std::vector<std::string> events = events_fn();
  dlclose(handle);

  auto count = [&](const std::string& e) { return std::count(events.begin(), events.end(), e); };
  EXPECT_EQ(count("domain:hss"), 1);
  for (const char* name : {"store", "store/keys", "store/alloc", "store/gather_cast", "evict",
                           "retrieve", "retrieve/walk", "retrieve/assemble"}) {
    EXPECT_GE(count(std::string("push:hss:") + name), 1) << name;
  }
  EXPECT_EQ(count("push:hss:store"), 2);
  const auto pushes = std::count_if(events.begin(), events.end(), [](const std::string& e) {
    return e.rfind("push:hss:", 0) == 0;
  });
  EXPECT_EQ(pushes, count("pop:hss"));
}

}  // namespace
}  // namespace hss
