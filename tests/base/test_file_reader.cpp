// Bounded, regular-file-only input reads (hss/detail/file_reader.hpp) and Config::from_file on
// hostile paths: a FIFO, /dev/zero, a directory and /proc/self/mem are clean errors, never a hang,
// an unbounded read or "OK".
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "hss/config.hpp"
#include "hss/detail/file_reader.hpp"
#include "hss/error.hpp"

namespace hss {
namespace {

namespace fs = std::filesystem;

// A scratch directory removed at scope exit.
class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("hss_file_reader_" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string error_of(const fs::path& path, size_t max_bytes = detail::kMaxInputFileBytes) {
  try {
    (void)detail::read_regular_file(path, "test file", max_bytes);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << text << "' lacks '" << part << "'";
}

TEST(FileReader, ReadsARegularFile) {
  TempDir dir;
  const fs::path file = dir.path() / "a.txt";
  std::ofstream(file) << "1 2 3\n";
  EXPECT_EQ(detail::read_regular_file(file, "test file"), "1 2 3\n");
  std::ofstream(dir.path() / "empty.txt").flush();
  EXPECT_EQ(detail::read_regular_file(dir.path() / "empty.txt", "test file"), "");
}

TEST(FileReader, RefusesAFifoWithoutBlocking) {
  TempDir dir;
  const fs::path fifo = dir.path() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string msg = error_of(fifo);  // no writer: a blocking open would hang here
  expect_contains(msg, fifo.string());
  expect_contains(msg, "FIFO");
  EXPECT_THROW((void)Config::from_file(fifo), ConfigError);
}

TEST(FileReader, RefusesDevicesDirectoriesAndProcFiles) {
  expect_contains(error_of("/dev/zero"), "character device");
  expect_contains(error_of("/dev/null"), "character device");
  TempDir dir;
  expect_contains(error_of(dir.path()), "directory");
  expect_contains(error_of("/proc/self/mem"), "pseudo filesystem");
  expect_contains(error_of("/proc/self/status"), "pseudo filesystem");
  expect_contains(error_of(dir.path() / "missing"), "does not exist");
  for (const char* path : {"/dev/zero", "/proc/self/mem"}) {
    try {
      (void)Config::from_file(path);
      ADD_FAILURE() << path << " accepted";
    } catch (const ConfigError& e) {
      expect_contains(e.what(), path);
    }
  }
  EXPECT_THROW((void)Config::from_file(dir.path()), ConfigError);
}

TEST(FileReader, EnforcesTheSizeLimit) {
  TempDir dir;
  const fs::path file = dir.path() / "big.txt";
  std::ofstream(file) << std::string(1000, 'x');
  expect_contains(error_of(file, 999), "larger than the limit of 999 bytes");
  EXPECT_EQ(detail::read_regular_file(file, "test file", 1000).size(), 1000u);
  EXPECT_EQ(detail::kMaxInputFileBytes, size_t{64} << 20);
}

TEST(FileReader, UnreadableFileIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  TempDir dir;
  const fs::path file = dir.path() / "secret.txt";
  std::ofstream(file) << "x";
  ASSERT_EQ(::chmod(file.c_str(), 0), 0);
  expect_contains(error_of(file), "cannot be opened for reading");
}

TEST(FileReader, StreamReadIsBounded) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], "abcdef", 6), 6);
  ::close(fds[1]);
  EXPECT_THROW((void)detail::read_stream_fd(fds[0], "pipe", 5), Error);
  ::close(fds[0]);
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], "abc", 3), 3);
  ::close(fds[1]);
  EXPECT_EQ(detail::read_stream_fd(fds[0], "pipe", 5), "abc");
  ::close(fds[0]);
}

}  // namespace
}  // namespace hss
