#include "tiers/disk/disk_tier.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "base/log.hpp"
#include "format/value_codec.hpp"
#include "hss/error.hpp"
#include "tiers/disk/read_pipeline.hpp"

namespace hss::detail {
namespace {

constexpr std::string_view kSuffix = ".hsv";
constexpr std::string_view kTempMark = ".tmp.";
constexpr size_t kHashHex = 32;
constexpr uint64_t kMinQueueBytes = 16ULL << 20;
constexpr uint64_t kMaxQueueBytes = 256ULL << 20;
constexpr int kWriterNice = 10;
/// The queue's fill (of DiskTierOptions::queue_bytes) from which the pressure writer writes too.
constexpr uint64_t kPressureNumerator = 3, kPressureDenominator = 4;

/// Writer roles (see "Write-behind" in disk_tier.hpp).
enum class WriterRole {
  kIdle,      ///< SCHED_IDLE: writes whenever the queue has work, on CPU time nobody else wants
  kPressure,  ///< nice 10: writes only while the queue is 3/4 full, a flush waits, or it stops
  kOnly,      ///< writer_threads == 1: nice 10, always
};

std::string chunk_prefix(const CacheEngineKey& key) {
  const std::string text = key.to_string();
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  char hex[kHashHex + 2];
  std::snprintf(hex, sizeof hex, "%016llx%016llx.", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return std::string(hex, kHashHex + 1);
}

/// True for "<32 hex>.<kind>.<layer>.hsv".
bool is_value_name(std::string_view name) {
  if (!name.ends_with(kSuffix) || name.size() < kHashHex + 2 + kSuffix.size()) return false;
  for (size_t i = 0; i < kHashHex; ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  if (name[kHashHex] != '.') return false;
  name = name.substr(kHashHex + 1, name.size() - kHashHex - 1 - kSuffix.size());
  const size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || !activation_kind_from_string(name.substr(0, dot))) {
    return false;
  }
  std::string_view layer = name.substr(dot + 1);
  if (layer.starts_with('-')) layer.remove_prefix(1);
  return !layer.empty() && layer.size() <= 19 &&
         std::ranges::all_of(layer, [](char c) { return c >= '0' && c <= '9'; });
}

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

}  // namespace

struct DiskTier::Impl {
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
  ~Impl() { stop(); }
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

  bool scan();
  /// Whether O_DIRECT opens work in the directory: a probe file created and deleted.
  void probe_direct();
  /// Reads go through the page cache from now on (logged once).
  void stop_direct_reads(std::string_view op, int err);
  /// Opens `name` and reads it whole (at most `limit` bytes) into `buffer`: O_DIRECT while
  /// direct_reads holds, through the page cache after an EINVAL. `opened`: a descriptor
  /// open_ahead gave for `name` (read buffered, and closed), or -1. Called from any thread.
  FileRead read_file(const std::string& name, uint64_t limit, AlignedBuffer& buffer, int opened);
  void run(WriterRole role);
  /// Whether the pressure writer writes now. Queue lock held.
  [[nodiscard]] bool under_pressure_locked() const {
    return stopping || flushers > 0 ||
           queue_bytes >= opts.queue_bytes / kPressureDenominator * kPressureNumerator;
  }
  void write_one(PendingWrite& w);
  void unlink_discarded(std::vector<std::string> names);
  /// Deletes least recently used files until `need` more bytes fit. Index lock held.
  void evict_locked(uint64_t need);
  /// Forgets and deletes `name` if it is still the file of `generation`. Index lock not held.
  void forget(const std::string& name, uint64_t generation);
  void erase_locked(std::map<std::string, FileInfo>::iterator it, bool unlink_file);

