// The disk tier's faults injected through its I/O seam (src/tiers/disk/disk_io.hpp), tested
// through HiddenStateStore: disk full (ENOSPC), EIO on create, write, close, rename and read,
// short writes and reads, bytes corrupted by the device, O_DIRECT refused. Each is a counted
// dropped write or miss, logged once per cause, never an exception out of store or retrieve,
// never a wrong byte served.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "hss/hss.hpp"
#include "store/backing_tiers.hpp"
#include "test_util.hpp"
#include "tier_test_dir.hpp"
#include "tiers/disk/disk_tier.hpp"

namespace hss {
namespace {

namespace fs = std::filesystem;
using detail::DiskIo;
using detail::DiskTier;
using test::make_rows;
using test::make_tokens;
using test::view_of;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;
constexpr uint64_t kPayload = kChunk * kCols * 4;  // one float32 chunk
constexpr uint64_t kFileBytes = 32 + kPayload;

using test::TempDir;

/// Every store built while it lives gets one disk tier on `dir` going through `io` (one writer
/// thread: writes land in store order; one reader thread by default: files are opened in
/// prefix order, which the tests that fail the n-th open count on). The config names no disk,
/// so it is the only tier.
class DiskThrough {
 public:
  DiskThrough(const std::string& dir, DiskIo io, bool direct_reads = true, int read_threads = 1) {
    detail::set_extra_tiers_for_testing([this, dir, io, direct_reads,
                                         read_threads](const Config&) {
      detail::DiskTierOptions o;
      o.dir = dir;
      o.budget_bytes = 1ULL << 30;
      o.queue_bytes = 16ULL << 20;
      o.writer_threads = 1;
      o.direct_reads = direct_reads;
      o.read_threads = read_threads;
      o.io = io;
      auto tier = std::make_unique<DiskTier>(std::move(o));
      last = tier.get();
      std::vector<std::unique_ptr<detail::BackingTier>> tiers;
      tiers.push_back(std::move(tier));
      return tiers;
    });
  }
  ~DiskThrough() { detail::set_extra_tiers_for_testing({}); }
  DiskThrough(const DiskThrough&) = delete;
  DiskThrough& operator=(const DiskThrough&) = delete;

  DiskTier* last = nullptr;  ///< the tier of the store built last
};

Config pool_only() { return test::store_config(kChunk, kCols, 64); }

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() != DiskTier::kLockFile) out.push_back(e.path().filename());
  }
  return out;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// Stores `chunks` chunks into a store with the disk tier going through `io`, flushes; the
/// tier's stats and what it logged.
struct Written {
  TierStats stats;
  std::string log;
};
Written write_through(const std::string& dir, const DiskIo& io,
                      const std::vector<int32_t>& tokens, int64_t chunks) {
  DiskThrough disk(dir, io);
  ChunkedTokenDatabase db(kChunk, false);
  testing::internal::CaptureStderr();
  {
    HiddenStateStore store(pool_only(), db);
    const auto rows = make_rows(tokens, 0, 0, kCols);
    EXPECT_NO_THROW(
        EXPECT_EQ(store.store_hidden_states(tokens, view_of(rows, kCols)).written, chunks));
    store.flush();
    Written w;
    w.stats = store.stats().tiers.at(0);
    w.log = testing::internal::GetCapturedStderr();
    return w;
  }
}

/// A fresh store (empty pool) with the disk tier going through `io` retrieves `tokens`.
struct Read {
  std::optional<HostTensor> got;
  TierStats stats;
  std::string log;
  bool direct = false;
};
Read read_through(const std::string& dir, const DiskIo& io, const std::vector<int32_t>& tokens,
                  bool direct_reads = true, int read_threads = 1) {
  DiskThrough disk(dir, io, direct_reads, read_threads);
  ChunkedTokenDatabase db(kChunk, false);
  testing::internal::CaptureStderr();
  HiddenStateStore store(pool_only(), db);
  Read r;
  EXPECT_NO_THROW(r.got = store.retrieve_hidden_states(tokens));
  r.stats = store.stats().tiers.at(0);
  r.direct = disk.last->direct_reads();
  r.log = testing::internal::GetCapturedStderr();
  store.check_invariants();
  return r;
}

