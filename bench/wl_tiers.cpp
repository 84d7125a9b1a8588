// Workload `tiers`: the pool and the local disk tier (issue 32) against the device underneath,
// all in one run, 16K tokens x 4096 float32 (64 chunks of 4 MiB, 256 MiB):
//
//  * host hit: retrieve of a prefix the pool holds, against memcpy of the same bytes.
//  * disk hit (cold): a store whose pool is emptied before every rep restores the prefix from the
//    disk tier, every file's pages dropped first (fdatasync + posix_fadvise DONTNEED), against the
//    raw device: one file of the same bytes read sequentially with pread in 4 MiB blocks after the
//    same drop (buffered, as dd does), and the same with O_DIRECT, into 4 KiB pages (as dd
//    iflag=direct) and into huge pages (as the tier reads: tiers/disk/disk_io.hpp).
//  * promotion: the cold disk hit, then a retrieve of the same prefix (a host hit now).
//  * spill: store + flush with the disk tier on (the write-behind lands every file) against a raw
//    pwrite of the same bytes into one file (no fsync, as the tier does none); store with the
//    tier on against off (the call alone: what write-behind costs the caller).
//  * reads in flight: the tier's 64 files read with O_DIRECT into huge pages one after the other
//    against 2 and 4 threads of preads, and against the same serial reads into 4 KiB pages (do several reads in flight pay on this device?), and the tier's fetch
//    alone: O_DIRECT with its default 1 reader thread against 2 and 4, and against buffered
//    reads after a drop.
//
// Files go in a fresh directory under HSS_BENCH_DISK_DIR (default /var/tmp), removed at the end.

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "tiers/disk/disk_tier.hpp"

namespace hss::bench {
namespace {

namespace fs = std::filesystem;

constexpr size_t kBlock = 4 << 20;  // dd's bs=4M

/// A fresh directory, removed with everything in it at the end.
class BenchDir {
 public:
  BenchDir() {
    const char* base = std::getenv("HSS_BENCH_DISK_DIR");
    std::string pattern = std::string(base != nullptr && *base ? base : "/var/tmp") +
                          "/hss-bench-tiers-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("cannot create a directory like " + pattern);
    }
    root = pattern;
  }
  ~BenchDir() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
  BenchDir(const BenchDir&) = delete;
  BenchDir& operator=(const BenchDir&) = delete;
  std::string root;
};

/// Writes back and drops the page cache of every regular file under `path` (a file or a
/// directory): the next read goes to the device.
void drop_cache(const std::string& path) {
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
  } else {
    files.push_back(path);
  }
  for (const std::string& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    (void)::fdatasync(fd);  // dirty pages are not dropped
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::syncfs(fd);
  ::close(fd);
}

/// A buffer for O_DIRECT: page-aligned (4 KiB pages), or `huge`: the tier's own read buffer
/// (huge-page-aligned, MADV_HUGEPAGE), faulted in before any timed read.
std::shared_ptr<std::byte> aligned(size_t bytes, bool huge) {
  if (huge) {
    auto buffer = std::make_shared<detail::AlignedBuffer>();
    std::byte* p = buffer->reserve(std::max(bytes, detail::kHugePageBytes));
    std::memset(p, 0, bytes);
    return {buffer, p};  // aliases the buffer: freed with it
  }
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return {static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); }};
}