  DiskTierOptions opts;
  bool enabled = false;
  std::atomic<bool> direct_reads{false};

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

bool DiskTier::Impl::scan() {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  std::filesystem::create_directories(opts.dir, ec);
  if (ec) {
    errors.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::kWarn, "disk tier: cannot create " + opts.dir + " (" + ec.message() +
                             "); running without it: writes are dropped and counted");
    return false;
  }
  DIR* dir = ::opendir(opts.dir.c_str());
  if (dir == nullptr) {
    errors.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::kWarn, "disk tier: cannot open " + opts.dir + " (" + std::strerror(errno) +
                             "); running without it: writes are dropped and counted");
    return false;
  }
  struct Found {
    std::string name;
    uint64_t bytes;
    int64_t mtime_ns;
  };
  std::vector<Found> found;
  size_t removed = 0;
  const int fd = ::dirfd(dir);
  while (const dirent* e = ::readdir(dir)) {
    const std::string_view name = e->d_name;
    if (name.find(kTempMark) != std::string_view::npos) {
      // A write a crash (or kill) interrupted before its rename: never a value.
      if (::unlinkat(fd, e->d_name, 0) == 0) ++removed;
      continue;
    }
    if (!is_value_name(name)) continue;  // not ours: left alone
    struct stat st{};
    if (::fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (static_cast<uint64_t>(st.st_size) < kRemoteHeaderBytes) {
      if (::unlinkat(fd, e->d_name, 0) == 0) ++removed;  // empty or short after a power loss
      continue;
    }
    found.push_back({std::string(name), static_cast<uint64_t>(st.st_size),
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
  }
  ::closedir(dir);
  std::ranges::sort(found, {}, &Found::mtime_ns);
  std::lock_guard lock(index_mutex);
  for (Found& f : found) {
    lru.push_back(f.name);
    files.emplace(std::move(f.name), FileInfo{f.bytes, next_generation++, std::prev(lru.end())});
    bytes_held += f.bytes;
  }
  evict_locked(0);
  probe_direct();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  if (!found.empty() || removed > 0) {
    log(LogLevel::kInfo, "disk tier: " + opts.dir + ": " + std::to_string(files.size()) +
                             " values re-indexed (" + std::to_string(bytes_held) + " bytes), " +
                             std::to_string(removed) + " leftovers removed, in " +
                             std::to_string(ms) + " ms");
  }
  return true;
}

void DiskTier::Impl::probe_direct() {
  if (!opts.direct_reads) return;
  const std::string probe = path(".direct-probe" + std::string(kTempMark) +
                                 std::to_string(::getpid()));
  const int fd = opts.io.open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT,
                              0644);
  if (fd >= 0) {
    (void)opts.io.close(fd);
    (void)::unlink(probe.c_str());
    direct_reads = true;
  } else if (errno == EINVAL) {  // tmpfs, some FUSE and network file systems
    log(LogLevel::kInfo, "disk tier: " + opts.dir +
                             " does not take O_DIRECT; reads go through the page cache");
  } else {
    direct_reads = true;  // a read-only directory may still be read with O_DIRECT: reads tell
  }
}

void DiskTier::Impl::stop_direct_reads(std::string_view op, int err) {
  if (!direct_reads.exchange(false)) return;
  log(LogLevel::kWarn, "disk tier: O_DIRECT " + std::string(op) + " in " + opts.dir +
                           " refused (" + std::strerror(err) +
                           "); reads go through the page cache from now on");
}

FileRead DiskTier::Impl::read_file(const std::string& name, uint64_t limit,
                                   AlignedBuffer& buffer, int opened) {
  const std::string file = path(name);
  while (true) {
    const bool direct = opened < 0 && direct_reads.load(std::memory_order_relaxed);
    const int fd = opened >= 0 ? opened
                               : opts.io.open(file.c_str(),
                                              O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0), 0);
    opened = -1;
    const FileRead r = fd < 0 ? FileRead{errno == ENOENT ? ReadOutcome::kGone : ReadOutcome::kFailed,
                                         0, errno, "open"}
                              : read_open_file(opts.io, fd, direct, limit, buffer);
    if (r.outcome == ReadOutcome::kFailed && direct && r.err == EINVAL) {
      stop_direct_reads(r.op, r.err);  // an alignment the device refuses: read it buffered
      continue;
    }
    return r;
  }
}

void DiskTier::Impl::erase_locked(std::map<std::string, FileInfo>::iterator it, bool unlink_file) {
  if (unlink_file) (void)::unlink(path(it->first).c_str());  // ENOENT, EACCES: forgotten anyway
  bytes_held -= it->second.bytes;
  lru.erase(it->second.lru);
  files.erase(it);
}

void DiskTier::Impl::evict_locked(uint64_t need) {
  while (!lru.empty() && bytes_held + need > opts.budget_bytes) {
    erase_locked(files.find(lru.front()), /*unlink_file=*/true);
  }
}

void DiskTier::Impl::forget(const std::string& name, uint64_t generation) {
  std::lock_guard lock(index_mutex);
  const auto it = files.find(name);
  if (it != files.end() && it->second.generation == generation) erase_locked(it, true);
}

void DiskTier::Impl::run(WriterRole role) {
  // The write-behind must not slow the thread that stores (issue 32: <= 5%). An idle writer asks
  // for SCHED_IDLE (any thread may; it runs when a CPU has nothing else to run); where that is
  // refused, and for the other roles, nice 10 (a tenth of a normal thread's share of a busy CPU).
  bool idle = false;
  if (role == WriterRole::kIdle) {
    const sched_param param{};
    idle = ::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &param) == 0;
  }
  if (!idle) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kWriterNice);
  const bool waits_for_pressure = role == WriterRole::kPressure;
  auto has_write = [&] { return !queue.empty() && (!waits_for_pressure || under_pressure_locked()); };
  std::unique_lock lock(queue_mutex);
  while (true) {
    if (!to_unlink.empty()) {
      std::vector<std::string> names;
      names.swap(to_unlink);
      ++in_flight;
      lock.unlock();
      unlink_discarded(std::move(names));
      lock.lock();
      --in_flight;
      continue;
    }
    if (!has_write()) {
      if (queue.empty()) idle_cv.notify_all();
      if (stopping && queue.empty()) break;
      work_cv.wait(lock, [&] { return stopping || has_write() || !to_unlink.empty(); });
      continue;
    }
    {
      PendingWrite w = std::move(queue.front());
      queue.pop_front();
      queue_bytes -= w.bytes;
      ++in_flight;
      lock.unlock();
      write_one(w);
    }  // the owner (lent pool granules) is released outside the lock
    lock.lock();
    --in_flight;
  }
}

