// The write-behind queue every tier shares (src/tiers/write_behind.hpp), alone, with an I/O that
// records what it is given and can hold its writer: validation naming the tier, borrowed and
// copied pieces, drop-oldest beyond the budget with the owners released, a closed queue, posted
// jobs that flush waits for, batches, and maintain between batches.

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <optional>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "format/dtype_codes.hpp"
#include "hss/error.hpp"
#include "tiers/write_behind.hpp"

namespace hss {
namespace {

using detail::QueuedWrite;
using detail::TierWrite;
using detail::WriteBehind;
using detail::WriteBehindIo;
using detail::WriteBehindOptions;

constexpr int64_t kRows = 4;
constexpr int64_t kCols = 8;
constexpr uint64_t kBytes = kRows * kCols * 4;  // one float32 value

TierWrite write_of(uint64_t hash) {
  TierWrite w;
  w.key.model_name = "model";
  w.key.chunk_hash = hash;
  w.slot = Slot{ActivationKind::kHidden, 0};
  w.format = detail::to_row_format(DType::kFloat32);
  w.rows = kRows;
  w.cols = kCols;
  return w;
}

// Records every write it is given (its key hash, its payload's first byte and first piece's
// address), and holds its writer inside write_batch while `hold` is set.
class RecordingIo final : public WriteBehindIo {
 public:
  void write_batch(std::span<QueuedWrite> batch) noexcept override {
    std::unique_lock lock(mutex_);
    batches.push_back(batch.size());
    for (const QueuedWrite& w : batch) {
      hashes.push_back(w.write.key.chunk_hash);
      first_piece.push_back(w.payload().front().data());
      first_byte.push_back(w.payload().front().front());
    }
    ++entered_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !hold_; });
  }
  std::optional<Clock::time_point> maintain(bool force) override {
    std::lock_guard lock(mutex_);
    ++maintained;
    if (force) ++forced;
    return std::nullopt;
  }
  void hold() {
    std::lock_guard lock(mutex_);
    hold_ = true;
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      hold_ = false;
    }
    cv_.notify_all();
  }
  /// Waits until write_batch was entered `n` times in all.
  void wait_entered(int n) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return entered_ >= n; });
  }

  std::mutex mutex_;
  std::vector<size_t> batches;
  std::vector<uint64_t> hashes;
  std::vector<const std::byte*> first_piece;
  std::vector<std::byte> first_byte;
  int maintained = 0;
  int forced = 0;

 private:
  std::condition_variable cv_;
  bool hold_ = false;
  int entered_ = 0;
};

std::vector<std::byte> payload(std::byte fill) { return std::vector<std::byte>(kBytes, fill); }

bool enqueue(WriteBehind& q, uint64_t hash, std::span<const std::byte> bytes,
             std::shared_ptr<const void> owner = {}) {
  const std::span<const std::byte> pieces[] = {bytes};
  const size_t n = WriteBehind::payload_bytes("test", write_of(hash), pieces);
  if (!q.admits(n)) return false;
  return q.enqueue(write_of(hash), n, pieces, std::move(owner), {});
}

TEST(WriteBehind, PiecesThatDoNotMakeThePayloadAreRefusedNamingTheTier) {
  const std::vector<std::byte> short_value(kBytes - 1);
  const std::span<const std::byte> pieces[] = {short_value};
  try {
    (void)WriteBehind::payload_bytes("mytier", write_of(1), pieces);
    FAIL() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "mytier write of 127 bytes for rows = 4, cols = 8 of float32 (needs 128, rows and "
              "cols > 0)");
  }
}

TEST(WriteBehind, WithAnOwnerThePiecesAreBorrowedAndTheOwnerHeldUntilWritten) {
  RecordingIo io;
  WriteBehind q(WriteBehindOptions{.budget_bytes = 4 * kBytes}, io);
  auto value = std::make_shared<std::vector<std::byte>>(payload(std::byte{7}));
  const std::byte* const at = value->data();
  const std::weak_ptr<const void> watch = value;
  ASSERT_TRUE(enqueue(q, 1, *value, value));
  value.reset();
  EXPECT_FALSE(watch.expired());  // queued, not yet written: the queue holds the owner
  q.start();
  q.flush();
  EXPECT_TRUE(watch.expired());  // written: released
  ASSERT_EQ(io.first_piece.size(), 1U);
  EXPECT_EQ(io.first_piece[0], at);  // the caller's bytes, not a copy
}

