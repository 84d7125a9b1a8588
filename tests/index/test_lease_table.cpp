// The lease table (src/index/lease_table.hpp): ids from getrandom, never 0; bounded in count and
// bytes. getrandom is interposed here (the test binary links the library statically): while a
// thread has scripted values queued, its calls are answered from them, every other call goes to
// the C library.
#include <dlfcn.h>
#include <sys/random.h>
#include <sys/types.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <vector>

#include "index/lease_table.hpp"

namespace {
thread_local std::deque<uint64_t> scripted_ids;  // what this thread's getrandom calls answer
thread_local int getrandom_calls = 0;
}  // namespace

extern "C" ssize_t getrandom(void* buffer, size_t length, unsigned int flags) {
  ++getrandom_calls;
  if (!scripted_ids.empty() && length == sizeof(uint64_t)) {
    const uint64_t id = scripted_ids.front();
    scripted_ids.pop_front();
    std::memcpy(buffer, &id, sizeof(id));
    return static_cast<ssize_t>(length);
  }
  using Real = ssize_t (*)(void*, size_t, unsigned int);
  static const auto real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "getrandom"));
  return real(buffer, length, flags);
}

namespace hss::detail {
namespace {

using Clock = LeaseTable::Clock;
constexpr uint64_t kNoBound = UINT64_MAX;

Clock::time_point later() { return Clock::now() + std::chrono::hours(1); }

TEST(LeaseTable, IdsAreDrawnFromGetrandom) {
  LeaseTable table(kNoBound, kNoBound);
  scripted_ids = {0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(table.add({}, 1, later()), 0x0123456789abcdefULL);
  EXPECT_EQ(table.add({}, 1, later()), 0xfedcba9876543210ULL);
  EXPECT_TRUE(scripted_ids.empty());
}

TEST(LeaseTable, AZeroOrHeldIdIsDrawnAgain) {
  LeaseTable table(kNoBound, kNoBound);
  scripted_ids = {7, 0, 7, 9};
  EXPECT_EQ(table.add({}, 1, later()), 7U);
  EXPECT_EQ(table.add({}, 1, later()), 9U);  // 0 is "no lease", 7 is held
}

TEST(LeaseTable, UnscriptedIdsComeFromTheKernelAndDiffer) {
  LeaseTable table(kNoBound, kNoBound);
  const int before = getrandom_calls;
  const uint64_t a = table.add({}, 1, later()), b = table.add({}, 1, later());
  EXPECT_GE(getrandom_calls - before, 2);
  EXPECT_NE(a, 0U);
  EXPECT_NE(a, b);
}

TEST(LeaseTable, ALeasePastTheCountBoundIsRefusedUntilOneEnds) {
  LeaseTable table(2, kNoBound);
  const uint64_t a = table.add({}, 10, later());
  ASSERT_NE(a, 0U);
  ASSERT_NE(table.add({}, 10, later()), 0U);
  EXPECT_EQ(table.add({}, 10, later()), 0U);
  EXPECT_EQ(table.counts().held, 2U);
  EXPECT_TRUE(table.release(a, Clock::now()));
  EXPECT_NE(table.add({}, 10, later()), 0U);
}

TEST(LeaseTable, ALeasePastTheByteBoundIsRefused) {
  LeaseTable table(100, 100);
  ASSERT_NE(table.add({}, 60, later()), 0U);
  EXPECT_EQ(table.add({}, 41, later()), 0U);
  EXPECT_EQ(table.counts().bytes, 60U);
  EXPECT_NE(table.add({}, 40, later()), 0U);
  EXPECT_EQ(table.counts().bytes, 100U);
  EXPECT_EQ(table.add({}, 1, later()), 0U);
}

}  // namespace
}  // namespace hss::detail
