#pragma once
// hss::detail::DiskTier: hidden-state values in files of a local directory (local_disk or
// hidden_state_disk_path, subdirectory hsstore/), the tier nearest the pool: asked before the
// remote tier. Private to the process (discard deletes), kept across restarts.
//
// * Files. One value per (chunk key, kind, layer), named
//   "<xxHash3-128 of CacheEngineKey::to_string(), 32 hex>.<kind>.<layer>.hsv" (every slot of a
//   chunk shares the prefix, so discard finds them without reading), holding the value codec's
//   encoding (format/value_codec.hpp: 32-byte TierHeader with xxHash3 of the payload [+ MAC
//   over the value's value_key when a MAC key is set] + payload). Nothing else on disk: the
//   directory is the index.
// * Write-behind: the shared queue of tiers/write_behind.hpp (validation, borrowed or copied
//   pieces, drop-oldest, counters, writer threads and their roles); this tier supplies the file
//   writes. Its budget: a quarter of the disk budget, clamped to 16..256 MiB. Each writer writes
//   a value with pwritev into "<name>.tmp.<pid>.<n>" in the same directory, then rename() it
//   over the final name: a reader sees the old complete value or the new one, never a torn one.
//   No fsync (docs/design.md, "Local disk tier": after a power loss a file may be missing, empty
//   or short; its checksum makes that a clean miss). The writer roles (writer_threads = 2 by
//   default: one idle writer, one pressure writer) are why the write-behind does not slow the
//   thread that stores: its hashing and copies into the page cache take CPU, and at nice 10 they
//   cost a 2-CPU store ~12% (docs/perf.md).
// * Read. contains() is the in-memory index (no I/O). fetch_each finds the files in the index
//   under one lock, then reads them; each value is decoded and checked (shape, checksum, MAC,
//   truncated) and handed over on the caller's thread, in request order: a value that fails a
//   check is a counted corrupt miss and its file is deleted.
//   O_DIRECT (the default where the directory takes it): one read per file into an aligned
//   buffer, whole blocks asked, the kernel stopping at the file's end; no page cache, so a cold
//   read costs what the device costs and the pool's copy is the only one in memory. Two files or
//   more are read ahead of their checks and copies by read_threads reader threads started for
//   the call (tiers/disk/file_read_ahead.hpp; 1 by default: 2 and 4 measured no faster here), so
//   a cold hit is the reads' time, not reads plus checks plus copies. The read buffers are kept
//   from one fetch to the next (at most read_threads + 2, each as large as the largest file read:
//   12 MiB for 4 MiB values), so a read goes into pages already faulted in; fresh buffers made a
//   64-file cold hit ~50 ms slower here (disk_io.hpp, AlignedBufferCache).
//   Buffered (direct_reads off, or refused): while one file is read, the next read_ahead_files
//   (4) are open with their reads started in the kernel (POSIX_FADV_WILLNEED), so several reads
//   are in flight without threads; each file's pages are dropped after its read. The choices,
//   measured: docs/perf.md, "Local disk tier".
// * Budget. An LRU of the files (last write or read) in memory: before a write, the least
//   recently used files are deleted until the new one fits max_local_disk_size (bytes of the
//   files, headers included: TierStats::bytes_held counts the same). discard() forgets a
//   chunk's files at once and deletes them on a writer thread (it must not block on I/O).
// * Restart. The constructor scans the directory (readdir + fstatat per file), deletes temp
//   leftovers and files too short for a header, re-indexes the rest oldest-first by mtime and
//   applies the budget. Measured: ~35 ms per 10,000 files on a warm page cache
//   (tests/tiers/test_disk_tier.cpp, RestartScanOfManyFilesIsBounded).
// * Faults. Every call on a value's file goes through DiskTierOptions::io (tiers/disk/
//   disk_io.hpp: open, pwritev, pread, close, rename, unlink; the system calls by default),
//   which tests replace to inject ENOSPC, EIO, short transfers and hangs (tests/tiers/
//   test_disk_faults.cpp, test_disk_trust.cpp). A
//   directory that cannot be created disables the tier (logged once; every write dropped and
//   counted, every read a miss). A failed create, write, close or rename (read-only directory,
//   ENOSPC, EIO, the directory removed: it is re-created once, one level) drops the write,
//   removes its temp file, counts an error (TierStats::errors and dropped_writes) and logs once
//   per cause (call and errno). Short writes and reads are resumed where they stopped. A failed
//   open (other than ENOENT) or read (EIO) is a miss counted in errors, logged once per cause;
//   the file is forgotten and deleted, so a failing file is not read again and the next store
//   of the chunk writes it afresh. Bytes a device returns wrong fail the checksum (a corrupt
//   miss). Nothing throws out of a store or a retrieve, and no unchecked byte is served.
// * I/O. Writes: pwritev of the header, MAC and the entry's own pieces (no staging copy) on a
//   small pool of writer threads, through the page cache (the kernel's writeback makes large
//   sequential writes of them; O_DIRECT writes would need a copy into an aligned buffer and a
//   padded file for no gain in a write-behind that nobody waits for). Reads: see "Read". O_DIRECT
//   where the directory takes it: a probe file at construction (O_DIRECT open refused with EINVAL,
//   as tmpfs does: reads buffered, logged once), and an EINVAL at a read's open or pread turns
//   O_DIRECT off for good (logged once) and reads that file again buffered; direct_reads() says
//   which mode is in use (stats(): TierStats::read_mode, "direct" or "buffered"; hss info). No
//   io_uring (docs/perf.md).
// * Trust (docs/design.md, "Threat model"). The directory holds every tenant's hidden states, so
//   it is this user's alone: made 0700 (parents it creates too) and its files 0600 (O_EXCL |
//   O_NOFOLLOW temp files); at start a directory that is a symlink, owned by another user or
//   writable by others is a ConfigError naming it (one of ours open to others, and its files,
//   lose their group and other bits). One store per directory: the first takes ".hsstore.lock" (flock, released when
//   the tier is closed or destroyed, or its process ends); a second store on it runs without the tier (logged, counted
//   in errors), so no store deletes another's temp files or keeps a budget blind to its files.
//   Reads open with O_NOFOLLOW | O_NONBLOCK and fstat before any read: a symlink, FIFO or device
//   in a value's place, or a file not the size the index holds, is a corrupt miss (deleted,
//   logged once), never followed, waited on, or a reason to turn O_DIRECT off.
//
// Thread safety: every method may be called from many threads at once. enqueue_write, contains
// and discard never touch the disk, and no file system call is made under the index lock (a
// rename or unlink that hangs blocks its writer thread only). fetch_each blocks its caller on
// disk reads.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "format/value_mac.hpp"
#include "hss/config.hpp"
#include "tiers/backing_tier.hpp"
#include "tiers/disk/disk_io.hpp"