void expect_prefix(const std::optional<HostTensor>& got, const std::vector<int32_t>& tokens,
                   int64_t rows) {
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->rows(), rows);
  ASSERT_EQ(got->bytes(), static_cast<size_t>(rows * kCols * 4));
  const auto expected = make_rows(tokens, 0, 0, kCols);
  EXPECT_EQ(std::memcmp(got->data(), expected.data(), got->bytes()), 0);
}

/// pwritev that fails with `err` on the calls whose (1-based) number is in `failing`.
DiskIo failing_writes(std::set<int> failing, int err) {
  DiskIo io = DiskIo::system();
  auto calls = std::make_shared<std::atomic<int>>(0);
  io.pwritev = [calls, failing, err, real = io.pwritev](int fd, const iovec* iov, int count,
                                                          off_t offset) -> ssize_t {
    if (failing.contains(++*calls)) {
      errno = err;
      return -1;
    }
    return real(fd, iov, count, offset);
  };
  return io;
}

TEST(DiskFaults, DiskFullDropsThoseWritesCountedAndLoggedOnceTheRestLand) {
  const TempDir dir;
  const auto tokens = make_tokens(4 * kChunk, 11);
  const Written w = write_through(dir.root, failing_writes({2, 3}, ENOSPC), tokens, 4);
  EXPECT_EQ(w.stats.writes_enqueued, 4U);
  EXPECT_EQ(w.stats.writes_done, 2U);
  EXPECT_EQ(w.stats.dropped_writes, 2U);
  EXPECT_EQ(w.stats.errors, 2U);
  EXPECT_EQ(w.stats.entries_held, 2U);
  EXPECT_EQ(w.stats.bytes_held, 2 * kFileBytes);
  EXPECT_EQ(w.stats.bytes_written, 2 * kPayload);
  EXPECT_EQ(count_of(w.log, std::strerror(ENOSPC)), 1U) << w.log;
  EXPECT_EQ(names_in(dir.root).size(), 2U);  // no temp file left behind

  // Chunks 0 and 3 landed: a fresh store serves the prefix up to the hole, bit-exact.
  const Read r = read_through(dir.root, DiskIo::system(), tokens);
  expect_prefix(r.got, tokens, kChunk);
  EXPECT_EQ(r.stats.hits, 2U);
  EXPECT_EQ(r.stats.misses, 2U);
  EXPECT_EQ(r.stats.errors, 0U);
  EXPECT_EQ(r.stats.bytes_read, 2 * kPayload);
}

TEST(DiskFaults, EioOnEveryWriteDropsEveryValueLoggedOnceAndNothingIsServed) {
  const TempDir dir;
  const auto tokens = make_tokens(3 * kChunk, 12);
  const Written w = write_through(dir.root, failing_writes({1, 2, 3}, EIO), tokens, 3);
  EXPECT_EQ(w.stats.writes_done, 0U);
  EXPECT_EQ(w.stats.dropped_writes, 3U);
  EXPECT_EQ(w.stats.errors, 3U);
  EXPECT_EQ(w.stats.entries_held, 0U);
  EXPECT_EQ(w.stats.bytes_written, 0U);
  EXPECT_EQ(count_of(w.log, std::strerror(EIO)), 1U) << w.log;
  EXPECT_TRUE(names_in(dir.root).empty());

  const Read r = read_through(dir.root, DiskIo::system(), tokens);
  EXPECT_FALSE(r.got.has_value());
  EXPECT_EQ(r.stats.hits, 0U);
  EXPECT_EQ(r.stats.misses, 3U);
  EXPECT_EQ(r.stats.errors, 0U);  // nothing indexed: no file opened
}

