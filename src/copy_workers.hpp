#pragma once
// The threads that split one large host copy (hidden_state_copy_threads,
// Config::tuning.copy_threads).
//
// Why: one core drives a fraction of a server socket's memory bandwidth (a 256 MiB restore takes
// ~25 ms on one thread of the CI VMs). A host store or restore of at least two
// kMinBytesPerCopyThread is cut into up to threads() contiguous parts: the calling thread copies
// the first, the workers the others, and the call returns once every part is done. The default is
// one thread (no workers): an engine's cores are its own.
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

/// The smallest part worth waking a thread for (a wake-up costs 10-50 us on a VM; 4 MiB take
/// ~300 us to copy from DRAM). HostCopyContext::min_split_bytes defaults to it.
inline constexpr uint64_t kMinBytesPerCopyThread = uint64_t{4} << 20;

class CopyWorkers {
 public:
  /// Starts threads - 1 workers (threads >= 2). Throws std::system_error when one cannot start;
  /// the ones already started are joined first.
  explicit CopyWorkers(int threads);
  ~CopyWorkers();
  CopyWorkers(const CopyWorkers&) = delete;
  CopyWorkers& operator=(const CopyWorkers&) = delete;

  [[nodiscard]] int threads() const { return static_cast<int>(workers_.size()) + 1; }

  /// Calls part(i) once for every i in [0, parts): part 0 (and any beyond threads()) on the
  /// calling thread, the others on the workers; all on the calling thread when the workers are
  /// busy with another call. Returns when every part has returned; `part` must not throw.
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
  void worker_loop(size_t index);
  void stop() noexcept;

  std::mutex mutex_;  // guards everything below up to workers_
  std::condition_variable work_;
  std::condition_variable done_;
  uint64_t generation_ = 0;  // one per call that uses the workers
  size_t parts_ = 0;
  size_t pending_ = 0;  // worker parts of this generation not finished yet
  PartFn fn_ = nullptr;
  void* ctx_ = nullptr;
  bool stopping_ = false;
  std::atomic<bool> busy_{false};  // a call holds the workers
  std::atomic<uint64_t> split_runs_{0};
  const int owner_;  // the process that started the workers (getpid)
  std::vector<std::thread> workers_;
};

}  // namespace hss::detail
