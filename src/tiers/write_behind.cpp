#include "tiers/write_behind.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>

#include "format/value_codec.hpp"
#include "hss/error.hpp"

namespace hss::detail {
namespace {

constexpr int kWriterNice = 10;
/// The queue's fill (of the budget) from which the pressure writer writes too.
constexpr uint64_t kPressureNumerator = 3, kPressureDenominator = 4;

}  // namespace

WriteBehind::WriteBehind(WriteBehindOptions options, WriteBehindIo& io)
    : opts_(std::move(options)), io_(io) {}

WriteBehind::~WriteBehind() { stop(); }

void WriteBehind::start() {
  const int n = opts_.writer_threads < 1 ? 1 : opts_.writer_threads;
  try {
    for (int t = 0; t < n; ++t) {
      const Role role = n == 1 ? Role::kOnly : t + 1 == n ? Role::kPressure : Role::kIdle;
      threads_.emplace_back([this, role] { run(role); });
    }
  } catch (...) {
    stop();  // the threads already started, before the error leaves the tier's constructor
    throw;
  }
}

void WriteBehind::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

size_t WriteBehind::payload_bytes(std::string_view tier, const TierWrite& write,
                                  std::span<const std::span<const std::byte>> pieces) {
  const size_t bytes = tier_payload_bytes(write.format, write.rows, write.cols);
  size_t given = 0;
  for (const auto piece : pieces) given += piece.size();
  if (given != bytes || write.rows <= 0 || write.cols <= 0) {
    throw InvalidArgument(std::string(tier) + " write of " + std::to_string(given) +
                          " bytes for rows = " + std::to_string(write.rows) +
                          ", cols = " + std::to_string(write.cols) + " of " +
                          row_format_name(write.format) + " (needs " + std::to_string(bytes) +
                          ", rows and cols > 0)");
  }
  return bytes;
}

bool WriteBehind::admits(uint64_t bytes) {
  if (bytes <= opts_.budget_bytes && !closed()) return true;
  count_dropped(1);
  return false;
}

bool WriteBehind::enqueue(const TierWrite& write, uint64_t bytes,
                          std::span<const std::span<const std::byte>> pieces,
                          std::shared_ptr<const void> owner, std::function<bool()> ready,
                          size_t lane) {
  QueuedWrite w;
  w.write = write;
  w.bytes = bytes;
  w.lane = lane;
  w.ready = std::move(ready);
  if (owner) {
    w.pieces_.assign(pieces.begin(), pieces.end());
    w.owner_ = std::move(owner);
  } else {
    w.copied_.resize(bytes);
    size_t at = 0;
    for (const auto piece : pieces) {
      if (!piece.empty()) std::memcpy(w.copied_.data() + at, piece.data(), piece.size());
      at += piece.size();
    }
    w.pieces_.emplace_back(w.copied_);
  }

  std::vector<QueuedWrite> dropped;  // released after the lock: owners may free pool blocks
  bool writer_idle = false;
  {
    std::lock_guard lock(mutex_);
    writer_idle = queue_.empty() && in_flight_ == 0;
    while (!queue_.empty() && queue_bytes_ + bytes > opts_.budget_bytes) {
      queue_bytes_ -= queue_.front().bytes;
      dropped.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    queue_bytes_ += bytes;
    queue_.push_back(std::move(w));
  }
  count_dropped(dropped.size());
  enqueued_.fetch_add(1, std::memory_order_relaxed);
  // One writer: a busy one finds this write when its batch is done (waking it per write would
  // only make it contend with the storing thread). Roles: every writer, and one that is not to
  // write now waits again.
  if (opts_.writer_threads > 1) {
    work_cv_.notify_all();
  } else if (writer_idle) {
    work_cv_.notify_one();
  }
  return true;
}

void WriteBehind::post(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  work_cv_.notify_all();
}

void WriteBehind::wake(bool force) {
  {
    std::lock_guard lock(mutex_);
    wake_ = true;
    if (force) force_ = true;
  }
  work_cv_.notify_all();
}

void WriteBehind::flush() {
  std::unique_lock lock(mutex_);
  ++flushers_;  // the pressure writer writes until the queue is empty
  work_cv_.notify_all();
  idle_cv_.wait(lock, [&] { return queue_.empty() && jobs_.empty() && in_flight_ == 0; });
  --flushers_;
}

void WriteBehind::close() {
  closed_.store(true, std::memory_order_release);
  flush();
}

uint64_t WriteBehind::queue_bytes() const {
  std::lock_guard lock(mutex_);
  return queue_bytes_;
}

bool WriteBehind::under_pressure_locked() const {
  return stopping_ || flushers_ > 0 ||
         queue_bytes_ >= opts_.budget_bytes / kPressureDenominator * kPressureNumerator;
}

void WriteBehind::run(Role role) {
  // The write-behind must not slow the thread that stores. An idle writer asks for SCHED_IDLE
  // (any thread may; it runs when a CPU has nothing else to run); where that is refused, and for
  // the other roles, nice 10 (a tenth of a normal thread's share of a busy CPU). Failure only
  // loses that preference.
  bool idle = false;
  if (role == Role::kIdle) {
    const sched_param param{};
    idle = ::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &param) == 0;
  }
  if (!idle) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kWriterNice);
  const bool waits_for_pressure = role == Role::kPressure;
  const auto has_write = [&] {
    return !queue_.empty() && (!waits_for_pressure || under_pressure_locked());
  };
  std::unique_lock lock(mutex_);
  while (true) {
    if (!jobs_.empty()) {
      std::vector<std::function<void()>> jobs;
      jobs.swap(jobs_);
      ++in_flight_;
      lock.unlock();
      for (auto& job : jobs) job();
      jobs.clear();
      lock.lock();
      --in_flight_;
      continue;
    }
    std::optional<Clock::time_point> due;
    const bool force = std::exchange(force_, false);
    wake_ = false;
    if (opts_.maintains) {
      const bool stopping = stopping_;
      lock.unlock();
      if (!stopping) due = io_.maintain(force);
      lock.lock();
    }
    if (!has_write()) {
      if (queue_.empty()) idle_cv_.notify_all();
      if (stopping_ && queue_.empty()) break;
      const auto woken = [&] {
        return stopping_ || wake_ || force_ || has_write() || !jobs_.empty();
      };
      if (due) {
        work_cv_.wait_until(lock, *due, woken);
      } else {
        work_cv_.wait(lock, woken);
      }
      continue;
    }
    std::vector<QueuedWrite> batch;
    uint64_t batch_bytes = 0;
    while (!queue_.empty() && batch.size() < opts_.max_batch_writes &&
           (batch.empty() || batch_bytes + queue_.front().bytes <= opts_.max_batch_bytes)) {
      batch_bytes += queue_.front().bytes;
      queue_bytes_ -= queue_.front().bytes;
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    ++in_flight_;
    lock.unlock();
    io_.write_batch(batch);
    batch.clear();  // owners released outside the lock
    lock.lock();
    --in_flight_;
  }
}

}  // namespace hss::detail
