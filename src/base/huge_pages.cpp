#include "base/huge_pages.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <limits>

namespace hss::detail {

void* map_huge_pages(size_t bytes, bool noreserve) noexcept {
  if (bytes == 0 || bytes > std::numeric_limits<size_t>::max() - kHugePageBytes) {
    errno = EINVAL;
    return nullptr;
  }
  // One huge page more than asked, then the ends outside the aligned range unmapped.
  const size_t over = bytes + kHugePageBytes;
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (noreserve ? MAP_NORESERVE : 0);
  void* mem = ::mmap(nullptr, over, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (mem == MAP_FAILED) return nullptr;
  const auto begin = reinterpret_cast<uintptr_t>(mem);
  const uintptr_t aligned = (begin + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  const uintptr_t end = begin + over;
  // munmap takes whole 4 KiB pages: the tail starts at the page after the last byte asked for.
  const uintptr_t used_end = (aligned + bytes + 4095) & ~uintptr_t{4095};
  if (aligned > begin) (void)::munmap(mem, aligned - begin);
  if (end > used_end) (void)::munmap(reinterpret_cast<void*>(used_end), end - used_end);
  // Advice, not a requirement: EINVAL without THP support leaves 4 KiB pages.
  (void)::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

void unmap_huge_pages(void* p, size_t bytes) noexcept {
  if (p != nullptr) (void)::munmap(p, bytes);
}

}  // namespace hss::detail