TEST(DiskFaults, EachFailingCallOfAWriteDropsItAndLeavesNoFileEachCauseLoggedOnce) {
  const TempDir dir;
  DiskIo io = DiskIo::system();
  auto creates = std::make_shared<std::atomic<int>>(0);
  auto temp_closes = std::make_shared<std::atomic<int>>(0);
  auto renames = std::make_shared<std::atomic<int>>(0);
  auto temp_fds = std::make_shared<std::set<int>>();  // the writer thread's alone: one thread
  // Chunk 0: create fails (EIO); chunk 1: close fails (EIO, as NFS reports a lost write);
  // chunk 2: rename fails (ENOSPC, a full directory block); chunk 3 lands.
  io.open = [creates, temp_fds, real = io.open](const char* path, int flags, mode_t mode) {
    const bool temp = (flags & O_CREAT) != 0 && (flags & O_DIRECT) == 0;  // not the probe
    if (temp && ++*creates == 1) {
      errno = EIO;
      return -1;
    }
    const int fd = real(path, flags, mode);
    if (temp && fd >= 0) temp_fds->insert(fd);
    return fd;
  };
  io.close = [temp_closes, temp_fds, real = io.close](int fd) {
    const bool temp = temp_fds->erase(fd) > 0;
    const int rc = real(fd);
    if (temp && ++*temp_closes == 1) {
      errno = EIO;
      return -1;
    }
    return rc;
  };
  io.rename = [renames, real = io.rename](const char* from, const char* to) {
    if (++*renames == 1) {
      errno = ENOSPC;
      return -1;
    }
    return real(from, to);
  };
  const auto tokens = make_tokens(4 * kChunk, 13);
  const Written w = write_through(dir.root, io, tokens, 4);
  EXPECT_EQ(w.stats.writes_enqueued, 4U);
  EXPECT_EQ(w.stats.writes_done, 1U);
  EXPECT_EQ(w.stats.dropped_writes, 3U);
  EXPECT_EQ(w.stats.errors, 3U);
  EXPECT_EQ(w.stats.entries_held, 1U);
  EXPECT_EQ(count_of(w.log, "disk tier: create"), 1U) << w.log;
  EXPECT_EQ(count_of(w.log, "disk tier: close"), 1U) << w.log;
  EXPECT_EQ(count_of(w.log, "disk tier: rename"), 1U) << w.log;
  EXPECT_EQ(names_in(dir.root).size(), 1U);  // chunk 3's value, no temp file

  const Read r = read_through(dir.root, DiskIo::system(), tokens);
  EXPECT_FALSE(r.got.has_value());  // chunk 0 is missing: no prefix
  EXPECT_EQ(r.stats.hits, 1U);
  EXPECT_EQ(r.stats.misses, 3U);
}

TEST(DiskFaults, ShortWritesAreResumedAndTheValuesAreBitExact) {
  const TempDir dir;
  DiskIo io = DiskIo::system();
  auto calls = std::make_shared<std::atomic<int>>(0);
  // At most 100 bytes per call: the header, the payload's pieces cut anywhere.
  io.pwritev = [calls, real = io.pwritev](int fd, const iovec* iov, int count, off_t offset) {
    ++*calls;
    std::vector<iovec> cut;
    size_t left = 100;
    for (int i = 0; i < count && left > 0; ++i) {
      const size_t n = std::min(left, iov[i].iov_len);
      cut.push_back({iov[i].iov_base, n});
      left -= n;
    }
    return real(fd, cut.data(), static_cast<int>(cut.size()), offset);
  };
  const auto tokens = make_tokens(2 * kChunk, 14);
  const Written w = write_through(dir.root, io, tokens, 2);
  EXPECT_EQ(w.stats.writes_done, 2U);
  EXPECT_EQ(w.stats.errors, 0U);
  EXPECT_EQ(w.stats.dropped_writes, 0U);
  EXPECT_EQ(calls->load(), static_cast<int>(2 * ((kFileBytes + 99) / 100)));

  const Read r = read_through(dir.root, DiskIo::system(), tokens);
  expect_prefix(r.got, tokens, 2 * kChunk);
  EXPECT_EQ(r.stats.hits, 2U);
}

TEST(DiskFaults, AShortWriteThenDiskFullDropsTheWriteAndItsTempFile) {
  const TempDir dir;
  DiskIo io = DiskIo::system();
  auto calls = std::make_shared<std::atomic<int>>(0);
  // The first call writes half the file, the second finds the disk full.
  io.pwritev = [calls, real = io.pwritev](int fd, const iovec* iov, int count, off_t offset) {
    if (++*calls == 2) {
      errno = ENOSPC;
      return ssize_t{-1};
    }
    const iovec half{iov[0].iov_base, std::min<size_t>(iov[0].iov_len, kFileBytes / 2)};
    return count > 0 && *calls == 1 ? real(fd, &half, 1, offset) : real(fd, iov, count, offset);
  };
  const auto tokens = make_tokens(2 * kChunk, 15);
  const Written w = write_through(dir.root, io, tokens, 2);
  EXPECT_EQ(w.stats.writes_done, 1U);  // the second value, after the fault
  EXPECT_EQ(w.stats.dropped_writes, 1U);
  EXPECT_EQ(w.stats.errors, 1U);
  EXPECT_EQ(count_of(w.log, std::strerror(ENOSPC)), 1U) << w.log;
  EXPECT_EQ(names_in(dir.root).size(), 1U);  // the half-written temp file removed

  const Read r = read_through(dir.root, DiskIo::system(), tokens);
  EXPECT_FALSE(r.got.has_value());
  EXPECT_EQ(r.stats.hits, 1U);
  EXPECT_EQ(r.stats.misses, 1U);
  EXPECT_EQ(r.stats.corrupt_values, 0U);
}