namespace hss::detail {

struct DiskTierOptions {
  std::string dir;             ///< the files' directory (created, with its parents, if missing)
  uint64_t budget_bytes = 0;   ///< bytes of files kept; least recently used deleted beyond
  uint64_t queue_bytes = 0;    ///< write-behind budget (payload bytes); oldest dropped beyond
  int writer_threads = 2;      ///< >= 1 (roles: "Write-behind" above)
  std::shared_ptr<const ValueMac> mac;  ///< null: values carry the xxHash3 only
  bool direct_reads = true;    ///< O_DIRECT reads where the directory takes them (see "I/O")
  int read_ahead_files = 4;    ///< buffered reads: files whose reads are started ahead (0: none)
  int read_threads = 1;        ///< O_DIRECT reads of a fetch in flight at once (>= 1; see "Read")
  DiskIo io = DiskIo::system();  ///< the system calls a value's file goes through (tests: faults)
};

class DiskTier final : public BackingTier {
 public:
  /// nullptr when the config names no disk directory (Config::hidden_state_disk_dir). A MAC key
  /// that cannot be used is a ConfigError (ValueMac::from_config), and so is a directory that is
  /// a symlink, another user's, or writable by others ("Trust" above); a directory that cannot
  /// be made or opened, or one another store holds, is not (the tier runs disabled, logged,
  /// counted).
  [[nodiscard]] static std::unique_ptr<DiskTier> create(const Config& config);

  /// Checks, locks and scans options.dir now (see "Trust" and "Restart" above).
  explicit DiskTier(DiskTierOptions options);
  ~DiskTier() override;
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  [[nodiscard]] std::string_view name() const noexcept override { return "disk"; }
  bool enqueue_write(const TierWrite& write, std::span<const std::span<const std::byte>> pieces,
                     std::shared_ptr<const void> owner = {},
                     std::function<bool()> ready = {}) override;
  void count_dropped(uint64_t writes) noexcept override;
  [[nodiscard]] std::vector<bool> contains(std::span<const TierRequest> requests) override;
  /// The value passed to on_value is valid during the callback only (one read buffer per call).
  void fetch_each(std::span<const TierRequest> requests,
                  const std::function<void(size_t, const TierValue&)>& on_value) override;
  void discard(std::span<const CacheEngineKey> keys) noexcept override;
  /// Also waits for the deletions discard() queued.
  void flush() override;
  void close() override;
  [[nodiscard]] TierStats stats() const override;

  /// The directory and budget in use (hss info, tests).
  [[nodiscard]] const std::string& dir() const noexcept;
  [[nodiscard]] uint64_t budget_bytes() const noexcept;
  /// False when the directory could not be made or opened at construction.
  [[nodiscard]] bool enabled() const noexcept;
  /// True while reads use O_DIRECT; false when off in the options or the directory refused it
  /// (EINVAL at the probe or at a read: logged once, reads buffered from then on).
  [[nodiscard]] bool direct_reads() const noexcept;
  /// Read buffers kept for the next fetch (at most read_threads + 2; see "Read").
  [[nodiscard]] size_t read_buffers_kept() const;

  /// The lock file in the directory (flock): one store per directory at a time.
  static constexpr std::string_view kLockFile = ".hsstore.lock";

  /// The file name of one value (no directory).
  [[nodiscard]] static std::string file_name(const CacheEngineKey& key, Slot slot);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hss::detail
