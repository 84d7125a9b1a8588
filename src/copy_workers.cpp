#include "copy_workers.hpp"

#include <unistd.h>

#include <algorithm>

namespace hss::detail {

CopyWorkers::CopyWorkers(int threads) : owner_(static_cast<int>(getpid())) {
  const size_t workers = threads > 1 ? static_cast<size_t>(threads - 1) : 0;
  workers_.reserve(workers);
  try {
    for (size_t i = 1; i <= workers; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  } catch (...) {
    stop();
    throw;
  }
}

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

void CopyWorkers::run_parts(size_t parts, PartFn fn, void* ctx) {
  // A forked child has none of the workers (fork copies the calling thread only): it copies alone.
  if (parts <= 1 || workers_.empty() || getpid() != owner_ ||
      busy_.exchange(true, std::memory_order_acquire)) {
    for (size_t i = 0; i < parts; ++i) fn(ctx, i);
    return;
  }
  const size_t shared = std::min(parts, workers_.size() + 1);  // parts the workers take part in
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