/// pread that fails with `err` on files opened for the (1-based) open-for-read numbers in
/// `failing`.
DiskIo failing_reads(std::set<int> failing, int err) {
  DiskIo io = DiskIo::system();
  struct State {
    std::mutex mutex;
    int opens = 0;
    std::set<int> bad_fds;
  };
  auto state = std::make_shared<State>();
  io.open = [state, failing, real = io.open](const char* path, int flags, mode_t mode) {
    const int fd = real(path, flags, mode);
    if (fd >= 0 && (flags & O_ACCMODE) == O_RDONLY) {
      std::lock_guard lock(state->mutex);
      if (failing.contains(++state->opens)) state->bad_fds.insert(fd);
    }
    return fd;
  };
  io.close = [state, real = io.close](int fd) {
    {
      std::lock_guard lock(state->mutex);
      state->bad_fds.erase(fd);
    }
    return real(fd);
  };
  io.pread = [state, err, real = io.pread](int fd, void* out, size_t size, off_t offset) {
    {
      std::lock_guard lock(state->mutex);
      if (state->bad_fds.contains(fd)) {
        errno = err;
        return ssize_t{-1};
      }
    }
    return real(fd, out, size, offset);
  };
  return io;
}

void eio_on_one_read(bool direct_reads) {
  const TempDir dir;
  const auto tokens = make_tokens(3 * kChunk, 16);
  const Written w = write_through(dir.root, DiskIo::system(), tokens, 3);
  ASSERT_EQ(w.stats.writes_done, 3U);

  // Chunk 1's read fails: the prefix stops before it; chunk 2 is still read and promoted.
  const Read r = read_through(dir.root, failing_reads({2}, EIO), tokens, direct_reads);
  expect_prefix(r.got, tokens, kChunk);
  EXPECT_EQ(r.stats.hits, 2U);
  EXPECT_EQ(r.stats.misses, 1U);
  EXPECT_EQ(r.stats.errors, 1U);
  EXPECT_EQ(r.stats.corrupt_values, 0U);
  EXPECT_EQ(r.stats.bytes_read, 2 * kPayload);
  EXPECT_EQ(r.stats.entries_held, 2U);  // the unreadable file forgotten
  EXPECT_EQ(count_of(r.log, std::strerror(EIO)), 1U) << r.log;
  EXPECT_EQ(names_in(dir.root).size(), 2U);  // and deleted: never asked again

  const Read again = read_through(dir.root, DiskIo::system(), tokens, direct_reads);
  expect_prefix(again.got, tokens, kChunk);
  EXPECT_EQ(again.stats.hits, 2U);
  EXPECT_EQ(again.stats.misses, 1U);
  EXPECT_EQ(again.stats.errors, 0U);  // chunk 1 is known absent: no file opened
}

TEST(DiskFaults, EioOnReadAfterASuccessfulWriteIsAMissAndTheFileIsDeleted) {
  eio_on_one_read(/*direct_reads=*/true);
}

TEST(DiskFaults, EioOnABufferedReadAheadReadIsAMissAndTheFileIsDeleted) {
  eio_on_one_read(/*direct_reads=*/false);
}

