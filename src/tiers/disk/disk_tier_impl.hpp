#pragma once
// DiskTier's state (tiers/disk/disk_tier.hpp), shared by its two sources: disk_tier.cpp (the
// directory, the index, the write-behind and its writer threads) and disk_tier_read.cpp (reads:
// contains, fetch_each and the read pipeline). Private to tiers/disk/.

#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "base/log.hpp"
#include "format/value_codec.hpp"
#include "tiers/disk/disk_io.hpp"
#include "tiers/disk/disk_tier.hpp"

namespace hss::detail {
namespace disk_tier_parts {

/// Temporary files: "<name>.tmp.<pid>.<n>" (writes), ".direct-probe.tmp.<pid>" (the probe).
inline constexpr std::string_view kTempMark = ".tmp.";
/// The queue's fill (of DiskTierOptions::queue_bytes) from which the pressure writer writes too.
constexpr uint64_t kPressureNumerator = 3, kPressureDenominator = 4;

/// Writer roles (see "Write-behind" in disk_tier.hpp).
enum class WriterRole {
  kIdle,      ///< SCHED_IDLE: writes whenever the queue has work, on CPU time nobody else wants
  kPressure,  ///< nice 10: writes only while the queue is 3/4 full, a flush waits, or it stops
  kOnly,      ///< writer_threads == 1: nice 10, always
};

struct PendingWrite {
  std::string name;
  std::string mac_name;  // remote_key: what the MAC binds the value to
  RemoteHeader header;
  uint64_t bytes = 0;
  std::vector<std::byte> copied;
  std::vector<std::span<const std::byte>> borrowed;
  std::shared_ptr<const void> owner;
  std::function<bool()> ready;
};

struct FileInfo {
  uint64_t bytes = 0;
  uint64_t generation = 0;  // changes when the file is replaced: a reader deletes only what it read
  std::list<std::string>::iterator lru;
};

}  // namespace disk_tier_parts

struct DiskTier::Impl {
  using FileInfo = disk_tier_parts::FileInfo;
  using PendingWrite = disk_tier_parts::PendingWrite;
  using WriterRole = disk_tier_parts::WriterRole;

  explicit Impl(DiskTierOptions o) : opts(std::move(o)) {
    if (opts.writer_threads < 1) opts.writer_threads = 1;
    enabled = scan();
    try {
      for (int t = 0; t < opts.writer_threads; ++t) {
        const WriterRole role = opts.writer_threads == 1          ? WriterRole::kOnly
                                : t + 1 == opts.writer_threads ? WriterRole::kPressure
                                                               : WriterRole::kIdle;
        threads.emplace_back([this, role] { run(role); });
      }
    } catch (...) {
      stop();  // the threads already started, before the error leaves the constructor
      throw;
    }
  }
  ~Impl() {
    stop();
    release_directory();
  }
  /// Gives the directory's lock up (idempotent; close() and the destructor, never concurrently).
  void release_directory() noexcept {
    if (lock_fd >= 0) (void)::close(lock_fd);  // the directory is free for the next store
    lock_fd = -1;
  }
  void stop() {
    {
      std::lock_guard lock(queue_mutex);
      stopping = true;
    }
    work_cv.notify_all();
    for (std::thread& t : threads) t.join();
    threads.clear();
  }

  [[nodiscard]] std::string path(std::string_view name) const {
    std::string p = opts.dir;
    p += '/';
    p += name;
    return p;
  }

  /// Logs a cause (an operation and its errno) the first time it happens.
  void log_once(std::string_view op, int err, std::string_view consequence) {
    {
      std::lock_guard lock(logged_mutex);
      if (!logged.emplace(std::string(op), err).second) return;
    }
    log(LogLevel::kWarn, "disk tier: " + std::string(op) + " in " + opts.dir + " failed (" +
                             std::strerror(err) + "); " + std::string(consequence) +
                             " (counted; logged once per cause)");
  }
  void write_failed(std::string_view op, int err) {
    errors.fetch_add(1, std::memory_order_relaxed);
    dropped.fetch_add(1, std::memory_order_relaxed);
    log_once(op, err, "such writes are dropped");
  }

