#include "tiers/disk/disk_tier.hpp"
#include "tiers/disk/disk_tier_impl.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/file.h>
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
#include "tiers/disk/file_read_ahead.hpp"

namespace hss::detail {
namespace {

constexpr std::string_view kSuffix = ".hsv";
using disk_tier_parts::kTempMark;
constexpr size_t kHashHex = 32;
constexpr uint64_t kMinQueueBytes = 16ULL << 20;
constexpr uint64_t kMaxQueueBytes = 256ULL << 20;

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

}  // namespace


namespace {

/// mkdir -p with mode 0700 for every directory it makes (the umask may only take bits away).
std::error_code make_private_dirs(const std::string& dir) {
  std::filesystem::path at;
  for (const auto& part : std::filesystem::path(dir)) {
    at /= part;
    if (part.empty() || part == "/" || part == "." || part == "..") continue;
    if (::mkdir(at.c_str(), 0700) != 0 && errno != EEXIST) {
      return {errno, std::generic_category()};
    }
  }
  return {};
}

}  // namespace

bool DiskTier::Impl::check_dir_trusted() {
  // Opened without following a symlink, then checked through the descriptor: what is checked is
  // what the scan reads. The last component is the store's own "hsstore/" (or a test's
  // directory), never a link an operator needs.
  const int fd = ::open(opts.dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  const int open_errno = errno;
  struct stat link_st{};
  if (fd < 0 && (open_errno == ELOOP ||
                 (open_errno == ENOTDIR && ::lstat(opts.dir.c_str(), &link_st) == 0 &&
                  S_ISLNK(link_st.st_mode)))) {
    throw ConfigError("disk tier directory " + opts.dir +
                      " is a symlink: refused (the store makes its own, mode 0700; "
                      "docs/design.md, \"Threat model\")");
  }
  struct stat st{};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    const int err = fd < 0 ? open_errno : errno;
    if (fd >= 0) (void)::close(fd);
    errors.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::kWarn, "disk tier: cannot open " + opts.dir + " (" + std::strerror(err) +
                             "); running without it: writes are dropped and counted");
    return false;
  }
  const auto close_fd = [fd] { (void)::close(fd); };
  if (st.st_uid != ::geteuid()) {
    close_fd();
    throw ConfigError("disk tier directory " + opts.dir + " is owned by uid " +
                      std::to_string(st.st_uid) + ", not by this process (uid " +
                      std::to_string(::geteuid()) +
                      "): refused (its owner could read and replace every value)");
  }
  if ((st.st_mode & S_IWOTH) != 0) {
    close_fd();
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw ConfigError("disk tier directory " + opts.dir + " is writable by others (mode " +
                      mode + "): refused (anyone could plant, replace or delete values)");
  }
  if ((st.st_mode & 077) != 0) {
    // Ours, made by an older build or by hand: private from now on (every tenant's values). The
    // owner's bits stay as they are (a read-only directory stays read-only).
    if (::fchmod(fd, st.st_mode & 0700) == 0) {
      log(LogLevel::kInfo, "disk tier: " + opts.dir + " made private (group and other bits off)");
    }
  }
  close_fd();
  return true;
}

bool DiskTier::Impl::lock_dir() {
  const std::string lock_path = path(kLockFile);
  lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    errors.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::kWarn, "disk tier: cannot open " + lock_path + " (" + std::strerror(errno) +
                             "); running without the tier: writes are dropped and counted");
    return false;
  }
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) == 0) return true;
  const int err = errno;
  (void)::close(lock_fd);
  lock_fd = -1;
  errors.fetch_add(1, std::memory_order_relaxed);
  log(LogLevel::kWarn,
      "disk tier: " + opts.dir + " is in use by another store (" + lock_path + ": " +
          std::strerror(err) +
          "); running without the tier: writes are dropped and counted, reads miss (give each "
          "engine a directory of its own)");
  return false;
}

