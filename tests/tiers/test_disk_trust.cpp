// The disk tier against its directory (src/tiers/disk/disk_tier.hpp, "Trust"; docs/design.md,
// "Threat model"): private modes, a directory of another user or writable by others refused, a
// symlink or FIFO planted in a value's place never followed nor waited on, one store per
// directory, and no file system call under the index lock. Tests that chown need root (skipped
// otherwise).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "hss/error.hpp"
#include "tier_test_dir.hpp"
#include "tiers/disk/disk_tier.hpp"

namespace hss {
namespace {

namespace fs = std::filesystem;
using detail::DiskIo;
using detail::DiskTier;
using detail::DiskTierOptions;
using detail::TierRequest;
using detail::TierValue;
using detail::TierWrite;
using test::TempDir;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;
constexpr uint64_t kFileBytes = 32 + kChunk * kCols * 4;  // header + one float32 chunk
/// How long a test waits for a blocked call before it unblocks it itself and fails: a deadline
/// for a hang, never a speed asserted.
constexpr auto kHangDeadline = std::chrono::seconds(10);

DiskTierOptions options(const std::string& dir, DiskIo io = DiskIo::system()) {
  DiskTierOptions o;
  o.dir = dir;
  o.budget_bytes = 1ULL << 20;
  o.queue_bytes = 1ULL << 20;
  o.writer_threads = 1;
  o.io = std::move(io);
  return o;
}

TierWrite write_of(uint64_t hash) {
  TierWrite w;
  w.key.chunk_hash = hash;
  w.rows = kChunk;
  w.cols = kCols;
  return w;
}

TierRequest request_of(uint64_t hash) {
  TierRequest r;
  r.key.chunk_hash = hash;
  r.rows = kChunk;
  r.cols = kCols;
  return r;
}

std::vector<float> rows_of(uint64_t hash) {
  std::vector<float> rows(kChunk * kCols);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(hash * 1000 + i);
  return rows;
}

void write_value(DiskTier& tier, uint64_t hash) {
  const std::vector<float> rows = rows_of(hash);
  const std::span<const std::byte> bytes = std::as_bytes(std::span(rows));
  const std::span<const std::byte> pieces[] = {bytes};
  ASSERT_TRUE(tier.enqueue_write(write_of(hash), pieces));
}

std::string value_path(const std::string& dir, uint64_t hash) {
  return dir + "/" + DiskTier::file_name(write_of(hash).key, write_of(hash).slot);
}

/// The hits of one fetch of `hash`, each checked against its rows.
int fetch_hits(DiskTier& tier, uint64_t hash) {
  const TierRequest asked[] = {request_of(hash)};
  int hits = 0;
  const std::vector<float> rows = rows_of(hash);
  tier.fetch_each(asked, [&](size_t, const TierValue& v) {
    ++hits;
    EXPECT_EQ(v.payload.size(), rows.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(v.payload.data(), rows.data(), v.payload.size()), 0);
  });
  return hits;
}

mode_t mode_of(const std::string& path) {
  struct stat st{};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(DiskTrust, TheDirectoryIsMode0700AndItsValueFiles0600) {
  const TempDir dir;
  const std::string values = dir.root + "/a/b";  // parents made by the tier too
  const mode_t umask_was = ::umask(022);
  {
    DiskTier tier(options(values));
    write_value(tier, 1);
    tier.flush();
  }
  ::umask(umask_was);
  EXPECT_EQ(mode_of(dir.root + "/a"), 0700U);
  EXPECT_EQ(mode_of(values), 0700U);
  EXPECT_EQ(mode_of(value_path(values, 1)), 0600U);
}

TEST(DiskTrust, OurDirectoryOpenToOthersIsMadePrivateWithItsFiles) {
  const TempDir dir;
  const std::string values = dir.values();
  {
    DiskTier tier(options(values));
    write_value(tier, 1);
  }
  ASSERT_EQ(::chmod(values.c_str(), 0755), 0);  // what an older build left
  ASSERT_EQ(::chmod(value_path(values, 1).c_str(), 0644), 0);
  DiskTier tier(options(values));
  EXPECT_EQ(mode_of(values), 0700U);
  EXPECT_EQ(mode_of(value_path(values, 1)), 0600U);
  EXPECT_EQ(fetch_hits(tier, 1), 1);
}

TEST(DiskTrust, ADirectoryOwnedByAnotherUserIsAConfigErrorNamingIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown a directory to another user";
  const TempDir dir;
  const std::string values = dir.values();
  fs::create_directories(values);
  ASSERT_EQ(::chmod(values.c_str(), 0700), 0);
  ASSERT_EQ(::chown(values.c_str(), 65534, 65534), 0);  // nobody's
  try {
    DiskTier tier(options(values));
    FAIL() << "a directory of uid 65534 was used";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(values), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("uid 65534"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(values));  // nothing scanned, deleted or created there
}

TEST(DiskTrust, ADirectoryWritableByOthersIsAConfigErrorNamingIt) {
  const TempDir dir;
  const std::string values = dir.values();
  fs::create_directories(values);
  ASSERT_EQ(::chmod(values.c_str(), 0777), 0);
  std::ofstream(values + "/planted.tmp.1.1") << "not ours to delete";
  try {
    DiskTier tier(options(values));
    FAIL() << "a directory of mode 0777 was used";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(values), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("writable by others"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(values + "/planted.tmp.1.1"));
  EXPECT_EQ(mode_of(values), 0777U);  // left as it was
}

TEST(DiskTrust, ASymlinkAsTheDirectoryIsAConfigError) {
  const TempDir dir;
  fs::create_directories(dir.root + "/elsewhere");
  fs::create_directory_symlink(dir.root + "/elsewhere", dir.values());
  EXPECT_THROW(DiskTier tier(options(dir.values())), ConfigError);
}

TEST(DiskTrust, ASymlinkInAValuesPlaceIsACorruptMissNeverFollowed) {
  const TempDir dir;
  const std::string values = dir.values();
  DiskTier tier(options(values));
  write_value(tier, 1);
  tier.flush();
  // A valid value for the key, outside the directory, linked in the value's place.
  const std::string outside = dir.root + "/outside.hsv";
  fs::copy_file(value_path(values, 1), outside);
  fs::remove(value_path(values, 1));
  fs::create_symlink(outside, value_path(values, 1));
  EXPECT_EQ(fetch_hits(tier, 1), 0);
  const TierStats s = tier.stats();
  EXPECT_EQ(s.hits, 0U);
  EXPECT_EQ(s.corrupt_values, 1U);
  EXPECT_EQ(s.entries_held, 0U);
  EXPECT_FALSE(fs::exists(fs::symlink_status(value_path(values, 1))));  // the link deleted
  EXPECT_TRUE(fs::exists(outside));  // its target left alone
}

/// Whether a file in `dir` opens with O_DIRECT (the tier's reads are direct there).
bool takes_direct(const std::string& dir) {
  const std::string probe = dir + "/.direct-check";
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

TEST(DiskTrust, AFifoInAValuesPlaceIsACorruptMissWithoutWaitingAndReadsStayDirect) {
  const TempDir dir;
  const std::string values = dir.values();
  DiskTier tier(options(values));
  const bool direct = tier.direct_reads();
  ASSERT_EQ(direct, takes_direct(values));
  write_value(tier, 1);
  tier.flush();
  const std::string fifo = value_path(values, 1);
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto fetched = std::async(std::launch::async, [&] { return fetch_hits(tier, 1); });
  bool waited_for_a_writer = false;
  if (fetched.wait_for(kHangDeadline) != std::future_status::ready) {
    // The read blocks in open(): give it writers (each open ends one blocked open) to end the
    // test.
    waited_for_a_writer = true;
    while (fetched.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (writer >= 0) ::close(writer);
    }
  }
  EXPECT_EQ(fetched.get(), 0);
  EXPECT_FALSE(waited_for_a_writer);
  const TierStats s = tier.stats();
  EXPECT_EQ(s.corrupt_values, 1U);
  EXPECT_EQ(s.errors, 0U);
  EXPECT_EQ(tier.direct_reads(), direct);  // a FIFO is no reason to stop O_DIRECT
  EXPECT_FALSE(fs::exists(fs::symlink_status(fifo)));
}

TEST(DiskTrust, ASecondStoreOnTheDirectoryRunsWithoutTheTierCounted) {
  const TempDir dir;
  const std::string values = dir.values();
  DiskTier first(options(values));
  write_value(first, 1);
  first.flush();
  // A write of the first store in flight: its temp file must survive the second's start.
  const std::string in_flight = value_path(values, 2) + ".tmp.1.1";
  std::ofstream(in_flight) << "half a value";
  {
    DiskTier second(options(values));
    EXPECT_FALSE(second.enabled());
    EXPECT_TRUE(fs::exists(in_flight));
    EXPECT_EQ(second.stats().entries_held, 0U);  // no second budget over the same files
    EXPECT_EQ(second.stats().errors, 1U);
    EXPECT_EQ(fetch_hits(second, 1), 0);
    const std::vector<float> rows = rows_of(3);
    const std::span<const std::byte> pieces[] = {std::as_bytes(std::span(rows))};
    EXPECT_FALSE(second.enqueue_write(write_of(3), pieces));
    EXPECT_EQ(second.stats().dropped_writes, 1U);
  }
  EXPECT_EQ(fetch_hits(first, 1), 1);
  EXPECT_TRUE(first.enabled());
}

TEST(DiskTrust, TheDirectoryIsFreeForTheNextStoreOnceTheFirstIsClosedAndItStillReads) {
  const TempDir dir;
  DiskTier first(options(dir.values()));
  write_value(first, 1);
  first.close();  // destroyed only at the end of the test, as a Python store collected later
  DiskTier next(options(dir.values()));
  EXPECT_TRUE(next.enabled());
  EXPECT_EQ(next.stats().errors, 0U);
  EXPECT_EQ(fetch_hits(next, 1), 1);
  EXPECT_EQ(fetch_hits(first, 1), 1);  // a closed tier's reads keep working
}

TEST(DiskTrust, TheDirectoryIsFreeForTheNextStoreOnceTheFirstIsGone) {
  const TempDir dir;
  {
    DiskTier first(options(dir.values()));
    write_value(first, 1);
  }
  DiskTier next(options(dir.values()));
  EXPECT_TRUE(next.enabled());
  EXPECT_EQ(fetch_hits(next, 1), 1);
}

/// A DiskIo call that hangs (here: until released, or kHangDeadline) on the file it is given.
struct Hang {
  std::mutex mutex;
  std::condition_variable cv;
  bool entered = false;
  bool released = false;
  bool released_by_deadline = false;

  void hang() {
    std::unique_lock lock(mutex);
    entered = true;
    cv.notify_all();
    if (!cv.wait_for(lock, kHangDeadline, [&] { return released; })) released_by_deadline = true;
  }
  bool wait_entered() {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, kHangDeadline, [&] { return entered; });
  }
  void release() {
    std::lock_guard lock(mutex);
    released = true;
    cv.notify_all();
  }
  bool hung_until_the_deadline() {
    std::lock_guard lock(mutex);
    return released_by_deadline;
  }
};

TEST(DiskTrust, AHungRenameDoesNotBlockContains) {
  const TempDir dir;
  auto hang = std::make_shared<Hang>();
  DiskIo io = DiskIo::system();
  io.rename = [hang, real = io.rename](const char* from, const char* to) {
    hang->hang();
    return real(from, to);
  };
  DiskTier tier(options(dir.values(), io));
  write_value(tier, 1);
  ASSERT_TRUE(hang->wait_entered());
  const TierRequest asked[] = {request_of(1)};
  EXPECT_EQ(tier.contains(asked), std::vector<bool>{false});  // answered while the rename hangs
  hang->release();
  tier.flush();
  EXPECT_FALSE(hang->hung_until_the_deadline());
  EXPECT_EQ(tier.contains(asked), std::vector<bool>{true});
}

TEST(DiskTrust, AHungUnlinkOfAnEvictedFileDoesNotBlockContains) {
  const TempDir dir;
  auto hang = std::make_shared<Hang>();
  DiskIo io = DiskIo::system();
  io.unlink = [hang, real = io.unlink](const char* path) {
    if (std::string_view(path).ends_with(".hsv")) hang->hang();  // values only, not the probe
    return real(path);
  };
  DiskTierOptions o = options(dir.values(), io);
  o.budget_bytes = kFileBytes;  // one file: the second write evicts the first
  DiskTier tier(o);
  write_value(tier, 1);
  tier.flush();
  write_value(tier, 2);
  ASSERT_TRUE(hang->wait_entered());
  const TierRequest asked[] = {request_of(1), request_of(2)};
  EXPECT_EQ(tier.contains(asked), (std::vector<bool>{false, false}));
  hang->release();
  tier.flush();
  EXPECT_FALSE(hang->hung_until_the_deadline());
  EXPECT_EQ(tier.contains(asked), (std::vector<bool>{false, true}));
  EXPECT_FALSE(fs::exists(value_path(dir.values(), 1)));
}

}  // namespace
}  // namespace hss