/// pread of a whole file in 4 MiB blocks into `out`; its size.
size_t read_file(const std::string& path, std::byte* out, size_t capacity, bool direct) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0) throw std::runtime_error("open " + path + ": " + std::strerror(errno));
  size_t got = 0;
  while (got < capacity) {
    const ssize_t n = ::pread(fd, out + got, std::min(kBlock, capacity - got),
                              static_cast<off_t>(got));
    if (n < 0) {
      ::close(fd);
      throw std::runtime_error("pread " + path + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  return got;
}

Timed raw_read(const std::string& path, size_t bytes, bool direct, bool huge = false) {
  auto buffer = aligned(bytes + 4096, huge);
  Timed t;
  t.name = !direct ? "raw read" : huge ? "raw read O_DIRECT huge pages" : "raw read O_DIRECT";
  t.prepare = [path] { drop_cache(path); };
  t.run = [path, buffer, bytes, direct] {
    if (read_file(path, buffer.get(), bytes, direct) != bytes) {
      throw std::runtime_error("raw read: short file");
    }
    do_not_optimize(buffer.get());
  };
  t.bytes = static_cast<double>(bytes);
  return t;
}

Timed raw_write(const std::string& path, const void* src, size_t bytes) {
  Timed t;
  t.name = "raw write";
  t.prepare = [path] {
    (void)::unlink(path.c_str());
    sync_dir(fs::path(path).parent_path());  // no earlier rep's writeback beside this one
  };
  t.run = [path, src, bytes] {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("open " + path + ": " + std::strerror(errno));
    for (size_t at = 0; at < bytes;) {
      const ssize_t n = ::pwrite(fd, static_cast<const std::byte*>(src) + at,
                                 std::min(kBlock, bytes - at), static_cast<off_t>(at));
      if (n <= 0) {
        ::close(fd);
        throw std::runtime_error("pwrite " + path + ": " + std::strerror(errno));
      }
      at += static_cast<size_t>(n);
    }
    ::close(fd);
  };
  t.bytes = static_cast<double>(bytes);
  return t;
}

/// The files of `dir` read whole with O_DIRECT by `threads` threads (file i by thread i % N),
/// into huge pages or 4 KiB pages.
Timed files_read(const std::string& dir, size_t total, int threads, bool huge = true) {
  auto files = std::make_shared<std::vector<std::string>>();
  size_t largest = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    files->push_back(e.path());
    largest = std::max<size_t>(largest, e.file_size());
  }
  const size_t capacity = (largest + 4095) / 4096 * 4096;
  auto buffers = std::make_shared<std::vector<std::shared_ptr<std::byte>>>();
  for (int t = 0; t < threads; ++t) buffers->push_back(aligned(capacity, huge));
  Timed t;
  t.name = (threads == 1 ? std::string("files read serial")
                         : "files read " + std::to_string(threads) + " threads") +
           (huge ? "" : " 4 KiB pages");
  t.prepare = [dir] { drop_cache(dir); };
  t.run = [files, buffers, capacity, threads] {
    auto read_share = [&](int me) {
      for (size_t i = static_cast<size_t>(me); i < files->size(); i += threads) {
        (void)read_file((*files)[i], (*buffers)[me].get(), capacity, true);
      }
    };
    std::vector<std::thread> helpers;
    for (int me = 1; me < threads; ++me) helpers.emplace_back(read_share, me);
    read_share(0);
    for (std::thread& h : helpers) h.join();
  };
  t.bytes = static_cast<double>(total);
  return t;
}

Config disk_config(int64_t chunk, uint64_t pool_bytes, const std::string& dir) {
  Config c;
  c.chunk_size = chunk;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = static_cast<double>((pool_bytes >> 20) + 1) / 1024.0;
  if (!dir.empty()) {
    c.local_disk = dir;
    c.max_local_disk_size = 16.0;  // every rep's files fit: no eviction inside a timed run
  }
  return c;
}

}  // namespace

