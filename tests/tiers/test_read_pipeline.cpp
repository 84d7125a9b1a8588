// The disk tier's read pipeline (src/tiers/disk/read_pipeline.hpp): items come back in order
// with their own bytes whatever the readers' count, N readers stay at most N items ahead of the
// caller, a reader's exception reaches the caller at its item, and a caller that stops early
// leaves no thread.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tiers/disk/read_pipeline.hpp"

namespace hss {
namespace {

using detail::AlignedBuffer;
using detail::FileRead;
using detail::ReadOutcome;
using detail::ReadPipeline;

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

class ReadPipelineReaders : public testing::TestWithParam<int> {};

TEST_P(ReadPipelineReaders, ItemsComeBackInOrderEachWithItsOwnBytes) {
  constexpr size_t kItems = 23;
  constexpr size_t kBytes = 3 * 4096 + 5;
  ReadPipeline pipeline(kItems, GetParam(), [](size_t item, AlignedBuffer& buffer) {
    // Later items finish first now and then: the order must come from the pipeline.
    if (item % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    FileRead r = fill(item, buffer, kBytes);
    r.outcome = item == 4 ? ReadOutcome::kGone : ReadOutcome::kRead;
    return r;
  });
  for (size_t i = 0; i < kItems; ++i) {
    const ReadPipeline::Item item = pipeline.next();
    ASSERT_EQ(item.read.got, kBytes);
    EXPECT_EQ(item.read.outcome, i == 4 ? ReadOutcome::kGone : ReadOutcome::kRead);
    for (size_t b = 0; b < kBytes; ++b) {
      ASSERT_EQ(item.buffer->data()[b], static_cast<std::byte>(i)) << "item " << i << " byte " << b;
    }
  }
  EXPECT_THROW((void)pipeline.next(), InvalidArgument);  // all taken
}

INSTANTIATE_TEST_SUITE_P(Readers, ReadPipelineReaders, testing::Values(1, 2, 4, 64));

/// With `readers` threads, while the caller holds item 0 exactly items 1..readers are read (item
/// readers + 1 waits for item 0's buffer); the next next() releases it, and the rest follow.
void expect_readers_stay_ahead_by_their_count(int readers) {
  constexpr int kItems = 20;
  std::atomic<int> reads_done{0};
  ReadPipeline pipeline(kItems, readers, [&](size_t item, AlignedBuffer& buffer) {
    FileRead r = fill(item, buffer, 64);
    reads_done.fetch_add(1);
    return r;
  });
  const ReadPipeline::Item first = pipeline.next();
  ASSERT_TRUE(wait_for(reads_done, readers + 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(reads_done.load(), readers + 1);
  EXPECT_EQ(first.buffer->data()[0], std::byte{0});  // item 0's bytes untouched meanwhile
  const ReadPipeline::Item second = pipeline.next();  // releases item 0's buffer
  EXPECT_EQ(second.buffer->data()[0], std::byte{1});
  ASSERT_TRUE(wait_for(reads_done, readers + 2));
  for (int i = 2; i < kItems; ++i) EXPECT_EQ(pipeline.next().buffer->data()[0], std::byte(i));
  EXPECT_EQ(reads_done.load(), kItems);
}

TEST(ReadPipeline, OneReaderStaysExactlyOneItemAheadOfTheCaller) {
  expect_readers_stay_ahead_by_their_count(1);
}

TEST(ReadPipeline, FourReadersStayAtMostFourItemsAheadOfTheCaller) {
  expect_readers_stay_ahead_by_their_count(4);
}

TEST(ReadPipeline, AReadersExceptionReachesTheCallerAtItsItem) {
  std::atomic<int> reads_done{0};
  ReadPipeline pipeline(6, 1, [&](size_t item, AlignedBuffer& buffer) {
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

TEST(ReadPipeline, ACallerThatStopsEarlyLeavesNoThreadBehind) {
  std::atomic<int> reads_done{0};
  {
    ReadPipeline pipeline(100, 1, [&](size_t item, AlignedBuffer& buffer) {
      reads_done.fetch_add(1);
      return fill(item, buffer, 16);
    });
    (void)pipeline.next();
    ASSERT_TRUE(wait_for(reads_done, 2));
  }  // the destructor stops the reader, blocked on item 2's buffer, and joins it
  EXPECT_EQ(reads_done.load(), 2);
  { ReadPipeline none(0, 4, [](size_t, AlignedBuffer&) { return FileRead{}; }); }
  EXPECT_THROW(ReadPipeline(3, 0, [](size_t, AlignedBuffer&) { return FileRead{}; }),
               InvalidArgument);
}

}  // namespace
}  // namespace hss
