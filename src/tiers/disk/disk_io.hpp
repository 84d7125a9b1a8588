#pragma once
// The disk tier's I/O seam: the six system calls a value's file goes through (open, pwritev,
// pread, close, rename, unlink), as a struct of functions that DiskTierOptions carries.
// DiskIo::system() calls the kernel; a test replaces one member to inject ENOSPC, EIO, short
// transfers or a call that hangs (tests/tiers/test_disk_faults.cpp). Each call through it is one
// indirect call beside a system call, nothing on the store's thread. Directory calls (the scan at
// start, mkdir) stay direct: they are not on a value's path.
//
// Also here: the loops that make a whole transfer of several short ones (write_all, read_all),
// and the aligned buffer that O_DIRECT reads need.
//
// Thread safety: the members are called from the tier's writer threads and from any thread
// that fetches, at once; a replacement must be safe for that. AlignedBuffer is not shared;
// AlignedBufferCache is (below).

#include <fcntl.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/huge_pages.hpp"

namespace hss::detail {

struct DiskIo {
  std::function<int(const char* path, int flags, mode_t mode)> open;
  std::function<ssize_t(int fd, const iovec* iov, int count, off_t offset)> pwritev;
  std::function<ssize_t(int fd, void* out, size_t size, off_t offset)> pread;
  std::function<int(int fd)> close;
  std::function<int(const char* from, const char* to)> rename;
  std::function<int(const char* path)> unlink;

  /// Every member the system call of its name.
  [[nodiscard]] static DiskIo system();
};

/// O_DIRECT's alignment for the buffer, the offset and the length: 4096 covers every logical
/// block size in use (512 and 4096); statx's STATX_DIOALIGN would say less on most devices.
inline constexpr size_t kDirectAlign = 4096;

[[nodiscard]] constexpr uint64_t round_up_direct(uint64_t n) {
  return (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
}

/// pwritev of every byte of `iov` from offset 0, through short writes; false with errno set on
/// failure (a write of 0 bytes is EIO).
[[nodiscard]] bool write_all(const DiskIo& io, int fd, std::vector<iovec> iov);

/// preads from offset 0 into out[0, capacity) until at least `want` bytes are in or the file
/// ends; the count read (less than `want` at end of file), -1 with errno set on failure. With
/// O_DIRECT, `out` and `capacity` are aligned and the first read asks for all of it, so a file
/// of `want` bytes is one read.
[[nodiscard]] ssize_t read_all(const DiskIo& io, int fd, std::byte* out, size_t capacity,
                               size_t want);

class AlignedBuffer;

/// The flags every read of a value opens with (O_DIRECT added where in use): a symlink in a
/// value's place is refused (ELOOP), and a FIFO or device opens without waiting for a writer, so
/// that the fstat check of read_open_file rejects it before any read.
inline constexpr int kValueReadFlags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;

/// How one file's read ended. kRejected: not a regular file, a symlink, or not the size the
/// index holds (nothing read; a corrupt miss, never an I/O error of the tier).
enum class ReadOutcome { kRead, kGone, kTooLarge, kFailed, kRejected };
struct FileRead {
  ReadOutcome outcome = ReadOutcome::kRead;
  size_t got = 0;        ///< bytes read (kRead)
  int err = 0;           ///< errno (kFailed, kGone)
  const char* op = "";   ///< the call that failed
};

/// Reads the file open as `fd` whole into `buffer` and closes `fd`: first an fstat (kRejected,
/// unread, unless a regular file of `expected` bytes; kTooLarge, unread, beyond `limit`).
/// `direct`: opened with O_DIRECT (the read asks for whole blocks; the kernel stops at the
/// file's end). Buffered, the file's pages are dropped before the close: the caller keeps the
/// value, so the page cache would hold a second copy. std::bad_alloc (fd closed) when the buffer
/// cannot grow.
[[nodiscard]] FileRead read_open_file(const DiskIo& io, int fd, bool direct, uint64_t expected,
                                      uint64_t limit, AlignedBuffer& buffer);

/// Opens `file` for a buffered read and starts reading it in the kernel (POSIX_FADV_WILLNEED,
/// asynchronous): read-ahead of the files a fetch reads next. -1 when it cannot be opened.
[[nodiscard]] int open_ahead(const DiskIo& io, const std::string& file);

/// Frees an AlignedBuffer's memory: the huge-page mapping of `mapped` bytes, or (0)
/// aligned_alloc's.
struct AlignedBufferFree {
  size_t mapped = 0;
  void operator()(std::byte* p) const noexcept;
};

/// A growable buffer aligned for O_DIRECT (kDirectAlign), its size a multiple of it. From
/// kHugePageBytes up, it is mapped for huge pages (base/huge_pages.hpp): an O_DIRECT read of
/// 4 MiB into 4 KiB pages is four device requests with 1024 pages pinned, into huge pages one
/// request. On the VM measured, the tier's 64 files of 4 MiB read serially in 219 ms into 4 KiB
/// pages and in 99 ms into huge pages (docs/perf.md, "Local disk tier").
class AlignedBuffer {
 public:
  /// At least `bytes` (rounded up); contents not kept. std::bad_alloc when memory is short.
  std::byte* reserve(size_t bytes);
  [[nodiscard]] std::byte* data() const noexcept { return data_.get(); }
  [[nodiscard]] size_t capacity() const noexcept { return capacity_; }
  /// Whether the buffer is a huge-page-aligned mapping (whether the kernel gave huge pages is
  /// its choice: /proc/self/smaps says).
  [[nodiscard]] bool huge_page_mapped() const noexcept { return data_.get_deleter().mapped != 0; }

 private:
  std::unique_ptr<std::byte, AlignedBufferFree> data_;
  size_t capacity_ = 0;
};

/// Read buffers kept from one fetch to the next. A buffer's pages stay with it once a read has
/// faulted them in; a fresh buffer's first O_DIRECT read faults every page in first. On the VMs
/// measured, that made a 64-file cold hit (two fresh 4 MiB buffers) ~50 ms slower than the same
/// reads into kept buffers (docs/perf.md, "Local disk tier").
///
/// Thread safety: take() and give_back() may be called from any threads at once (one mutex,
/// held for a vector push or pop). Holds at most `max_kept` buffers, each as large as the
/// largest read it served, until destroyed.
class AlignedBufferCache {
 public:
  explicit AlignedBufferCache(size_t max_kept);
  AlignedBufferCache(const AlignedBufferCache&) = delete;
  AlignedBufferCache& operator=(const AlignedBufferCache&) = delete;

  /// The most recently given back buffer, or an empty one (it grows on reserve()).
  [[nodiscard]] AlignedBuffer take();
  /// Kept while fewer than max_kept are; freed otherwise, or when it holds nothing.
  void give_back(AlignedBuffer buffer) noexcept;
  [[nodiscard]] size_t kept() const;

 private:
  mutable std::mutex mutex_;
  std::vector<AlignedBuffer> kept_;  // capacity max_kept from the start: give_back never allocates
  const size_t max_kept_;
};

}  // namespace hss::detail
