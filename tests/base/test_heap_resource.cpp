// The pipelines' heap resource (src/base/heap_resource.hpp): every alignment a pmr container may
// ask is honoured, the plain and the aligned operator new each take what they must, and one heap
// compares equal to itself only as a heap (an arena is another resource).
#include "base/heap_resource.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory_resource>
#include <vector>

namespace hss::detail {
namespace {

TEST(HeapResource, EveryAlignmentAskedIsHonouredAndTheBytesAreUsable) {
  std::pmr::memory_resource* heap = heap_resource();
  ASSERT_NE(heap, nullptr);
  for (const size_t alignment : {size_t{1}, size_t{8}, size_t{16}, size_t{32}, size_t{64},
                                 size_t{4096}}) {
    for (const size_t bytes : {size_t{1}, size_t{24}, size_t{4096}, size_t{1} << 20}) {
      void* p = heap->allocate(bytes, alignment);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alignment, 0U)
          << bytes << " bytes aligned to " << alignment;
      std::memset(p, 0xA5, bytes);  // ASan: every byte asked for is there
      EXPECT_EQ(static_cast<unsigned char*>(p)[bytes - 1], 0xA5);
      heap->deallocate(p, bytes, alignment);
    }
  }
}

TEST(HeapResource, IsOneHeapAndNotAnArena) {
  std::pmr::memory_resource* heap = heap_resource();
  EXPECT_EQ(heap, heap_resource());
  EXPECT_TRUE(heap->is_equal(*heap_resource()));
  std::pmr::monotonic_buffer_resource arena(256, heap);
  EXPECT_FALSE(heap->is_equal(arena));
  EXPECT_FALSE(arena.is_equal(*heap));
}

TEST(HeapResource, BacksAContainerThatMovesAndGrows) {
  std::pmr::vector<int64_t> a(heap_resource());
  for (int64_t i = 0; i < 10000; ++i) a.push_back(i * 3);
  std::pmr::vector<int64_t> b(std::move(a));
  EXPECT_EQ(b.get_allocator().resource(), heap_resource());
  ASSERT_EQ(b.size(), 10000U);
  EXPECT_EQ(b[9999], 29997);
  std::pmr::vector<int64_t> c(heap_resource());
  c = std::move(b);  // equal resources: the buffer moves
  EXPECT_EQ(c[1234], 3702);
}

}  // namespace
}  // namespace hss::detail