TEST(WriteBehind, WithoutAnOwnerThePiecesAreCopiedAtEnqueue) {
  RecordingIo io;
  WriteBehind q(WriteBehindOptions{.budget_bytes = 4 * kBytes}, io);
  std::vector<std::byte> value = payload(std::byte{9});
  ASSERT_TRUE(enqueue(q, 1, value));
  std::memset(value.data(), 0, value.size());  // the caller's bytes may change at once
  q.start();
  q.flush();
  ASSERT_EQ(io.first_byte.size(), 1U);
  EXPECT_EQ(io.first_byte[0], std::byte{9});
  EXPECT_NE(io.first_piece[0], value.data());
}

TEST(WriteBehind, BeyondTheBudgetTheOldestWaitingWritesAreDroppedCountedAndReleased) {
  RecordingIo io;
  WriteBehind q(WriteBehindOptions{.budget_bytes = 2 * kBytes}, io);
  std::vector<std::weak_ptr<const void>> owners;
  for (uint64_t hash = 1; hash <= 3; ++hash) {
    auto value = std::make_shared<std::vector<std::byte>>(payload(std::byte{1}));
    owners.push_back(value);
    ASSERT_TRUE(enqueue(q, hash, *value, value));
  }
  EXPECT_EQ(q.dropped_writes(), 1U);
  EXPECT_EQ(q.writes_enqueued(), 3U);
  EXPECT_EQ(q.queue_bytes(), 2 * kBytes);
  EXPECT_TRUE(owners[0].expired());  // the oldest, dropped: its owner let go at once
  EXPECT_FALSE(owners[1].expired());
  q.start();
  q.flush();
  EXPECT_EQ(io.hashes, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(q.queue_bytes(), 0U);
}

TEST(WriteBehind, AValueLargerThanTheBudgetIsDroppedAtOnceCounted) {
  RecordingIo io;
  WriteBehind q(WriteBehindOptions{.budget_bytes = kBytes - 1}, io);
  q.start();
  const std::vector<std::byte> value = payload(std::byte{1});
  EXPECT_FALSE(enqueue(q, 1, value));
  EXPECT_EQ(q.dropped_writes(), 1U);
  EXPECT_EQ(q.writes_enqueued(), 0U);
}

TEST(WriteBehind, AfterCloseWritesAreDroppedCountedAndThoseQueuedBeforeAreWritten) {
  RecordingIo io;
  WriteBehind q(WriteBehindOptions{.budget_bytes = 4 * kBytes}, io);
  q.start();
  const std::vector<std::byte> value = payload(std::byte{1});
  ASSERT_TRUE(enqueue(q, 1, value));
  q.close();
  EXPECT_EQ(io.hashes, (std::vector<uint64_t>{1}));
  EXPECT_FALSE(enqueue(q, 2, value));
  EXPECT_EQ(q.dropped_writes(), 1U);
  EXPECT_TRUE(q.closed());
}

TEST(WriteBehind, FlushWaitsForPostedJobs) {
  RecordingIo io;
  WriteBehind q(WriteBehindOptions{.budget_bytes = 4 * kBytes, .writer_threads = 2}, io);
  q.start();
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i) q.post([&] { ran.fetch_add(1); });
  q.flush();
  EXPECT_EQ(ran.load(), 3);
}

TEST(WriteBehind, AWriterTakesUpToTheBatchLimitAtOnce) {
  RecordingIo io;
  WriteBehind q(WriteBehindOptions{.budget_bytes = 8 * kBytes, .max_batch_writes = 3}, io);
  const std::vector<std::byte> value = payload(std::byte{1});
  for (uint64_t hash = 1; hash <= 5; ++hash) ASSERT_TRUE(enqueue(q, hash, value));
  q.start();
  q.flush();
  EXPECT_EQ(io.batches, (std::vector<size_t>{3, 2}));
  EXPECT_EQ(io.hashes, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
}

TEST(WriteBehind, AMaintainingWriterRunsMaintainAndPassesAForcedWakeOnce) {
  RecordingIo io;
  WriteBehind q(WriteBehindOptions{.budget_bytes = 4 * kBytes, .maintains = true}, io);
  q.start();
  io.hold();
  const std::vector<std::byte> value = payload(std::byte{1});
  ASSERT_TRUE(enqueue(q, 1, value));
  io.wait_entered(1);  // the writer is inside write_batch: the wake below waits for it
  q.wake(/*force=*/true);
  io.release();
  q.flush();
  q.stop();
  std::lock_guard lock(io.mutex_);
  EXPECT_GE(io.maintained, 2);  // before the write, and after the wake
  EXPECT_EQ(io.forced, 1);
}

}  // namespace
}  // namespace hss