  /// Creates the directory (0700), checks it is this user's and not writable by others
  /// (ConfigError otherwise), takes its lock and re-indexes its files; false: the tier runs
  /// disabled (logged, counted).
  bool scan();
  /// ConfigError unless opts.dir is a directory (not a symlink) of this process's user that
  /// others cannot write; one of ours open to others loses its group and other bits. False (logged, counted) when
  /// it cannot be opened: the tier runs disabled.
  [[nodiscard]] bool check_dir_trusted();
  /// Takes the directory's lock file (flock, non-blocking); false when another store holds it.
  bool lock_dir();
  /// Whether O_DIRECT opens work in the directory: a probe file created and deleted.
  void probe_direct();
  /// Reads go through the page cache from now on (logged once).
  void stop_direct_reads(std::string_view op, int err);
  /// Opens `name` (no symlink followed, no wait on a FIFO) and reads it whole into `buffer` if
  /// it is a regular file of `expected` bytes (kRejected otherwise) and at most `limit`: O_DIRECT
  /// while direct_reads holds, through the page cache after an EINVAL from a regular file.
  /// `opened`: a descriptor open_ahead gave for `name` (read buffered, and closed), or -1.
  /// Called from any thread.
  FileRead read_file(const std::string& name, uint64_t expected, uint64_t limit,
                     AlignedBuffer& buffer, int opened);
  void run(WriterRole role);
  /// Whether the pressure writer writes now. Queue lock held.
  [[nodiscard]] bool under_pressure_locked() const {
    return stopping || flushers > 0 ||
           queue_bytes >= opts.queue_bytes / disk_tier_parts::kPressureDenominator *
                              disk_tier_parts::kPressureNumerator;
  }
  void write_one(PendingWrite& w);
  void unlink_discarded(std::vector<std::string> names);
  /// Forgets least recently used files until `need` more bytes fit; their names, for
  /// unlink_files after the lock. Index lock held.
  [[nodiscard]] std::vector<std::string> evict_locked(uint64_t need);
  /// Deletes the files of `names`. Index lock not held (no file system call is made under it).
  void unlink_files(const std::vector<std::string>& names);
  /// Forgets and deletes `name` if it is still the file of `generation`. Index lock not held.
  void forget(const std::string& name, uint64_t generation);
  /// Forgets an index entry (its file is the caller's to delete, after the lock). Lock held.
  void erase_locked(std::map<std::string, FileInfo>::iterator it);

  DiskTierOptions opts;
  int lock_fd = -1;  // the directory's lock file, held (flock) while the tier lives
  bool enabled = false;
  std::atomic<bool> rejected_logged{false};  // a non-regular or resized file read: logged once
  std::atomic<bool> direct_reads{false};
  /// Read buffers between fetches: one pipeline's ring (read_threads + 1) and the serial path's.
  AlignedBufferCache read_buffers{static_cast<size_t>(std::max(opts.read_threads, 1)) + 2};

  // write-behind queue
  mutable std::mutex queue_mutex;
  std::condition_variable work_cv, idle_cv;
  std::deque<PendingWrite> queue;
  uint64_t queue_bytes = 0;
  int in_flight = 0;
  int flushers = 0;  // flush() calls waiting: the pressure writer helps them
  std::vector<std::string> to_unlink;  // discarded files, deleted by a writer thread
  bool stopping = false;
  std::atomic<bool> closed{false};
  std::atomic<uint64_t> temp_serial{0};

  // index: the files in the directory, least recently used first
  mutable std::mutex index_mutex;
  std::map<std::string, FileInfo> files;
  std::list<std::string> lru;
  uint64_t bytes_held = 0;
  uint64_t next_generation = 1;

  std::mutex logged_mutex;
  std::set<std::pair<std::string, int>> logged;

  std::atomic<uint64_t> hits{0}, misses{0}, corrupt{0}, unauthenticated{0}, bytes_read{0},
      enqueued{0}, done{0}, bytes_written{0}, dropped{0}, errors{0};
  std::vector<std::thread> threads;
};

}  // namespace hss::detail