void DiskTier::Impl::unlink_discarded(std::vector<std::string> names) {
  std::lock_guard lock(index_mutex);
  for (const std::string& name : names) {
    if (!files.contains(name)) (void)::unlink(path(name).c_str());  // else written again since
  }
}

void DiskTier::Impl::write_one(PendingWrite& w) {
  if (w.ready && !w.ready()) {
    dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::vector<std::span<const std::byte>> payload = w.borrowed;
  if (!w.owner) payload = {std::span<const std::byte>(w.copied)};
  RemoteHeader header = w.header;
  header.payload_hash = hash_pieces(payload);
  header.flags = opts.mac ? kRemoteFlagMac : 0;
  std::array<std::byte, kRemoteHeaderBytes> header_bytes{};
  encode_remote_header(header, header_bytes);
  Mac tag{};
  if (opts.mac) tag = opts.mac->compute(w.mac_name, header_bytes, payload);
  std::vector<iovec> iov;
  iov.reserve(payload.size() + 2);
  iov.push_back({header_bytes.data(), header_bytes.size()});
  if (opts.mac) iov.push_back({tag.data(), tag.size()});
  for (const auto piece : payload) {
    iov.push_back({const_cast<std::byte*>(piece.data()), piece.size()});
  }
  const uint64_t file_bytes = kRemoteHeaderBytes + (opts.mac ? kMacBytes : 0) + w.bytes;

  {  // room first, so the directory stays within the budget (but for one temp file)
    std::lock_guard lock(index_mutex);
    evict_locked(file_bytes);
  }
  const std::string temp = path(w.name) + std::string(kTempMark) + std::to_string(::getpid()) +
                           "." + std::to_string(temp_serial.fetch_add(1));
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
  int fd = opts.io.open(temp.c_str(), kFlags, 0644);
  if (fd < 0 && errno == ENOENT && ::mkdir(opts.dir.c_str(), 0755) == 0) {
    log(LogLevel::kWarn, "disk tier: " + opts.dir + " was removed; created it again");
    fd = opts.io.open(temp.c_str(), kFlags, 0644);
  }
  if (fd < 0) {
    write_failed("create", errno);
    return;
  }
  const bool wrote = write_all(opts.io, fd, std::move(iov));
  const int write_errno = errno;
  if (opts.io.close(fd) != 0 || !wrote) {
    const int err = wrote ? errno : write_errno;
    (void)::unlink(temp.c_str());
    write_failed(wrote ? "close" : "write", err);
    return;
  }
  {
    std::lock_guard lock(index_mutex);
    if (opts.io.rename(temp.c_str(), path(w.name).c_str()) != 0) {
      const int err = errno;
      (void)::unlink(temp.c_str());
      write_failed("rename", err);
      return;
    }
    const auto it = files.find(w.name);
    if (it != files.end()) erase_locked(it, /*unlink_file=*/false);  // the rename replaced it
    evict_locked(file_bytes);
    lru.push_back(w.name);
    files.emplace(w.name, FileInfo{file_bytes, next_generation++, std::prev(lru.end())});
    bytes_held += file_bytes;
  }
  done.fetch_add(1, std::memory_order_relaxed);
  bytes_written.fetch_add(w.bytes, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------

std::unique_ptr<DiskTier> DiskTier::create(const Config& config) {
  const std::string dir = config.hidden_state_disk_dir();
  if (dir.empty()) return nullptr;
  DiskTierOptions o;
  o.dir = dir;
  o.budget_bytes = config.disk_tier_bytes();
  o.queue_bytes = std::clamp(o.budget_bytes / 4, kMinQueueBytes, kMaxQueueBytes);
  o.mac = ValueMac::from_config(config);
  return std::make_unique<DiskTier>(std::move(o));
}

DiskTier::DiskTier(DiskTierOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

DiskTier::~DiskTier() = default;

const std::string& DiskTier::dir() const noexcept { return impl_->opts.dir; }
uint64_t DiskTier::budget_bytes() const noexcept { return impl_->opts.budget_bytes; }
bool DiskTier::enabled() const noexcept { return impl_->enabled; }
bool DiskTier::direct_reads() const noexcept {
  return impl_->direct_reads.load(std::memory_order_relaxed);
}

std::string DiskTier::file_name(const CacheEngineKey& key, Slot slot) {
  std::string name = chunk_prefix(key);
  name += to_string(slot.kind);
  name += '.';
  name += std::to_string(slot.layer_idx);
  name += kSuffix;
  return name;
}

bool DiskTier::enqueue_write(const TierWrite& write,
                             std::span<const std::span<const std::byte>> pieces,
                             std::shared_ptr<const void> owner, std::function<bool()> ready) {
  const size_t bytes = remote_payload_bytes(write.format, write.rows, write.cols);
  size_t given = 0;
  for (const auto piece : pieces) given += piece.size();
  if (given != bytes || write.rows <= 0 || write.cols <= 0) {
    throw InvalidArgument("disk write of " + std::to_string(given) + " bytes for rows = " +
                          std::to_string(write.rows) + ", cols = " + std::to_string(write.cols) +
                          " of " + row_format_name(write.format) + " (needs " +
                          std::to_string(bytes) + ", rows and cols > 0)");
  }
  Impl& m = *impl_;
  const uint64_t file_bytes = kRemoteHeaderBytes + (m.opts.mac ? kMacBytes : 0) + bytes;
  if (!m.enabled || m.closed.load(std::memory_order_acquire) || bytes > m.opts.queue_bytes ||
      file_bytes > m.opts.budget_bytes) {
    m.dropped.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  PendingWrite w;
  w.name = file_name(write.key, write.slot);
  if (m.opts.mac) {
    w.mac_name = remote_key(write.key, to_string(write.slot.kind), write.slot.layer_idx);
  }
  w.header = RemoteHeader{write.format, write.rows, write.cols, 0};
  w.bytes = bytes;
  if (owner) {
    w.borrowed.assign(pieces.begin(), pieces.end());
    w.owner = std::move(owner);
  } else {
    w.copied.resize(bytes);
    size_t at = 0;
    for (const auto piece : pieces) {
      std::memcpy(w.copied.data() + at, piece.data(), piece.size());
      at += piece.size();
    }
  }
  w.ready = std::move(ready);

  std::deque<PendingWrite> dropped;  // released after the lock: owners may free pool blocks
  {
    std::lock_guard lock(m.queue_mutex);
    while (!m.queue.empty() && m.queue_bytes + bytes > m.opts.queue_bytes) {
      m.queue_bytes -= m.queue.front().bytes;
      dropped.push_back(std::move(m.queue.front()));
      m.queue.pop_front();
    }
    m.queue_bytes += bytes;
    m.queue.push_back(std::move(w));
  }
  m.dropped.fetch_add(dropped.size(), std::memory_order_relaxed);
  m.enqueued.fetch_add(1, std::memory_order_relaxed);
  m.work_cv.notify_all();  // every role: a writer that is not to write now waits again
  return true;
}

void DiskTier::count_dropped(uint64_t writes) noexcept {
  impl_->dropped.fetch_add(writes, std::memory_order_relaxed);
}

std::vector<bool> DiskTier::contains(std::span<const TierRequest> requests) {
  std::vector<bool> present(requests.size(), false);
  std::lock_guard lock(impl_->index_mutex);
  for (size_t i = 0; i < requests.size(); ++i) {
    present[i] = impl_->files.contains(file_name(requests[i].key, requests[i].slot));
  }
  return present;
}

namespace {

/// One file a fetch reads: its request, the index generation it was found under, its name and
/// the most bytes a value of the asked shape can take.
struct PlannedRead {
  size_t request = 0;
  uint64_t generation = 0;
  std::string name;
  uint64_t limit = 0;
};

/// Larger than any value of the asked shape can be (float32 rows, or FP8 rows whose scales
/// outweigh the codes when rows are narrow; a MAC): not read at all.
uint64_t read_limit(const TierRequest& r) {
  if (r.rows <= 0 || r.cols <= 0) return uint64_t{1} << 34;
  return kRemoteHeaderBytes + kMacBytes +
         std::max(static_cast<uint64_t>(r.rows * r.cols) * 4,
                  RowFormat::of(kernels::ElemType::kFp8E4M3).payload_bytes(r.rows, r.cols));
}

}  // namespace

void DiskTier::fetch_each(std::span<const TierRequest> requests,
                          const std::function<void(size_t, const TierValue&)>& on_value) {
  Impl& m = *impl_;
  // The files the index holds, found under one lock (and marked most recently used); the rest
  // are misses without I/O.
  std::vector<PlannedRead> plan;
  plan.reserve(requests.size());
  {
    std::lock_guard lock(m.index_mutex);
    for (size_t i = 0; i < requests.size(); ++i) {
      std::string name = file_name(requests[i].key, requests[i].slot);
      const auto it = m.files.find(name);
      if (it == m.files.end()) continue;
      m.lru.splice(m.lru.end(), m.lru, it->second.lru);
      plan.push_back({i, it->second.generation, std::move(name), read_limit(requests[i])});
    }
  }
  uint64_t hits = 0, corrupt = 0, unauthenticated = 0, bytes = 0, errors = 0;
  // One file read: checked, then handed over or forgotten (with its file) as a miss.
  auto take = [&](const PlannedRead& p, const FileRead& read, const AlignedBuffer& buffer) {
    const TierRequest& r = requests[p.request];
    if (read.outcome == ReadOutcome::kGone || read.outcome == ReadOutcome::kFailed) {
      // Deleted behind our back, or unreadable (EIO, a bad sector): forgotten and deleted, so a
      // failing file is not asked again; the next store of the chunk writes it afresh.
      if (read.outcome == ReadOutcome::kFailed) {
        ++errors;
        m.log_once(read.op, read.err, "such reads miss and their files are deleted");
      }
      m.forget(p.name, p.generation);
      return;
    }
    bool bad = read.outcome == ReadOutcome::kTooLarge;
    DecodedValue decoded;
    if (!bad) {
      const std::span<const std::byte> value(buffer.data(), read.got);
      const std::string mac_name =
          m.opts.mac ? remote_key(r.key, to_string(r.slot.kind), r.slot.layer_idx) : std::string();
      decoded = decode_remote_value(value, r.rows, r.cols, m.opts.mac.get(), mac_name);
      bad = decoded.status != DecodeStatus::kOk;
    }
    if (bad) {
      ++corrupt;
      if (decoded.status == DecodeStatus::kUnauthenticated) ++unauthenticated;
      if (log_enabled(LogLevel::kDebug)) {
        log(LogLevel::kDebug, "disk tier: " + m.path(p.name) + " rejected (" +
                                  std::string(to_string(decoded.status)) + "); deleted");
      }
      m.forget(p.name, p.generation);
      return;
    }
    ++hits;
    bytes += decoded.payload.size();
    on_value(p.request, TierValue{decoded.header.format, decoded.header.rows, decoded.header.cols,
                                  decoded.payload, nullptr});
  };
  struct Count {  // the counters, also when on_value throws
    Impl& m;
    size_t asked;
    uint64_t &hits, &corrupt, &unauthenticated, &bytes, &errors;
    ~Count() {
      m.hits.fetch_add(hits, std::memory_order_relaxed);
      m.misses.fetch_add(asked - hits, std::memory_order_relaxed);
      m.corrupt.fetch_add(corrupt, std::memory_order_relaxed);
      m.unauthenticated.fetch_add(unauthenticated, std::memory_order_relaxed);
      m.bytes_read.fetch_add(bytes, std::memory_order_relaxed);
      m.errors.fetch_add(errors, std::memory_order_relaxed);
    }
  } count{m, requests.size(), hits, corrupt, unauthenticated, bytes, errors};

  if (m.direct_reads.load(std::memory_order_relaxed) && plan.size() >= 2) {
    // O_DIRECT: read_threads files read at once, ahead of their checks and copies, on reader
    // threads (tiers/disk/read_pipeline.hpp). Without a thread to be had, the serial loop below.
    std::optional<ReadPipeline> pipeline;
    try {
      pipeline.emplace(plan.size(), std::max(m.opts.read_threads, 1), [&m, &plan](size_t j, AlignedBuffer& buffer) {
        return m.read_file(plan[j].name, plan[j].limit, buffer, -1);
      });
    } catch (const std::system_error&) {
      pipeline.reset();
    }
    if (pipeline) {
      for (const PlannedRead& p : plan) {
        const ReadPipeline::Item item = pipeline->next();
        take(p, item.read, *item.buffer);
      }
      return;
    }
  }

  // Serial reads. Read-ahead (buffered reads only): the next files are opened and their reads
  // started in the kernel while this one is read, checked and handed over, so several reads are
  // in flight without threads.
  const size_t ahead = m.direct_reads.load(std::memory_order_relaxed)
                           ? 0
                           : static_cast<size_t>(std::max(m.opts.read_ahead_files, 0));
  AlignedBuffer buffer;
  std::deque<int> opened;  // descriptors of plan [j, next_ahead)
  size_t next_ahead = 0;
  struct CloseRest {
    std::deque<int>& fds;
    const DiskIo& io;
    ~CloseRest() {
      for (const int fd : fds) {
        if (fd >= 0) (void)io.close(fd);
      }
    }
  } close_rest{opened, m.opts.io};
  for (size_t j = 0; j < plan.size(); ++j) {
    while (ahead > 0 && next_ahead < plan.size() && next_ahead <= j + ahead) {
      opened.push_back(open_ahead(m.opts.io, m.path(plan[next_ahead++].name)));
    }
    int fd = -1;
    if (!opened.empty()) {
      fd = opened.front();
      opened.pop_front();
    }
    take(plan[j], m.read_file(plan[j].name, plan[j].limit, buffer, fd), buffer);
  }
}

void DiskTier::discard(std::span<const CacheEngineKey> keys) noexcept {
  Impl& m = *impl_;
  try {
    std::vector<std::string> names;
    {
      std::lock_guard lock(m.index_mutex);
      for (const CacheEngineKey& key : keys) {
        const std::string prefix = chunk_prefix(key);
        auto it = m.files.lower_bound(prefix);
        while (it != m.files.end() && it->first.starts_with(prefix)) {
          names.push_back(it->first);
          const auto next = std::next(it);
          m.erase_locked(it, /*unlink_file=*/false);  // deleted by a writer thread
          it = next;
        }
      }
    }
    if (names.empty()) return;
    {
      std::lock_guard lock(m.queue_mutex);
      m.to_unlink.insert(m.to_unlink.end(), names.begin(), names.end());
    }
    m.work_cv.notify_all();
  } catch (...) {
    // Out of memory: the files stay until the budget evicts them; a KV-gone value is never
    // asked for, so nothing wrong is served.
  }
}

void DiskTier::flush() {
  Impl& m = *impl_;
  std::unique_lock lock(m.queue_mutex);
  ++m.flushers;  // the pressure writer writes until the queue is empty
  m.work_cv.notify_all();
  m.idle_cv.wait(lock,
                 [&] { return m.queue.empty() && m.to_unlink.empty() && m.in_flight == 0; });
  --m.flushers;
}

void DiskTier::close() {
  impl_->closed.store(true, std::memory_order_release);
  flush();
}

TierStats DiskTier::stats() const {
  const Impl& m = *impl_;
  TierStats s;
  s.name = std::string(name());
  s.hits = m.hits.load();
  s.misses = m.misses.load();
  s.corrupt_values = m.corrupt.load();
  s.unauthenticated_values = m.unauthenticated.load();
  s.bytes_read = m.bytes_read.load();
  s.writes_enqueued = m.enqueued.load();
  s.writes_done = m.done.load();
  s.bytes_written = m.bytes_written.load();
  s.dropped_writes = m.dropped.load();
  s.errors = m.errors.load();
  s.read_mode = direct_reads() ? "direct" : "buffered";
  {
    std::lock_guard lock(m.queue_mutex);
    s.queue_bytes = m.queue_bytes;
  }
  std::lock_guard lock(m.index_mutex);
  s.entries_held = m.files.size();
  s.bytes_held = m.bytes_held;
  return s;
}

}  // namespace hss::detail