TEST(DiskFaults, BufferedReadsStartTheNextFilesAheadAndServeBitExact) {
  const TempDir dir;
  const auto tokens = make_tokens(8 * kChunk, 23);
  ASSERT_EQ(write_through(dir.root, DiskIo::system(), tokens, 8).stats.writes_done, 8U);
  DiskIo io = DiskIo::system();
  struct Seen {
    std::mutex mutex;
    int opens = 0;
    std::vector<int> opens_at_read;  // read-only opens done when each file's first pread ran
    std::set<int> read_fds;
  };
  auto seen = std::make_shared<Seen>();
  io.open = [seen, real = io.open](const char* path, int flags, mode_t mode) {
    const int fd = real(path, flags, mode);
    if (fd >= 0 && (flags & O_ACCMODE) == O_RDONLY) {
      std::lock_guard lock(seen->mutex);
      ++seen->opens;
    }
    return fd;
  };
  io.pread = [seen, real = io.pread](int fd, void* out, size_t size, off_t offset) {
    {
      std::lock_guard lock(seen->mutex);
      if (offset == 0) seen->opens_at_read.push_back(seen->opens);
    }
    return real(fd, out, size, offset);
  };
  const Read r = read_through(dir.root, io, tokens, /*direct_reads=*/false);
  expect_prefix(r.got, tokens, 8 * kChunk);
  EXPECT_EQ(r.stats.hits, 8U);
  EXPECT_FALSE(r.direct);
  EXPECT_EQ(r.stats.read_mode, "buffered");  // direct reads off in the options
  // Four files ahead of the one read (the default read_ahead_files), fewer at the end.
  EXPECT_EQ(seen->opens_at_read, (std::vector<int>{5, 6, 7, 8, 8, 8, 8, 8}));
}

TEST(DiskFaults, EioOnEveryReadMissesEverythingLoggedOnce) {
  const TempDir dir;
  const auto tokens = make_tokens(3 * kChunk, 17);
  ASSERT_EQ(write_through(dir.root, DiskIo::system(), tokens, 3).stats.writes_done, 3U);
  const Read r = read_through(dir.root, failing_reads({1, 2, 3}, EIO), tokens);
  EXPECT_FALSE(r.got.has_value());
  EXPECT_EQ(r.stats.hits, 0U);
  EXPECT_EQ(r.stats.misses, 3U);
  EXPECT_EQ(r.stats.errors, 3U);
  EXPECT_EQ(r.stats.bytes_read, 0U);
  EXPECT_EQ(count_of(r.log, std::strerror(EIO)), 1U) << r.log;
  EXPECT_TRUE(names_in(dir.root).empty());
}

TEST(DiskFaults, ShortReadsAreResumedAndTheValuesAreBitExact) {
  const TempDir dir;
  const auto tokens = make_tokens(2 * kChunk, 18);
  ASSERT_EQ(write_through(dir.root, DiskIo::system(), tokens, 2).stats.writes_done, 2U);
  DiskIo io = DiskIo::system();
  auto calls = std::make_shared<std::atomic<int>>(0);
  io.pread = [calls, real = io.pread](int fd, void* out, size_t size, off_t offset) {
    ++*calls;
    return real(fd, out, std::min<size_t>(size, 100), offset);
  };
  // Buffered: a short O_DIRECT read leaves an unaligned offset (covered by the EINVAL test).
  const Read r = read_through(dir.root, io, tokens, /*direct_reads=*/false);
  expect_prefix(r.got, tokens, 2 * kChunk);
  EXPECT_EQ(r.stats.hits, 2U);
  EXPECT_EQ(r.stats.errors, 0U);
  EXPECT_EQ(calls->load(), static_cast<int>(2 * ((kFileBytes + 99) / 100)));
}

TEST(DiskFaults, BytesCorruptedByTheDeviceAreACorruptMissNeverServed) {
  const TempDir dir;
  const auto tokens = make_tokens(2 * kChunk, 19);
  ASSERT_EQ(write_through(dir.root, DiskIo::system(), tokens, 2).stats.writes_done, 2U);
  DiskIo io = DiskIo::system();
  auto calls = std::make_shared<std::atomic<int>>(0);
  // The second file read comes back with one payload bit flipped.
  io.pread = [calls, real = io.pread](int fd, void* out, size_t size, off_t offset) {
    const ssize_t n = real(fd, out, size, offset);
    if (++*calls == 2 && n > 100) static_cast<unsigned char*>(out)[100] ^= 0x10;
    return n;
  };
  const Read r = read_through(dir.root, io, tokens);
  expect_prefix(r.got, tokens, kChunk);
  EXPECT_EQ(r.stats.hits, 1U);
  EXPECT_EQ(r.stats.misses, 1U);
  EXPECT_EQ(r.stats.corrupt_values, 1U);
  EXPECT_EQ(r.stats.errors, 0U);
  EXPECT_EQ(r.stats.entries_held, 1U);
}