bool DiskTier::Impl::scan() {
  const auto start = std::chrono::steady_clock::now();
  if (const std::error_code ec = make_private_dirs(opts.dir)) {
    errors.fetch_add(1, std::memory_order_relaxed);
    log(LogLevel::kWarn, "disk tier: cannot create " + opts.dir + " (" + ec.message() +
                             "); running without it: writes are dropped and counted");
    return false;
  }
  // ConfigError: a symlink, another user's directory, or one anyone may write.
  if (!check_dir_trusted()) return false;
  if (!lock_dir()) return false;  // another store's: its temp files and budget are its own
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
    if (static_cast<uint64_t>(st.st_size) < kTierHeaderBytes) {
      if (::unlinkat(fd, e->d_name, 0) == 0) ++removed;  // empty or short after a power loss
      continue;
    }
    if ((st.st_mode & 077) != 0) (void)::fchmodat(fd, e->d_name, st.st_mode & 0700, 0);  // older
    found.push_back({std::string(name), static_cast<uint64_t>(st.st_size),
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
  }
  ::closedir(dir);
  std::ranges::sort(found, {}, &Found::mtime_ns);
  std::vector<std::string> evicted;
  {
    std::lock_guard lock(index_mutex);
    for (Found& f : found) {
      lru.push_back(f.name);
      files.emplace(std::move(f.name), FileInfo{f.bytes, next_generation++, std::prev(lru.end())});
      bytes_held += f.bytes;
    }
    evicted = evict_locked(0);
  }
  unlink_files(evicted);
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

void DiskTier::Impl::erase_locked(std::map<std::string, FileInfo>::iterator it) {
  bytes_held -= it->second.bytes;
  lru.erase(it->second.lru);
  files.erase(it);
}

std::vector<std::string> DiskTier::Impl::evict_locked(uint64_t need) {
  std::vector<std::string> evicted;
  while (!lru.empty() && bytes_held + need > opts.budget_bytes) {
    evicted.push_back(lru.front());
    erase_locked(files.find(lru.front()));
  }
  return evicted;
}

void DiskTier::Impl::unlink_files(const std::vector<std::string>& names) {
  // Index lock not held: a hung file system blocks this thread, not contains() or a fetch's
  // lookup. A write of the same name that lands between the index update and this unlink loses
  // its file: the index then holds a name whose read is ENOENT, a miss that forgets it.
  for (const std::string& name : names) (void)opts.io.unlink(path(name).c_str());
}

void DiskTier::Impl::forget(const std::string& name, uint64_t generation) {
  {
    std::lock_guard lock(index_mutex);
    const auto it = files.find(name);
    if (it == files.end() || it->second.generation != generation) return;
    erase_locked(it);
  }
  (void)opts.io.unlink(path(name).c_str());  // ENOENT, EACCES: forgotten anyway
}

void DiskTier::Impl::unlink_discarded(std::vector<std::string> names) {
  {
    std::lock_guard lock(index_mutex);
    std::erase_if(names, [&](const std::string& name) { return files.contains(name); });
  }  // those were written again since
  unlink_files(names);
}

void DiskTier::Impl::write_one(QueuedWrite& w) noexcept {
  if (w.ready && !w.ready()) {
    queue.count_dropped(1);
    return;
  }
  const std::string name = file_name(w.write.key, w.write.slot);
  const std::span<const std::span<const std::byte>> payload = w.payload();
  const TierHeader header{w.write.format, w.write.rows, w.write.cols, hash_pieces(payload),
                          opts.mac ? kTierFlagMac : uint8_t{0}};
  std::array<std::byte, kTierHeaderBytes> header_bytes{};
  encode_tier_header(header, header_bytes);
  Mac tag{};
  if (opts.mac) {  // bound to the value's key, as every tier's MAC (format/value_codec.hpp)
    const std::string mac_name =
        value_key(w.write.key, to_string(w.write.slot.kind), w.write.slot.layer_idx);
    tag = opts.mac->compute(mac_name, header_bytes, payload);
  }
  std::vector<iovec> iov;
  iov.reserve(payload.size() + 2);
  iov.push_back({header_bytes.data(), header_bytes.size()});
  if (opts.mac) iov.push_back({tag.data(), tag.size()});
  for (const auto piece : payload) {
    iov.push_back({const_cast<std::byte*>(piece.data()), piece.size()});
  }
  const uint64_t file_bytes = kTierHeaderBytes + (opts.mac ? kMacBytes : 0) + w.bytes;

  {  // room first, so the directory stays within the budget (but for one temp file)
    std::vector<std::string> evicted;
    {
      std::lock_guard lock(index_mutex);
      evicted = evict_locked(file_bytes);
    }
    unlink_files(evicted);
  }
  const std::string temp = path(name) + std::string(kTempMark) + std::to_string(::getpid()) +
                           "." + std::to_string(temp_serial.fetch_add(1));
  constexpr int kFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = opts.io.open(temp.c_str(), kFlags, 0600);
  if (fd < 0 && errno == ENOENT && ::mkdir(opts.dir.c_str(), 0700) == 0) {
    log(LogLevel::kWarn, "disk tier: " + opts.dir + " was removed; created it again");
    fd = opts.io.open(temp.c_str(), kFlags, 0600);
  }
  if (fd < 0) {
    write_failed("create", errno);
    return;
  }
  const bool wrote = write_all(opts.io, fd, std::move(iov));
  const int write_errno = errno;
  if (opts.io.close(fd) != 0 || !wrote) {
    const int err = wrote ? errno : write_errno;
    (void)opts.io.unlink(temp.c_str());
    write_failed(wrote ? "close" : "write", err);
    return;
  }
  // Renamed outside the index lock (a hung file system must not block contains()): a reader
  // that finds the old entry meanwhile reads the old value or the new one, each whole, and the
  // size check of its read turns a new value of another size into a miss.
  if (opts.io.rename(temp.c_str(), path(name).c_str()) != 0) {
    const int err = errno;
    (void)opts.io.unlink(temp.c_str());
    write_failed("rename", err);
    return;
  }
  std::vector<std::string> evicted;
  {
    std::lock_guard lock(index_mutex);
    const auto it = files.find(name);
    if (it != files.end()) erase_locked(it);  // the rename replaced it
    evicted = evict_locked(file_bytes);
    lru.push_back(name);
    files.emplace(name, FileInfo{file_bytes, next_generation++, std::prev(lru.end())});
    bytes_held += file_bytes;
  }
  unlink_files(evicted);
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
  const size_t bytes = WriteBehind::payload_bytes(name(), write, pieces);
  Impl& m = *impl_;
  const uint64_t file_bytes = kTierHeaderBytes + (m.opts.mac ? kMacBytes : 0) + bytes;
  if (!m.enabled || file_bytes > m.opts.budget_bytes) {
    m.queue.count_dropped(1);
    return false;
  }
  if (!m.queue.admits(bytes)) return false;  // over the queue's budget, or closed: counted
  return m.queue.enqueue(write, bytes, pieces, std::move(owner), std::move(ready));
}

void DiskTier::count_dropped(uint64_t writes) noexcept {
  impl_->queue.count_dropped(writes);
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
          m.erase_locked(it);  // deleted by a writer thread
          it = next;
        }
      }
    }
    if (names.empty()) return;
    m.queue.post([&m, names = std::move(names)]() mutable { m.unlink_discarded(std::move(names)); });
  } catch (...) {
    // Out of memory: the files stay until the budget evicts them; a KV-gone value is never
    // asked for, so nothing wrong is served.
  }
}

void DiskTier::flush() { impl_->queue.flush(); }  // writes and discard's deletions

void DiskTier::close() {
  impl_->queue.close();
  // A closed tier writes nothing more (its queue is done above, later writes are dropped): the
  // directory is free for the next store now, not when this one is destroyed (a Python store
  // closed and then collected later must not keep the next engine off its directory). Reads
  // still work: files are whole (written to a temporary name, then renamed).
  impl_->release_directory();
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
  s.writes_enqueued = m.queue.writes_enqueued();
  s.writes_done = m.done.load();
  s.bytes_written = m.bytes_written.load();
  s.dropped_writes = m.queue.dropped_writes();
  s.errors = m.errors.load();
  s.read_mode = direct_reads() ? "direct" : "buffered";
  s.queue_bytes = m.queue.queue_bytes();
  std::lock_guard lock(m.index_mutex);
  s.entries_held = m.files.size();
  s.bytes_held = m.bytes_held;
  return s;
}

}  // namespace hss::detail
