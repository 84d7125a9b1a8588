// DiskTier's reads (tiers/disk/disk_tier.hpp, "Read"): the O_DIRECT probe and its fallback, one
// file's read, contains() and fetch_each() with its read pipeline.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "tiers/disk/disk_tier.hpp"
#include "tiers/disk/disk_tier_impl.hpp"
#include "tiers/disk/file_read_ahead.hpp"

namespace hss::detail {

using disk_tier_parts::kTempMark;

void DiskTier::Impl::probe_direct() {
  if (!opts.direct_reads) return;
  const std::string probe = path(".direct-probe" + std::string(kTempMark) +
                                 std::to_string(::getpid()));
  const int fd = opts.io.open(
      probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_DIRECT, 0600);
  if (fd >= 0) {
    (void)opts.io.close(fd);
    (void)opts.io.unlink(probe.c_str());
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

FileRead DiskTier::Impl::read_file(const std::string& name, uint64_t expected, uint64_t limit,
                                   AlignedBuffer& buffer, int opened) {
  const std::string file = path(name);
  bool einval_at_direct_open = false;  // whether this file refused O_DIRECT at its open
  while (true) {
    const bool direct = opened < 0 && !einval_at_direct_open &&
                        direct_reads.load(std::memory_order_relaxed);
    const int fd = opened >= 0 ? opened
                               : opts.io.open(file.c_str(),
                                              kValueReadFlags | (direct ? O_DIRECT : 0), 0);
    opened = -1;
    if (fd < 0) {
      const int err = errno;
      if (direct && err == EINVAL) {
        // Read it buffered once; O_DIRECT goes off for the tier only if it is a regular file
        // (a FIFO or device planted in a value's place must not turn it off).
        einval_at_direct_open = true;
        continue;
      }
      if (err == ELOOP) return FileRead{ReadOutcome::kRejected, 0, err, "open"};  // a symlink
      return FileRead{err == ENOENT ? ReadOutcome::kGone : ReadOutcome::kFailed, 0, err, "open"};
    }
    const FileRead r = read_open_file(opts.io, fd, direct, expected, limit, buffer);
    if (einval_at_direct_open && r.outcome != ReadOutcome::kRejected) {
      stop_direct_reads("open", EINVAL);
    }
    if (r.outcome == ReadOutcome::kFailed && direct && r.err == EINVAL) {
      stop_direct_reads(r.op, r.err);  // an alignment the device refuses: read it buffered
      continue;
    }
    return r;
  }
}

size_t DiskTier::read_buffers_kept() const { return impl_->read_buffers.kept(); }

namespace {

/// The file names of `requests`, made before the index lock is taken (each is a hash).
std::vector<std::string> file_names(std::span<const TierRequest> requests) {
  std::vector<std::string> names;
  names.reserve(requests.size());
  for (const TierRequest& r : requests) names.push_back(DiskTier::file_name(r.key, r.slot));
  return names;
}

/// One file a fetch reads: its request, the index generation it was found under, its name, its
/// size and the most bytes a value of the asked shape can take.
struct PlannedRead {
  size_t request = 0;
  uint64_t generation = 0;
  std::string name;
  uint64_t bytes = 0;  // the file's size in the index: a file of another size is not read
  uint64_t limit = 0;
};

/// Larger than any value of the asked shape can be (float32 rows, or FP8 rows whose scales
/// outweigh the codes when rows are narrow; a MAC), or than the asker can take: not read at all.
uint64_t read_limit(const TierRequest& r) {
  const uint64_t framing = kTierHeaderBytes + kMacBytes;
  uint64_t limit = uint64_t{1} << 34;
  if (r.rows > 0 && r.cols > 0) {
    const RowFormat fp8 = RowFormat::of(kernels::ElemType::kFp8E4M3);
    limit = framing + std::max(static_cast<uint64_t>(r.rows * r.cols) * 4,
                               fp8.payload_bytes(r.rows, r.cols));
  }
  if (r.max_bytes > 0 && r.max_bytes < limit - framing) limit = framing + r.max_bytes;
  return limit;
}

}  // namespace

std::vector<bool> DiskTier::contains(std::span<const TierRequest> requests) {
  const std::vector<std::string> names = file_names(requests);
  std::vector<bool> present(requests.size(), false);
  std::lock_guard lock(impl_->index_mutex);
  for (size_t i = 0; i < requests.size(); ++i) present[i] = impl_->files.contains(names[i]);
  return present;
}

void DiskTier::fetch_each(std::span<const TierRequest> requests,
                          const std::function<void(size_t, const TierValue&)>& on_value) {
  Impl& m = *impl_;
  // The files the index holds, found under one lock (and marked most recently used); the rest
  // are misses without I/O.
  std::vector<std::string> names = file_names(requests);
  std::vector<PlannedRead> plan;
  plan.reserve(requests.size());
  {
    std::lock_guard lock(m.index_mutex);
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto it = m.files.find(names[i]);
      if (it == m.files.end()) continue;
      m.lru.splice(m.lru.end(), m.lru, it->second.lru);
      plan.push_back({i, it->second.generation, std::move(names[i]), it->second.bytes,
                      read_limit(requests[i])});
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
    if (read.outcome == ReadOutcome::kRejected && !m.rejected_logged.exchange(true)) {
      log(LogLevel::kWarn, "disk tier: " + m.path(p.name) +
                               " is a symlink, not a regular file, or not the size written; a "
                               "corrupt miss, deleted (counted; logged once)");
    }
    bool bad = read.outcome == ReadOutcome::kTooLarge || read.outcome == ReadOutcome::kRejected;
    DecodedValue decoded;
    if (!bad) {
      const std::span<const std::byte> value(buffer.data(), read.got);
      const std::string mac_name =
          m.opts.mac ? value_key(r.key, to_string(r.slot.kind), r.slot.layer_idx) : std::string();
      decoded = decode_tier_value(value, r.rows, r.cols, m.opts.mac.get(), mac_name);
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
    // threads (tiers/disk/file_read_ahead.hpp). Without a thread to be had, the serial loop below.
    std::optional<FileReadAhead> pipeline;
    try {
      pipeline.emplace(
          plan.size(), std::max(m.opts.read_threads, 1),
          [&m, &plan](size_t j, AlignedBuffer& buffer) {
            return m.read_file(plan[j].name, plan[j].bytes, plan[j].limit, buffer, -1);
          },
          &m.read_buffers);
    } catch (const std::system_error&) {
      pipeline.reset();
    }
    if (pipeline) {
      for (const PlannedRead& p : plan) {
        const FileReadAhead::Item item = pipeline->next();
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
  struct KeptBuffer {  // the tier's, given back however the loop ends
    AlignedBufferCache& cache;
    AlignedBuffer buffer;
    ~KeptBuffer() { cache.give_back(std::move(buffer)); }
  } kept{m.read_buffers, m.read_buffers.take()};
  AlignedBuffer& buffer = kept.buffer;
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
    take(plan[j], m.read_file(plan[j].name, plan[j].bytes, plan[j].limit, buffer, fd), buffer);
  }
}

}  // namespace hss::detail