/// Counts reads opened with and without O_DIRECT; opens with O_DIRECT fail with EINVAL when
/// `refuse_open`, their preads when `refuse_read`.
struct DirectIo {
  DiskIo io = DiskIo::system();
  std::shared_ptr<std::atomic<int>> direct_opens = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> buffered_opens = std::make_shared<std::atomic<int>>(0);
  DirectIo(bool refuse_open, bool refuse_read) {
    auto direct_fds = std::make_shared<std::set<int>>();
    auto mutex = std::make_shared<std::mutex>();
    io.open = [=, direct = direct_opens, buffered = buffered_opens, real = io.open](
                  const char* path, int flags, mode_t mode) {
      const bool is_direct = (flags & O_DIRECT) != 0;
      if (is_direct && refuse_open) {
        errno = EINVAL;
        return -1;
      }
      const int fd = real(path, flags, mode);
      if (fd >= 0 && (flags & O_ACCMODE) == O_RDONLY) {
        ++*(is_direct ? direct : buffered);
        std::lock_guard lock(*mutex);
        if (is_direct) direct_fds->insert(fd);
      }
      return fd;
    };
    io.close = [=, real = io.close](int fd) {
      {
        std::lock_guard lock(*mutex);
        direct_fds->erase(fd);
      }
      return real(fd);
    };
    io.pread = [=, real = io.pread](int fd, void* out, size_t size, off_t offset) {
      {
        std::lock_guard lock(*mutex);
        if (refuse_read && direct_fds->contains(fd)) {
          errno = EINVAL;
          return ssize_t{-1};
        }
      }
      return real(fd, out, size, offset);
    };
  }
};

TEST(DiskFaults, ReadsUseODirectWhereTheDirectoryTakesItBitExact) {
  const TempDir dir;
  const auto tokens = make_tokens(3 * kChunk, 20);
  ASSERT_EQ(write_through(dir.root, DiskIo::system(), tokens, 3).stats.writes_done, 3U);
  const DirectIo direct(false, false);
  const Read r = read_through(dir.root, direct.io, tokens);
  if (!r.direct) GTEST_SKIP() << dir.root << " does not take O_DIRECT (tmpfs?)";
  expect_prefix(r.got, tokens, 3 * kChunk);
  EXPECT_EQ(r.stats.hits, 3U);
  EXPECT_EQ(r.stats.read_mode, "direct");
  EXPECT_EQ(direct.direct_opens->load(), 3);
  EXPECT_EQ(direct.buffered_opens->load(), 0);
}

TEST(DiskFaults, ODirectRefusedAtOpenFallsBackToBufferedReadsLoggedOnce) {
  const TempDir dir;
  const auto tokens = make_tokens(3 * kChunk, 21);
  ASSERT_EQ(write_through(dir.root, DiskIo::system(), tokens, 3).stats.writes_done, 3U);
  const DirectIo refused(true, false);  // as tmpfs answers
  const Read r = read_through(dir.root, refused.io, tokens);
  EXPECT_FALSE(r.direct);  // the construction's probe saw EINVAL
  EXPECT_EQ(r.stats.read_mode, "buffered");
  expect_prefix(r.got, tokens, 3 * kChunk);
  EXPECT_EQ(r.stats.hits, 3U);
  EXPECT_EQ(r.stats.errors, 0U);
  EXPECT_EQ(refused.buffered_opens->load(), 3);
  EXPECT_EQ(count_of(r.log, "does not take O_DIRECT"), 1U) << r.log;
}

TEST(DiskFaults, ODirectRefusedAtReadFallsBackOnceAndServesBitExact) {
  const TempDir dir;
  const auto tokens = make_tokens(3 * kChunk, 22);
  ASSERT_EQ(write_through(dir.root, DiskIo::system(), tokens, 3).stats.writes_done, 3U);
  const DirectIo refused(false, true);  // opens succeed, the device refuses the alignment
  const Read r = read_through(dir.root, refused.io, tokens);
  if (refused.direct_opens->load() == 0) GTEST_SKIP() << dir.root << " does not take O_DIRECT";
  EXPECT_FALSE(r.direct);
  EXPECT_EQ(r.stats.read_mode, "buffered");  // from the refused read on
  expect_prefix(r.got, tokens, 3 * kChunk);
  EXPECT_EQ(r.stats.hits, 3U);
  EXPECT_EQ(r.stats.errors, 0U);
  EXPECT_EQ(refused.direct_opens->load(), 1);    // the first read, refused
  EXPECT_EQ(refused.buffered_opens->load(), 3);  // it again, then the other two
  EXPECT_EQ(count_of(r.log, "O_DIRECT read"), 1U) << r.log;
}

