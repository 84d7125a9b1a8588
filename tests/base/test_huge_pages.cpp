// map_huge_pages (base/huge_pages.hpp): the mapping starts on a huge-page boundary, every byte
// asked for is usable, the kernel is asked for huge pages on exactly that range (THPeligible in
// /proc/self/smaps where THP is on), and sizes it cannot map are a nullptr with errno, not a
// wrapped length.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>

#include "base/huge_pages.hpp"

namespace hss::detail {
namespace {

/// The system's THP mode ("always", "madvise", "never"); nullopt where the file is absent.
std::optional<std::string> thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos) return std::nullopt;
  return line.substr(open + 1, close - open - 1);
}

/// The smaps block of the mapping that holds `p`: its range and its THPeligible value (-1: the
/// kernel does not report it).
struct Vma {
  uintptr_t begin = 0, end = 0;
  int thp_eligible = -1;
};
std::optional<Vma> vma_of(const void* p) {
  std::ifstream in("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::string line;
  std::optional<Vma> found;
  while (std::getline(in, line)) {
    unsigned long long b = 0, e = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &b, &e) == 2 && line.find(':') > line.find('-')) {
      if (found) return found;  // the next mapping starts: ours is complete
      if (at >= b && at < e) found = Vma{static_cast<uintptr_t>(b), static_cast<uintptr_t>(e), -1};
      continue;
    }
    int eligible = 0;
    if (found && std::sscanf(line.c_str(), "THPeligible: %d", &eligible) == 1) {
      found->thp_eligible = eligible;
    }
  }
  return found;
}

TEST(HugePages, MappingStartsOnAHugePageAndEveryByteIsUsable) {
  for (const size_t bytes : {size_t{1}, size_t{4096} + 1, kHugePageBytes, 3 * kHugePageBytes + 5}) {
    void* p = map_huge_pages(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0U) << bytes;
    std::memset(p, 0xA5, bytes);  // a byte past the mapping would fault here
    EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0xA5);
    const auto vma = vma_of(p);
    ASSERT_TRUE(vma.has_value());
    EXPECT_LE(vma->begin, reinterpret_cast<uintptr_t>(p));
    EXPECT_GE(vma->end, reinterpret_cast<uintptr_t>(p) + bytes);
    unmap_huge_pages(p, bytes);
  }
  unmap_huge_pages(nullptr, 4096);  // nothing to do
}

TEST(HugePages, TheRangeIsAskedForHugePages) {
  const auto mode = thp_mode();
  if (!mode || *mode == "never") GTEST_SKIP() << "transparent huge pages off on this machine";
  const size_t bytes = 4 * kHugePageBytes;
  void* p = map_huge_pages(bytes);
  ASSERT_NE(p, nullptr);
  const auto vma = vma_of(p);
  ASSERT_TRUE(vma.has_value());
  if (vma->thp_eligible < 0) {
    unmap_huge_pages(p, bytes);
    GTEST_SKIP() << "this kernel's smaps has no THPeligible";
  }
  // In `madvise` mode only MADV_HUGEPAGE makes the range eligible; in `always` it is anyway.
  EXPECT_EQ(vma->thp_eligible, 1) << "THP mode " << *mode;
  unmap_huge_pages(p, bytes);
}

TEST(HugePages, SizesThatCannotBeMappedAreNullWithErrno) {
  errno = 0;
  EXPECT_EQ(map_huge_pages(0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(map_huge_pages(std::numeric_limits<size_t>::max()), nullptr);  // no wrapped length
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(map_huge_pages(std::numeric_limits<size_t>::max() / 2), nullptr);  // no such memory
  EXPECT_NE(errno, 0);
}

}  // namespace
}  // namespace hss::detail
