// The disk tier's read pipeline (src/tiers/disk/file_read_ahead.hpp): items come back in order
// with their own bytes whatever the readers' count, N readers stay at most N items ahead of the
// caller, a reader's exception reaches the caller at its item, and a caller that stops early
// leaves no thread. The read buffers kept between fetches (AlignedBufferCache, disk_io.hpp): a
// pipeline's slots come from the cache and go back to it, however the pipeline ends.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tiers/disk/file_read_ahead.hpp"

namespace hss {
namespace {

using detail::AlignedBuffer;
using detail::AlignedBufferCache;
using detail::FileRead;
using detail::ReadOutcome;
using detail::FileReadAhead;

/// Writes `item` repeated over `bytes` bytes: each item's buffer says which item it holds.
FileRead fill(size_t item, AlignedBuffer& buffer, size_t bytes) {
  std::byte* out = buffer.reserve(bytes);
  std::memset(out, static_cast<int>(item & 0xff), bytes);
  FileRead r;
  r.got = bytes;
  return r;
}

/// Waits up to 10 s for `done` to reach `want`.
bool wait_for(const std::atomic<int>& done, int want) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (done.load() < want) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

class FileReadAheadReaders : public testing::TestWithParam<int> {};

TEST_P(FileReadAheadReaders, ItemsComeBackInOrderEachWithItsOwnBytes) {
  constexpr size_t kItems = 23;
  constexpr size_t kBytes = 3 * 4096 + 5;
  FileReadAhead pipeline(kItems, GetParam(), [](size_t item, AlignedBuffer& buffer) {
    // Later items finish first now and then: the order must come from the pipeline.
    if (item % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    FileRead r = fill(item, buffer, kBytes);
    r.outcome = item == 4 ? ReadOutcome::kGone : ReadOutcome::kRead;
    return r;
  });
  for (size_t i = 0; i < kItems; ++i) {
    const FileReadAhead::Item item = pipeline.next();
    ASSERT_EQ(item.read.got, kBytes);
    EXPECT_EQ(item.read.outcome, i == 4 ? ReadOutcome::kGone : ReadOutcome::kRead);
    for (size_t b = 0; b < kBytes; ++b) {
      ASSERT_EQ(item.buffer->data()[b], static_cast<std::byte>(i)) << "item " << i << " byte " << b;
    }
  }
  EXPECT_THROW((void)pipeline.next(), InvalidArgument);  // all taken
}

INSTANTIATE_TEST_SUITE_P(Readers, FileReadAheadReaders, testing::Values(1, 2, 4, 64));

/// With `readers` threads, while the caller holds item 0 exactly items 1..readers are read (item
/// readers + 1 waits for item 0's buffer); the next next() releases it, and the rest follow.
void expect_readers_stay_ahead_by_their_count(int readers) {
  constexpr int kItems = 20;
  std::atomic<int> reads_done{0};
  FileReadAhead pipeline(kItems, readers, [&](size_t item, AlignedBuffer& buffer) {
    FileRead r = fill(item, buffer, 64);
    reads_done.fetch_add(1);
    return r;
  });
  const FileReadAhead::Item first = pipeline.next();
  ASSERT_TRUE(wait_for(reads_done, readers + 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(reads_done.load(), readers + 1);
  EXPECT_EQ(first.buffer->data()[0], std::byte{0});  // item 0's bytes untouched meanwhile
  const FileReadAhead::Item second = pipeline.next();  // releases item 0's buffer
  EXPECT_EQ(second.buffer->data()[0], std::byte{1});
  ASSERT_TRUE(wait_for(reads_done, readers + 2));
  for (int i = 2; i < kItems; ++i) EXPECT_EQ(pipeline.next().buffer->data()[0], std::byte(i));
  EXPECT_EQ(reads_done.load(), kItems);
}

TEST(FileReadAhead, OneReaderStaysExactlyOneItemAheadOfTheCaller) {
  expect_readers_stay_ahead_by_their_count(1);
}

TEST(FileReadAhead, FourReadersStayAtMostFourItemsAheadOfTheCaller) {
  expect_readers_stay_ahead_by_their_count(4);
}

TEST(FileReadAhead, AReadersExceptionReachesTheCallerAtItsItem) {
  std::atomic<int> reads_done{0};
  FileReadAhead pipeline(6, 1, [&](size_t item, AlignedBuffer& buffer) {
    if (item == 2) throw std::bad_alloc();
    reads_done.fetch_add(1);
    return fill(item, buffer, 16);
  });
  EXPECT_EQ(pipeline.next().buffer->data()[0], std::byte{0});
  EXPECT_EQ(pipeline.next().buffer->data()[0], std::byte{1});
  EXPECT_THROW((void)pipeline.next(), std::bad_alloc);
  EXPECT_THROW((void)pipeline.next(), std::bad_alloc);  // item 3: never read, the same failure
  EXPECT_EQ(reads_done.load(), 2);  // nothing read after the failure
}

TEST(FileReadAhead, ACallerThatStopsEarlyLeavesNoThreadBehind) {
  std::atomic<int> reads_done{0};
  {
    FileReadAhead pipeline(100, 1, [&](size_t item, AlignedBuffer& buffer) {
      reads_done.fetch_add(1);
      return fill(item, buffer, 16);
    });
    (void)pipeline.next();
    ASSERT_TRUE(wait_for(reads_done, 2));
  }  // the destructor stops the reader, blocked on item 2's buffer, and joins it
  EXPECT_EQ(reads_done.load(), 2);
  { FileReadAhead none(0, 4, [](size_t, AlignedBuffer&) { return FileRead{}; }); }
  EXPECT_THROW(FileReadAhead(3, 0, [](size_t, AlignedBuffer&) { return FileRead{}; }),
               InvalidArgument);
}


TEST(AlignedBuffer, LargeBuffersAreHugePageMappingsSmallOnesAreNot) {
  AlignedBuffer small;
  std::byte* s = small.reserve(64 * 1024 + 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s) % detail::kDirectAlign, 0U);
  EXPECT_EQ(small.capacity(), 17 * 4096U);
  EXPECT_FALSE(small.huge_page_mapped());

  // A value's read (4 MiB and its header): a huge-page mapping from a huge-page boundary, its
  // tail in 4 KiB pages (no third huge page for the header's 4 KiB).
  AlignedBuffer large;
  std::byte* l = large.reserve((4 << 20) + 100);
  EXPECT_TRUE(large.huge_page_mapped());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(l) % detail::kHugePageBytes, 0U);
  EXPECT_EQ(large.capacity(), (4U << 20) + 4096);
  std::memset(l, 0x5A, large.capacity());  // every byte of the capacity is the buffer's
  EXPECT_EQ(large.reserve(4 << 20), l);  // no larger: the same memory

  // Growing past kHugePageBytes turns a small buffer into a mapping.
  EXPECT_NE(small.reserve(detail::kHugePageBytes), nullptr);
  EXPECT_TRUE(small.huge_page_mapped());
  EXPECT_EQ(small.capacity(), detail::kHugePageBytes);
}

TEST(AlignedBufferCache, KeepsAtMostItsCountAndHandsBackTheSameMemory) {
  AlignedBufferCache cache(2);
  AlignedBuffer none = cache.take();  // nothing kept yet: an empty buffer
  EXPECT_EQ(none.data(), nullptr);
  cache.give_back(std::move(none));  // holding nothing: not kept
  EXPECT_EQ(cache.kept(), 0U);

  std::vector<AlignedBuffer> grown(3);
  std::set<const std::byte*> memory;
  for (AlignedBuffer& b : grown) memory.insert(b.reserve(3 * 4096 + 1));
  ASSERT_EQ(memory.size(), 3U);
  for (AlignedBuffer& b : grown) cache.give_back(std::move(b));
  EXPECT_EQ(cache.kept(), 2U);  // the third was freed

  for (int i = 0; i < 2; ++i) {
    AlignedBuffer b = cache.take();
    ASSERT_NE(b.data(), nullptr);
    EXPECT_TRUE(memory.contains(b.data()));
    EXPECT_EQ(b.capacity(), 4 * 4096U);  // rounded up, and kept at that size
    EXPECT_EQ(b.reserve(4096), b.data());  // no larger: the same memory
  }
  EXPECT_EQ(cache.kept(), 0U);
  EXPECT_EQ(cache.take().data(), nullptr);
}

/// The buffers the reads of one pipeline went into, by address.
std::set<const std::byte*> pipeline_buffers(size_t items, int readers, AlignedBufferCache& cache,
                                            size_t throw_at = SIZE_MAX) {
  std::mutex mutex;
  std::set<const std::byte*> seen;
  FileReadAhead pipeline(
      items, readers,
      [&](size_t item, AlignedBuffer& buffer) {
        if (item == throw_at) throw std::bad_alloc();
        FileRead r = fill(item, buffer, 2 * 4096);
        std::lock_guard lock(mutex);
        seen.insert(buffer.data());
        return r;
      },
      &cache);
  for (size_t i = 0; i < items; ++i) {
    try {
      EXPECT_EQ(pipeline.next().buffer->data()[0], static_cast<std::byte>(i));
    } catch (const std::bad_alloc&) {
      EXPECT_EQ(i, throw_at);
      break;
    }
  }
  std::lock_guard lock(mutex);
  return seen;
}

TEST(FileReadAhead, ItsSlotsComeFromTheCacheAndGoBackToItHoweverItEnds) {
  AlignedBufferCache cache(8);
  const std::set<const std::byte*> first = pipeline_buffers(12, 2, cache);
  EXPECT_EQ(first.size(), 3U);  // readers + 1 slots
  EXPECT_EQ(cache.kept(), 3U);
  // The next pipelines read into the same memory: nothing allocated, no page faulted in afresh,
  // also after a reader's exception ended one early.
  const std::set<const std::byte*> failed = pipeline_buffers(12, 2, cache, 5);
  EXPECT_TRUE(std::includes(first.begin(), first.end(), failed.begin(), failed.end()));
  EXPECT_EQ(cache.kept(), 3U);
  const std::set<const std::byte*> again = pipeline_buffers(12, 1, cache);
  EXPECT_EQ(again.size(), 2U);
  EXPECT_TRUE(std::includes(first.begin(), first.end(), again.begin(), again.end()));
  EXPECT_EQ(cache.kept(), 3U);
}

TEST(AlignedBufferCache, ThreadsTakingAndGivingBackAtOnceNeverShareABuffer) {
  AlignedBufferCache cache(3);
  std::mutex mutex;
  std::set<const std::byte*> in_use;
  std::atomic<int> shared{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        AlignedBuffer b = cache.take();
        const std::byte* p = b.reserve(4096);
        {
          std::lock_guard lock(mutex);
          if (!in_use.insert(p).second) shared.fetch_add(1);
        }
        std::memset(b.data(), t, 4096);
        {
          std::lock_guard lock(mutex);
          in_use.erase(p);
        }
        cache.give_back(std::move(b));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(shared.load(), 0);
  EXPECT_LE(cache.kept(), 3U);
}

}  // namespace
}  // namespace hss