// Several O_DIRECT reads in flight (the read pipeline: files read while the ones before are
// checked and handed over): two unreadable files among twelve are two counted misses, the rest
// bit-exact. With one reader the files open in prefix order, so the 4th and 9th opens are
// chunks 3 and 8; with four, which two fail is up to the scheduler, and the prefix ends at the
// first of them.
class PipelinedEio : public testing::TestWithParam<int> {};

TEST_P(PipelinedEio, TwoOfTwelveReadsFailingMissThoseTwoTheRestServedBitExact) {
  const TempDir dir;
  const auto tokens = make_tokens(12 * kChunk, 23);
  ASSERT_EQ(write_through(dir.root, DiskIo::system(), tokens, 12).stats.writes_done, 12U);
  const int readers = GetParam();
  const Read r = read_through(dir.root, failing_reads({4, 9}, EIO), tokens, true, readers);
  if (!r.direct) GTEST_SKIP() << dir.root << " does not take O_DIRECT (tmpfs?)";
  ASSERT_TRUE(r.got.has_value());
  ASSERT_EQ(r.got->rows() % kChunk, 0);
  ASSERT_LT(r.got->rows(), 12 * kChunk);
  if (readers == 1) {
    EXPECT_EQ(r.got->rows(), 3 * kChunk);  // it stops before chunk 3
  }
  expect_prefix(r.got, tokens, r.got->rows());
  EXPECT_EQ(r.stats.hits, 10U);  // the others read and promoted all the same
  EXPECT_EQ(r.stats.misses, 2U);
  EXPECT_EQ(r.stats.errors, 2U);
  EXPECT_EQ(r.stats.bytes_read, 10 * kPayload);
  EXPECT_EQ(count_of(r.log, std::strerror(EIO)), 1U) << r.log;
  EXPECT_EQ(names_in(dir.root).size(), 10U);

  // The two files are gone; a fresh store serves the same prefix and asks for them no more.
  const Read again = read_through(dir.root, DiskIo::system(), tokens, true, readers);
  expect_prefix(again.got, tokens, r.got->rows());
  EXPECT_EQ(again.stats.hits, 10U);
  EXPECT_EQ(again.stats.errors, 0U);
}

INSTANTIATE_TEST_SUITE_P(Readers, PipelinedEio, testing::Values(1, 4));

/// `count` float32 chunks written straight into `tier` and flushed: the requests that ask for
/// them and the values (value i all `i + offset`).
struct WrittenValues {
  std::vector<detail::TierRequest> requests;
  std::vector<std::vector<float>> values;
};

WrittenValues write_values(DiskTier& tier, size_t count, uint64_t first_hash, float offset) {
  WrittenValues w;
  for (size_t i = 0; i < count; ++i) {
    CacheEngineKey key;
    key.model_name = "direct";
    key.chunk_hash = first_hash + i;
    w.requests.push_back({key, Slot{ActivationKind::kHidden, 0}, kChunk, kCols});
    w.values.emplace_back(static_cast<size_t>(kChunk * kCols), static_cast<float>(i) + offset);
    const std::span<const std::byte> bytes = std::as_bytes(std::span(w.values.back()));
    EXPECT_TRUE(tier.enqueue_write({key, w.requests.back().slot,
                                    detail::RowFormat::of(kernels::ElemType::kFloat32), kChunk,
                                    kCols},
                                   std::span(&bytes, 1)));
  }
  tier.flush();
  EXPECT_EQ(tier.stats().writes_done, count);
  return w;
}

