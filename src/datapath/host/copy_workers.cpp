#include "datapath/host/copy_workers.hpp"

#include <unistd.h>

#include <algorithm>
#include <system_error>

#include "base/log.hpp"

namespace hss::detail {

CopyWorkers::CopyWorkers(int threads)
    : threads_(std::max(threads, 1)), owner_(static_cast<int>(getpid())) {}

CopyWorkers::~CopyWorkers() { stop(); }

void CopyWorkers::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
}

bool CopyWorkers::ensure_started() {
  // Only the caller holding busy_ gets here, so start_tried_ and workers_ have one writer; the
  // acquire/release of busy_ orders them for the next holder.
  if (start_tried_) return started_.load(std::memory_order_relaxed) > 0;
  start_tried_ = true;
  const auto wanted = static_cast<size_t>(threads_ - 1);
  try {
    workers_.reserve(wanted);
    for (size_t i = 1; i <= wanted; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  } catch (const std::exception& e) {  // std::system_error (no thread) or std::bad_alloc
    log(LogLevel::kWarn, "hidden_state_copy_threads: started " + std::to_string(workers_.size()) +
                             " of " + std::to_string(wanted) + " copy workers (" + e.what() +
                             "); the rest of each copy runs on the calling thread");
  }
  started_.store(static_cast<int>(workers_.size()), std::memory_order_release);
  return !workers_.empty();
}

void CopyWorkers::run_parts(size_t parts, PartFn fn, void* ctx) {
  // A forked child has none of the workers (fork copies the calling thread only): it copies alone.
  if (parts <= 1 || threads_ <= 1 || getpid() != owner_ ||
      busy_.exchange(true, std::memory_order_acquire)) {
    for (size_t i = 0; i < parts; ++i) fn(ctx, i);
    return;
  }
  if (!ensure_started()) {
    busy_.store(false, std::memory_order_release);
    for (size_t i = 0; i < parts; ++i) fn(ctx, i);
    return;
  }
  // Parts the workers take part in.
  const size_t shared = std::min(parts, static_cast<size_t>(started()) + 1);
  {
    std::lock_guard lock(mutex_);
    fn_ = fn;
    ctx_ = ctx;
    parts_ = shared;
    pending_ = shared - 1;
    ++generation_;
  }
  work_.notify_all();
  fn(ctx, 0);
  for (size_t i = shared; i < parts; ++i) fn(ctx, i);  // more parts than threads: the rest here
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
  }
  split_runs_.fetch_add(1, std::memory_order_relaxed);
  busy_.store(false, std::memory_order_release);
}

void CopyWorkers::worker_loop(size_t index) {
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    if (index >= parts_) continue;  // this call has fewer parts than threads
    const PartFn fn = fn_;
    void* const ctx = ctx_;
    lock.unlock();
    fn(ctx, index);
    lock.lock();
    // The part's writes happen before this decrement under the mutex, so before the caller's
    // return (a streaming part fences its own stores first).
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace hss::detail
