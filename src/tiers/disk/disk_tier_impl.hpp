#pragma once
// DiskTier's state (tiers/disk/disk_tier.hpp), shared by its two sources: disk_tier.cpp (the
// directory, the index, and the files the shared write-behind queue's writers write:
// tiers/write_behind.hpp) and disk_tier_read.cpp (reads: contains, fetch_each and the read
// pipeline). Private to tiers/disk/.

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
#include "tiers/write_behind.hpp"

namespace hss::detail {
namespace disk_tier_parts {

/// Temporary files: "<name>.tmp.<pid>.<n>" (writes), ".direct-probe.tmp.<pid>" (the probe).
inline constexpr std::string_view kTempMark = ".tmp.";
struct FileInfo {
  uint64_t bytes = 0;
  uint64_t generation = 0;  // changes when the file is replaced: a reader deletes only what it read
  std::list<std::string>::iterator lru;
};

}  // namespace disk_tier_parts

struct DiskTier::Impl final : WriteBehindIo {
  using FileInfo = disk_tier_parts::FileInfo;

  explicit Impl(DiskTierOptions o)
      : opts(std::move(o)),
        queue(WriteBehindOptions{.budget_bytes = opts.queue_bytes,
                                 .writer_threads = std::max(opts.writer_threads, 1)},
              *this) {
    if (opts.writer_threads < 1) opts.writer_threads = 1;
    enabled = scan();
    queue.start();
  }
  ~Impl() override {
    stop();
    release_directory();
  }
  /// Gives the directory's lock up (idempotent; close() and the destructor, never concurrently).
  void release_directory() noexcept {
    if (lock_fd >= 0) (void)::close(lock_fd);  // the directory is free for the next store
    lock_fd = -1;
  }
  /// Writes what is queued and joins the writers (before the state they use goes).
  void stop() { queue.stop(); }

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
    queue.count_dropped(1);
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
  /// WriteBehindIo: the writers' batches, one value each (a file written, then renamed).
  void write_batch(std::span<QueuedWrite> batch) noexcept override {
    for (QueuedWrite& w : batch) write_one(w);
  }
  void write_one(QueuedWrite& w) noexcept;
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
      done{0}, bytes_written{0}, errors{0};
  // The write-behind (its writers write files and delete discarded ones: post). Last: its
  // writers stop before the state above goes.
  WriteBehind queue;
};

}  // namespace hss::detail
