#include "hss/detail/file_reader.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "hss/error.hpp"

namespace hss::detail {
namespace {

// Closes the descriptor on every path out.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  [[nodiscard]] int get() const { return fd_; }

 private:
  int fd_;
};

[[noreturn]] void fail(std::string_view what, std::string_view name, std::string_view problem) {
  throw Error(std::string(what) + " '" + std::string(name) + "' " + std::string(problem));
}

std::string errno_text(int err) { return std::strerror(err); }

std::string_view file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Reads until end of file or until more than max_bytes arrived.
std::string read_all(int fd, std::string_view what, std::string_view name, size_t max_bytes,
                     size_t size_hint) {
  std::string out;
  out.reserve(std::min(size_hint, max_bytes) + 1);
  char buf[64 * 1024];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(what, name, "could not be read: " + errno_text(errno));
    }
    if (n == 0) return out;
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      fail(what, name, "is larger than the limit of " + std::to_string(max_bytes) + " bytes");
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

std::string read_regular_file(const std::filesystem::path& path, std::string_view what,
                              size_t max_bytes) {
  const std::string name = path.string();
  // O_NONBLOCK: opening a FIFO without a writer must not hang; fstat below refuses it anyway.
  const FileDescriptor fd(::open(name.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0) {
    const int err = errno;
    if (err == ENOENT) fail(what, name, "does not exist");
    fail(what, name, "cannot be opened for reading: " + errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(what, name, "cannot be examined: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) {
    fail(what, name, "is " + std::string(file_kind(st.st_mode)) + ", not a regular file");
  }
  // /proc and /sys files claim to be regular but report size 0 and produce whatever the kernel
  // generates (/proc/self/mem is the process's memory): not input files.
  struct statfs fs {};
  if (::fstatfs(fd.get(), &fs) == 0 &&
      (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC)) {
    fail(what, name, "is on a pseudo filesystem (/proc or /sys), not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    fail(what, name,
         "is " + std::to_string(st.st_size) + " bytes, larger than the limit of " +
             std::to_string(max_bytes) + " bytes");
  }
  return read_all(fd.get(), what, name, max_bytes, static_cast<size_t>(st.st_size));
}

std::string read_stream_fd(int fd, std::string_view what, size_t max_bytes) {
  return read_all(fd, what, "(descriptor " + std::to_string(fd) + ")", max_bytes, 0);
}

}  // namespace hss::detail
