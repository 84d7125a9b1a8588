#pragma once
// The threads that split one large host copy (hidden_state_copy_threads,
// Config::tuning.copy_threads).
//
// Why: one core drives a fraction of a server socket's memory bandwidth (a 256 MiB restore takes
// ~25 ms on one thread of the CI VMs). A host store or restore of at least two
// min_bytes_per_thread is cut into up to threads() contiguous parts: the calling thread copies
// the first, the workers the others, and the call returns once every part is done.
//
// How many threads a store gets (`auto`): copy_threads.hpp.
//
// Workers start lazily: the first call that splits starts them (on the thread that makes it, so
// they inherit that thread's affinity mask). A store whose calls all stay below the split size
// starts none. A worker that cannot start leaves the copies on the calling thread (logged once).
//
// Thread safety: run() may be called from many threads. One call at a time uses the workers; a
// call that finds them busy runs every part on its own thread rather than wait for another
// caller's copy. Workers sleep on a condition variable between calls and are joined by the
// destructor. In a child made by fork() (which has none of the workers) every call copies alone.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace hss::detail {

/// The smallest part worth waking a thread for, the split size of the CPU rules in host_copy.cpp
/// (HostCopyStats::min_bytes_per_copy_thread): on AMD EPYC two threads lost below 16 MiB calls,
/// broke even at 16 MiB and won from 32 MiB (a wake-up costs tens to hundreds of microseconds on
/// a VM; docs/perf.md, "Copy threads"). Families not measured yet take the same.
inline constexpr uint64_t kMinBytesPerCopyThread = uint64_t{16} << 20;

class CopyWorkers {
 public:
  /// Up to threads - 1 workers (threads >= 2), started by the first call that splits.
  explicit CopyWorkers(int threads);
  ~CopyWorkers();
  CopyWorkers(const CopyWorkers&) = delete;
  CopyWorkers& operator=(const CopyWorkers&) = delete;

  /// The threads a call may be split over (the caller's and the workers, started or not).
  [[nodiscard]] int threads() const { return threads_; }
  /// Workers running now (0 until the first split call).
  [[nodiscard]] int started() const { return started_.load(std::memory_order_acquire); }

  /// Calls part(i) once for every i in [0, parts): part 0 (and any beyond threads()) on the
  /// calling thread, the others on the workers; all on the calling thread when the workers are
  /// busy with another call or cannot start. Returns when every part has returned; `part` must
  /// not throw.
  template <typename Fn>
  void run(size_t parts, Fn& part) {
    run_parts(
        parts, [](void* fn, size_t i) { (*static_cast<Fn*>(fn))(i); }, &part);
  }

  /// Calls whose parts ran on more than one thread.
  [[nodiscard]] uint64_t split_runs() const { return split_runs_.load(std::memory_order_relaxed); }

 private:
  using PartFn = void (*)(void*, size_t);
  void run_parts(size_t parts, PartFn fn, void* ctx);
  /// Starts the workers once; false when none could start (the call then copies alone).
  bool ensure_started();
  void worker_loop(size_t index);
  void stop() noexcept;

  const int threads_;
  std::mutex mutex_;  // guards everything below up to workers_
  std::condition_variable work_;
  std::condition_variable done_;
  uint64_t generation_ = 0;  // one per call that uses the workers
  size_t parts_ = 0;
  size_t pending_ = 0;  // worker parts of this generation not finished yet
  PartFn fn_ = nullptr;
  void* ctx_ = nullptr;
  bool stopping_ = false;
  bool start_tried_ = false;
  std::atomic<int> started_{0};
  std::atomic<bool> busy_{false};  // a call holds the workers
  std::atomic<uint64_t> split_runs_{0};
  const int owner_;  // the process that made this object (getpid)
  std::vector<std::thread> workers_;
};

}  // namespace hss::detail
