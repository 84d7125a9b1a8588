#pragma once
// hss::detail::WriteBehind: the write-behind queue every backing tier shares (docs/design.md,
// "Tier machinery"). A tier's enqueue_write checks its own admission (a disabled directory, a
// server that refuses writes) and hands the value here; this queue owns the rest:
//
// * Validation. payload_bytes(): the pieces must add up to the shape in the row format
//   (InvalidArgument naming the tier, nothing queued).
// * Pieces. With an owner the pieces are borrowed and the owner is held until the write is done
//   or dropped (the tier chain lends pool granules); without one they are copied now.
// * Budget. budget_bytes of payload may wait; beyond it the oldest waiting writes are dropped
//   (counted). A value larger than the budget, or one offered after close(), is dropped at once.
// * Writer threads and their roles. writer_threads = 1: one writer at nice 10, woken only when
//   it was idle (a busy writer finds the write when its batch is done). N >= 2: N - 1 idle
//   writers (SCHED_IDLE: they write whenever the queue has work, on CPU time nothing else wants;
//   nice 10 where SCHED_IDLE is refused) and one pressure writer (nice 10) that writes only while
//   the queue holds 3/4 of its budget, a flush() waits, or the queue stops, so that a machine
//   busy at every moment still drains the queue before it drops. A writer takes up to
//   max_batch_writes (and max_batch_bytes, at least one write) and gives them to the tier's
//   WriteBehindIo::write_batch outside the queue lock; the owners are released outside it too.
// * Jobs. post() runs a function on a writer thread before the next batch (the disk tier's
//   deletions); flush() waits for them too.
// * Counters: writes_enqueued, dropped_writes (the queue's drops, the tier's via count_dropped),
//   queue_bytes. The tier reports them in its TierStats.
//
// Thread safety: every method may be called from many threads at once, except start() (once,
// after the tier's state is built) and stop() (once, before it goes; the destructor does it).
// enqueue, post and count_dropped never block on I/O (the queue lock covers queue updates only);
// flush and close wait for the writers.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "tiers/backing_tier.hpp"

namespace hss::detail {

/// One value waiting to be written.
struct QueuedWrite {
  TierWrite write;
  uint64_t bytes = 0;  ///< payload bytes
  size_t lane = 0;     ///< the tier's routing (the Redis tier: the server's index)
  std::function<bool()> ready;

  /// The payload, in order (valid while this write lives).
  [[nodiscard]] std::span<const std::span<const std::byte>> payload() const noexcept {
    return pieces_;
  }

 private:
  friend class WriteBehind;
  std::vector<std::byte> copied_;                   // the payload, when it was copied at enqueue
  std::vector<std::span<const std::byte>> pieces_;  // borrowed, or one span over copied_
  std::shared_ptr<const void> owner_;
};

/// What a tier supplies: its I/O.
class WriteBehindIo {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~WriteBehindIo() = default;
  /// Writes `batch` (a writer thread, no queue lock held): each write's `ready` is the tier's to
  /// call before its bytes are read (false: drop it, counted). Counts its own done and failed
  /// writes (WriteBehind::count_dropped for a drop). Must not throw.
  virtual void write_batch(std::span<QueuedWrite> batch) noexcept = 0;
  /// Work of the (single) writer between batches while the queue runs, no lock held (the Redis
  /// tier: reconnects). `force`: wake(true) asked for it now. Returns when it is due again.
  virtual std::optional<Clock::time_point> maintain(bool force) {
    (void)force;
    return std::nullopt;
  }
};

struct WriteBehindOptions {
  uint64_t budget_bytes = 0;           ///< payload bytes that may wait; oldest dropped beyond
  int writer_threads = 1;              ///< >= 1 (roles above)
  size_t max_batch_writes = 1;         ///< writes a writer takes at once
  uint64_t max_batch_bytes = UINT64_MAX;  ///< their payload bytes (a first write always fits)
  bool maintains = false;              ///< call WriteBehindIo::maintain between batches
};

class WriteBehind {
 public:
  using Clock = WriteBehindIo::Clock;

  WriteBehind(WriteBehindOptions options, WriteBehindIo& io);
  ~WriteBehind();
  WriteBehind(const WriteBehind&) = delete;
  WriteBehind& operator=(const WriteBehind&) = delete;

  /// Starts the writer threads (once, after the tier's state is built).
  void start();
  /// Writes what is queued, then joins the writers (idempotent; before the tier's state goes).
  void stop();

  /// The payload bytes of `write` when `pieces` make it up; InvalidArgument ("<tier> write of
  /// N bytes for rows = .., cols = .. of <format> (needs M, rows and cols > 0)") otherwise.
  [[nodiscard]] static size_t payload_bytes(std::string_view tier, const TierWrite& write,
                                            std::span<const std::span<const std::byte>> pieces);

  /// False (and counted as dropped) when a value of `bytes` can never be queued: over the
  /// budget, or the queue closed.
  [[nodiscard]] bool admits(uint64_t bytes);
  /// Queues `write` (payload_bytes and admits passed): borrows the pieces while `owner` lives,
  /// else copies them now; drops the oldest beyond the budget. Returns true.
  bool enqueue(const TierWrite& write, uint64_t bytes,
               std::span<const std::span<const std::byte>> pieces,
               std::shared_ptr<const void> owner, std::function<bool()> ready, size_t lane = 0);
  /// Runs `job` on a writer thread before its next batch (flush waits for it).
  void post(std::function<void()> job);
  /// Wakes the writers (maintain runs again; `force` is passed to it once).
  void wake(bool force = false);

  void count_dropped(uint64_t writes) noexcept {
    dropped_.fetch_add(writes, std::memory_order_relaxed);
  }
  /// Waits until every write and job queued before the call is done or dropped.
  void flush();
  /// Later writes are dropped (counted); waits for those queued (as flush). Idempotent.
  void close();
  [[nodiscard]] bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

  [[nodiscard]] uint64_t writes_enqueued() const noexcept { return enqueued_.load(); }
  [[nodiscard]] uint64_t dropped_writes() const noexcept { return dropped_.load(); }
  [[nodiscard]] uint64_t queue_bytes() const;

 private:
  enum class Role {
    kIdle,      ///< SCHED_IDLE: writes whenever the queue has work
    kPressure,  ///< nice 10: writes only under pressure (3/4 full, a flush, stopping)
    kOnly,      ///< writer_threads == 1: nice 10, always
  };
  void run(Role role);
  /// Whether the pressure writer writes now. Lock held.
  [[nodiscard]] bool under_pressure_locked() const;

  const WriteBehindOptions opts_;
  WriteBehindIo& io_;

  mutable std::mutex mutex_;  // the queue, the jobs and the flags below
  std::condition_variable work_cv_, idle_cv_;
  std::deque<QueuedWrite> queue_;
  uint64_t queue_bytes_ = 0;
  std::vector<std::function<void()>> jobs_;
  int in_flight_ = 0;  // batches and jobs being done
  int flushers_ = 0;   // flush() calls waiting: the pressure writer helps them
  bool stopping_ = false;
  bool wake_ = false;
  bool force_ = false;
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> enqueued_{0}, dropped_{0};
  std::vector<std::thread> threads_;
};

}  // namespace hss::detail
