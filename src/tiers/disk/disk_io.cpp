#include "tiers/disk/disk_io.hpp"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>

namespace hss::detail {

DiskIo DiskIo::system() {
  DiskIo io;
  io.open = [](const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); };
  io.pwritev = [](int fd, const iovec* iov, int count, off_t offset) {
    return ::pwritev(fd, iov, count, offset);
  };
  io.pread = [](int fd, void* out, size_t size, off_t offset) {
    return ::pread(fd, out, size, offset);
  };
  io.close = [](int fd) { return ::close(fd); };
  io.rename = [](const char* from, const char* to) { return ::rename(from, to); };
  io.unlink = [](const char* path) { return ::unlink(path); };
  return io;
}

bool write_all(const DiskIo& io, int fd, std::vector<iovec> iov) {
  off_t offset = 0;
  size_t i = 0;
  while (i < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - i, IOV_MAX));
    const ssize_t wrote = io.pwritev(fd, &iov[i], count, offset);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (wrote == 0) {
      errno = EIO;
      return false;
    }
    offset += wrote;
    auto left = static_cast<size_t>(wrote);
    while (i < iov.size() && left >= iov[i].iov_len) left -= iov[i++].iov_len;
    if (left > 0) {
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
  return true;
}

ssize_t read_all(const DiskIo& io, int fd, std::byte* out, size_t capacity, size_t want) {
  size_t got = 0;
  while (got < want && got < capacity) {
    const ssize_t n = io.pread(fd, out + got, capacity - got, static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(got);
}

FileRead read_open_file(const DiskIo& io, int fd, bool direct, uint64_t expected,
                        uint64_t limit, AlignedBuffer& buffer) {
  FileRead r;
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    r = {ReadOutcome::kFailed, 0, errno, "fstat"};
  } else if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != expected) {
    r.outcome = ReadOutcome::kRejected;  // a FIFO, a device, or a file changed behind the index
  } else if (static_cast<uint64_t>(st.st_size) > limit) {
    r.outcome = ReadOutcome::kTooLarge;
  } else {
    const auto size = static_cast<size_t>(st.st_size);
    const size_t capacity = direct ? round_up_direct(size) : size;
    std::byte* out = nullptr;
    try {
      out = buffer.reserve(capacity);
    } catch (...) {
      (void)io.close(fd);
      throw;
    }
    const ssize_t n = read_all(io, fd, out, capacity, size);
    if (n < 0) {
      r = {ReadOutcome::kFailed, 0, errno, "read"};
    } else {
      r.got = static_cast<size_t>(n);
    }
  }
  if (!direct && r.outcome != ReadOutcome::kRejected) {
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  (void)io.close(fd);
  return r;
}

int open_ahead(const DiskIo& io, const std::string& file) {
  const int fd = io.open(file.c_str(), kValueReadFlags, 0);
  if (fd >= 0) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
  return fd;
}

std::byte* AlignedBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_ && data_) return data_.get();
  const size_t need = std::max<size_t>(bytes, 1);
  if (need > std::numeric_limits<size_t>::max() - 2 * kHugePageBytes) throw std::bad_alloc();
  if (need >= kHugePageBytes) {
    // Not rounded up to whole huge pages: a value's file is 4 KiB past its rows' 4 MiB, and that
    // tail takes a 4 KiB page, not a third huge page (2 MiB more per buffer kept).
    const size_t size = round_up_direct(need);
    auto* p = static_cast<std::byte*>(map_huge_pages(size));
    if (p == nullptr) throw std::bad_alloc();
    data_ = std::unique_ptr<std::byte, AlignedBufferFree>(p, AlignedBufferFree{size});
    capacity_ = size;
    return p;
  }
  const size_t size = round_up_direct(need);
  void* p = std::aligned_alloc(kDirectAlign, size);
  if (p == nullptr) throw std::bad_alloc();
  data_ = std::unique_ptr<std::byte, AlignedBufferFree>(static_cast<std::byte*>(p), AlignedBufferFree{0});
  capacity_ = size;
  return data_.get();
}

void AlignedBufferFree::operator()(std::byte* p) const noexcept {
  if (mapped != 0) {
    unmap_huge_pages(p, mapped);
  } else {
    std::free(p);
  }
}

AlignedBufferCache::AlignedBufferCache(size_t max_kept) : max_kept_(max_kept) {
  kept_.reserve(max_kept);
}

AlignedBuffer AlignedBufferCache::take() {
  std::lock_guard lock(mutex_);
  if (kept_.empty()) return {};
  AlignedBuffer buffer = std::move(kept_.back());
  kept_.pop_back();
  return buffer;
}

void AlignedBufferCache::give_back(AlignedBuffer buffer) noexcept {
  if (buffer.data() == nullptr) return;
  std::lock_guard lock(mutex_);
  if (kept_.size() < max_kept_) kept_.push_back(std::move(buffer));  // within the capacity
}  // otherwise `buffer` is freed here, after the lock

size_t AlignedBufferCache::kept() const {
  std::lock_guard lock(mutex_);
  return kept_.size();
}

}  // namespace hss::detail