void run_tiers(Context& ctx) {
  const BenchDir dir;
  const int64_t chunk = 256;
  const int64_t hidden = ctx.quick ? 1024 : 4096;
  const int64_t n = ctx.quick ? 2048 : 16384;
  const uint64_t pool = pool_bytes_for(n / chunk, chunk, hidden, 4);
  const size_t bytes = static_cast<size_t>(n * hidden * 4);
  auto tokens = std::make_shared<std::vector<int32_t>>(make_tokens(n, 31));
  auto rows = std::make_shared<const CopyBuffer>(random_f32(n * hidden, 37).data(), bytes);
  const TensorView view = host_view(rows->data(), DType::kFloat32, n, hidden);
  const std::string values = dir.root + "/hsstore";

  Params p;
  p.chunk_size = chunk;
  p.hidden_dim = hidden;
  p.tokens = n;
  p.dtype = "float32";
  p.storage = "float32";

  // The prefix on disk, written once through the write-behind (as an earlier process would).
  auto db = std::make_shared<ChunkedTokenDatabase>(chunk, false);
  auto chunks = std::make_shared<std::vector<Chunk>>(db->process_tokens(*tokens));
  {
    HiddenStateStore writer(disk_config(chunk, pool, dir.root), *db);
    (void)writer.store_hidden_states(*tokens, view);
    writer.flush();
    const TierStats s = writer.stats().tiers.at(0);
    if (s.writes_done != static_cast<uint64_t>(n / chunk)) {
      throw std::runtime_error("the write-behind wrote " + std::to_string(s.writes_done) +
                               " of " + std::to_string(n / chunk) + " values");
    }
  }
  // The raw device's file: the same bytes, one file.
  const std::string raw_path = dir.root + "/raw.bin";
  {
    Timed w = raw_write(raw_path, rows->data(), bytes);
    w.prepare();
    w.run();
  }
  const Timed raw_refs[] = {raw_read(raw_path, bytes, false), raw_read(raw_path, bytes, true),
                            raw_read(raw_path, bytes, true, true)};

  // Host hit.
  {
    auto store = std::make_shared<HiddenStateStore>(disk_config(chunk, pool, ""), *db);
    (void)store->store_hidden_states(*tokens, view);
    Timed hit = prefix_retrieve("host hit", store, tokens, n, {});
    hit.bytes = static_cast<double>(bytes);
    const Timed copy = memcpy_reference(rows);
    p.output = "fresh";
    (void)ctx.report.measure("tiers", "host hit f32", p, hit, std::span<const Timed>(&copy, 1));
  }

  // Disk hit (cold) and promotion: a reader whose pool is emptied before every rep. In a block:
  // the reader (and every figure holding it) lets go of the directory before the fetch figures
  // below open it (one store per directory).
  {
    auto reader = std::make_shared<HiddenStateStore>(disk_config(chunk, pool, dir.root), *db);
    {
      const auto restored = reader->retrieve_hidden_states(*tokens);
      if (!restored || restored->rows() != n ||
          std::memcmp(restored->data(), rows->data(), bytes) != 0) {
        throw std::runtime_error("the disk tier did not restore the prefix bit-exact");
      }
    }
    const auto empty_pool = [reader, chunks, values] {
      for (const Chunk& c : *chunks) (void)reader->drop_key(c.key);
      drop_cache(values);
    };
    Timed cold = prefix_retrieve("disk hit cold", reader, tokens, n, empty_pool);
    cold.bytes = static_cast<double>(bytes);
    (void)ctx.report.measure("tiers", "disk hit f32 cold", p, cold, raw_refs);
    Timed promoted = cold;
    promoted.name = "disk hit + host hit";
    promoted.run = [reader, tokens, n, chunk] {
      const uint64_t before = reader->stats().tiers.at(0).hits;
      for (int i = 0; i < 2; ++i) {
        auto out = reader->retrieve_hidden_states(*tokens);
        if (!out || out->rows() != n) throw std::runtime_error("promotion missed");
        do_not_optimize(out->data());
      }
      if (reader->stats().tiers.at(0).hits - before != static_cast<uint64_t>(n / chunk)) {
        throw std::runtime_error("the second retrieve went to the disk: not promoted");
      }
    };
    (void)ctx.report.measure("tiers", "promotion f32 (disk hit, then host hit)", p, promoted,
                             raw_refs);
  }

  // Reads in flight: the tier's own files, serial vs a pool of pread threads.
  {
    const Timed serial = files_read(values, bytes, 1);
    const Timed pooled[] = {files_read(values, bytes, 2), files_read(values, bytes, 4),
                            files_read(values, bytes, 1, false)};
    p.output = "O_DIRECT";
    (void)ctx.report.measure("tiers", "value files read serial", p, serial, pooled);
    // The tier's fetch alone (read, checked, dropped): O_DIRECT vs buffered after a drop.
    // One store per directory (the tier's lock): the figures interleaved below share one open
    // tier, which each rep's `prepare` (untimed) closes and opens anew with its own options.
    auto open_tier = std::make_shared<std::unique_ptr<detail::DiskTier>>();
    auto make_fetch = [&](bool direct, int ahead, int readers = 1) {
      detail::DiskTierOptions o;
      o.dir = values;
      o.budget_bytes = 16ULL << 30;
      o.queue_bytes = 16ULL << 20;
      o.direct_reads = direct;
      o.read_ahead_files = ahead;
      o.read_threads = readers;
      auto tier = open_tier;
      auto requests = std::make_shared<std::vector<detail::TierRequest>>();
      for (const Chunk& c : *chunks) {
        requests->push_back({c.key, Slot{ActivationKind::kHidden, 0}, chunk, hidden});
      }
      Timed t;
      t.name = direct ? "tier fetch O_DIRECT " + std::to_string(readers) + " reader" +
                            (readers == 1 ? "" : "s")
                      : "tier fetch buffered read-ahead " + std::to_string(ahead);
      t.prepare = [values, tier, o] {
        tier->reset();
        *tier = std::make_unique<detail::DiskTier>(o);
        drop_cache(values);
      };
      t.run = [tier, requests] {
        size_t got = 0;
        (*tier)->fetch_each(*requests, [&](size_t, const detail::TierValue& v) {
          do_not_optimize(v.payload.data());
          ++got;
        });
        if (got != requests->size()) throw std::runtime_error("tier fetch missed");
      };
      t.bytes = static_cast<double>(bytes);
      return t;
    };
    {
      detail::DiskTierOptions o;
      o.dir = values;
      o.budget_bytes = 16ULL << 30;
      o.queue_bytes = 16ULL << 20;
      o.direct_reads = true;
      ctx.report.note("tiers", values + (detail::DiskTier(std::move(o)).direct_reads()
                                             ? " takes O_DIRECT"
                                             : " refuses O_DIRECT: O_DIRECT figures are buffered"));
    }
    const Timed against[] = {make_fetch(true, 0, 2), make_fetch(true, 0, 4),
                             make_fetch(false, 4), make_fetch(false, 0), make_fetch(false, 8),
                             raw_refs[0], raw_refs[1], raw_refs[2]};
    p.output = "checked values";
    (void)ctx.report.measure("tiers", "tier fetch O_DIRECT", p, make_fetch(true, 0), against);
    open_tier->reset();
  }

  // Spill: store + flush with the tier on vs raw pwrite; store with the tier on vs off.
  {
    auto on = std::make_shared<HiddenStateStore>(disk_config(chunk, 2 * pool, dir.root), *db);
    auto off = std::make_shared<HiddenStateStore>(disk_config(chunk, 2 * pool, ""), *db);
    // Each rep writes fresh keys after the previous rep's write-behind landed, with no earlier
    // rep's writeback beside it.
    auto make_store = [&](const std::shared_ptr<HiddenStateStore>& store, const char* name,
                          bool then_flush) {
      return fresh_store(name, store, on, db, *tokens, view, static_cast<double>(bytes),
                         then_flush, {}, [values] { sync_dir(values); });
    };
    p.output.clear();
    const Timed raw = raw_write(dir.root + "/raw-write.bin", rows->data(), bytes);
    (void)ctx.report.measure("tiers", "spill f32 (store + flush, disk on)", p,
                             make_store(on, "disk on + flush", true),
                             std::span<const Timed>(&raw, 1));
    const Timed store_off = make_store(off, "disk off", false);
    (void)ctx.report.measure("tiers", "store f32 disk on", p, make_store(on, "disk on", false),
                             std::span<const Timed>(&store_off, 1));
    on->flush();
    const TierStats s = on->stats().tiers.at(0);
    ctx.report.note("tiers", "store with the disk tier on: " + std::to_string(s.writes_done) +
                                 " files written, " + std::to_string(s.dropped_writes) +
                                 " dropped, " + std::to_string(s.errors) + " errors");
  }
  ctx.report.print_workload("tiers");
}

}  // namespace hss::bench