// A callback that throws in the middle of a pipelined fetch: the exception reaches the caller,
// no reader thread is left behind, the counters hold what was handed over, and the next fetch
// serves every value.
TEST(DiskFaults, ACallbackThrowingMidFetchLeavesTheTierWhole) {
  const TempDir dir;
  detail::DiskTierOptions o;
  o.dir = dir.root;
  o.budget_bytes = 1ULL << 30;
  o.queue_bytes = 16ULL << 20;
  o.writer_threads = 1;
  DiskTier tier(std::move(o));
  if (!tier.direct_reads()) GTEST_SKIP() << dir.root << " does not take O_DIRECT (tmpfs?)";
  constexpr size_t kValues = 8;
  const WrittenValues written = write_values(tier, kValues, 0x1000, 0.5F);
  const std::vector<detail::TierRequest>& requests = written.requests;
  const std::vector<std::vector<float>>& values = written.values;
  ASSERT_FALSE(HasFailure());

  size_t seen = 0;
  EXPECT_THROW(tier.fetch_each(requests,
                               [&](size_t, const detail::TierValue&) {
                                 if (++seen == 3) throw std::runtime_error("callback failed");
                               }),
               std::runtime_error);
  EXPECT_EQ(seen, 3U);
  EXPECT_EQ(tier.stats().hits, 3U);  // read, checked and handed over: the third failed after
  EXPECT_EQ(tier.stats().misses, kValues - 3);

  std::vector<bool> served(kValues, false);
  tier.fetch_each(requests, [&](size_t i, const detail::TierValue& v) {
    ASSERT_EQ(v.payload.size(), values[i].size() * sizeof(float));
    EXPECT_EQ(std::memcmp(v.payload.data(), values[i].data(), v.payload.size()), 0) << i;
    served[i] = true;
  });
  EXPECT_EQ(std::count(served.begin(), served.end(), true), static_cast<long>(kValues));
  EXPECT_EQ(tier.stats().errors, 0U);
}


// Reads go into the tier's kept buffers: a second fetch reads into the memory the first read
// into (no fresh pages faulted in), pipelined (O_DIRECT) or serial (buffered), also after a
// fetch that ended in an exception. The values stay bit-exact.
class KeptReadBuffers : public testing::TestWithParam<int> {};

TEST_P(KeptReadBuffers, ASecondFetchReadsIntoTheFirstFetchsMemory) {
  const TempDir dir;
  auto mutex = std::make_shared<std::mutex>();
  auto into = std::make_shared<std::vector<const void*>>();  // each file's first read, by address
  detail::DiskTierOptions o;
  o.dir = dir.root;
  o.budget_bytes = 1ULL << 30;
  o.queue_bytes = 16ULL << 20;
  o.writer_threads = 1;
  o.read_threads = GetParam();
  o.io.pread = [mutex, into](int fd, void* out, size_t size, off_t offset) {
    if (offset == 0) {
      std::lock_guard lock(*mutex);
      into->push_back(out);
    }
    return ::pread(fd, out, size, offset);
  };
  DiskTier tier(std::move(o));
  const WrittenValues written = write_values(tier, 9, 0x2000, 0.25F);
  const std::vector<detail::TierRequest>& requests = written.requests;
  const std::vector<std::vector<float>>& values = written.values;
  ASSERT_FALSE(HasFailure());

  auto fetch = [&](size_t throw_at) {
    {
      std::lock_guard lock(*mutex);
      into->clear();
    }
    size_t served = 0;
    try {
      tier.fetch_each(requests, [&](size_t i, const detail::TierValue& v) {
        if (served == throw_at) throw std::runtime_error("callback failed");
        EXPECT_EQ(std::memcmp(v.payload.data(), values[i].data(), v.payload.size()), 0) << i;
        ++served;
      });
    } catch (const std::runtime_error&) {
      EXPECT_EQ(served, throw_at);
    }
    std::lock_guard lock(*mutex);
    return std::set<const void*>(into->begin(), into->end());
  };
  EXPECT_EQ(tier.read_buffers_kept(), 0U);
  // Pipelined: one buffer per slot (readers + 1), kept after the fetch; serial: one.
  const size_t buffers = tier.direct_reads() ? static_cast<size_t>(GetParam()) + 1 : 1U;
  const std::set<const void*> first = fetch(SIZE_MAX);
  EXPECT_LE(first.size(), buffers);
  EXPECT_EQ(tier.read_buffers_kept(), buffers);
  const std::set<const void*> failed = fetch(4);
  EXPECT_EQ(tier.read_buffers_kept(), buffers);  // given back by the exception's unwinding
  const std::set<const void*> again = fetch(SIZE_MAX);
  EXPECT_EQ(tier.read_buffers_kept(), buffers);
  EXPECT_TRUE(std::includes(first.begin(), first.end(), failed.begin(), failed.end()));
  EXPECT_TRUE(std::includes(first.begin(), first.end(), again.begin(), again.end()));
  EXPECT_EQ(tier.stats().errors, 0U);
  EXPECT_EQ(tier.stats().corrupt_values, 0U);
}

INSTANTIATE_TEST_SUITE_P(Readers, KeptReadBuffers, testing::Values(1, 3));

}  // namespace
}  // namespace hss
