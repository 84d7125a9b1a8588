#pragma once
// hss::detail::FileReadAhead: a fetch's files read ahead of their use, several at once. `readers`
// background threads claim items 0, 1, 2, ... in order and read each into its slot's buffer
// (readers + 1 slots: item i uses slot i % slots); the caller takes the items in the same order
// (next()) and checks and copies item i while the readers read the next ones. A cold disk hit is
// then the device's time for reads in flight instead of the sum of one read and one check per
// file (docs/perf.md, "Local disk tier": serial reads with their checks reached about 0.4x of
// the raw read of the same bytes; 4 reads in flight of the tier's own files reach the raw read).
//
// Slot states (each slot also names the one item allowed in next: slot s takes s, s + slots, ...):
//
//     kFree --(a reader: read its item into it)--> kFilled --(caller: next() returns it)-->
//     kInUse --(caller: next() for the following item, or the destructor)--> kFree
//
// Buffers: each slot's buffer is taken from the tier's AlignedBufferCache and given back when
// the pipeline ends, so the next fetch reads into pages already faulted in (disk_io.hpp).
//
// Failure: a reader's exception (std::bad_alloc from a buffer's growth) is rethrown by the
// next() that would have returned its item; no reader takes on an item after it, and a next()
// for such an item rethrows the same exception. The destructor stops the readers (each finishes the
// read it is in) and joins them: an exception out of the caller's loop leaves no thread behind.
//
// Thread safety: one caller thread; next() blocks on the readers (disk reads). `read` is called
// from the reader threads at once, for different items and buffers.

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tiers/disk/disk_io.hpp"

namespace hss::detail {

class FileReadAhead {
 public:
  /// Reads item `item` whole into `buffer` (on a reader thread).
  using ReadFile = std::function<FileRead(size_t item, AlignedBuffer& buffer)>;

  struct Item {
    FileRead read;
    const AlignedBuffer* buffer = nullptr;  ///< the bytes (read.got of them) until next()
  };

  /// Starts min(readers, count) reader threads (readers >= 1) on items [0, count). The slots'
  /// buffers come from `buffers` and go back to it when the pipeline ends (nullptr: fresh
  /// buffers, freed at the end). std::system_error when no thread can be started (the caller
  /// reads serially instead).
  FileReadAhead(size_t count, int readers, ReadFile read, AlignedBufferCache* buffers = nullptr);
  ~FileReadAhead();
  FileReadAhead(const FileReadAhead&) = delete;
  FileReadAhead& operator=(const FileReadAhead&) = delete;

  /// The next item in order (0 first), waiting for its read; the previous item's buffer is
  /// released. At most `count` calls. Rethrows the reader's exception for that item.
  [[nodiscard]] Item next();

 private:
  enum class SlotState { kFree, kFilled, kInUse };
  struct Slot {
    SlotState state = SlotState::kFree;
    size_t item = 0;  ///< the item this slot takes next (kFree) or holds
    FileRead read;
    std::exception_ptr error;
    AlignedBuffer buffer;
  };

  void run();
  void stop() noexcept;
  void give_back_buffers() noexcept;  // after stop(): no reader touches a slot

  const size_t count_;
  const ReadFile read_;
  AlignedBufferCache* const buffers_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Slot> slots_;
  size_t claimed_ = 0;  ///< items a reader has taken on
  size_t taken_ = 0;    ///< items next() has returned
  bool stopping_ = false;
  std::exception_ptr failure_;  ///< the first reader's exception: no item is claimed after it
  std::vector<std::thread> readers_;  // last: started after every member above exists
};

}  // namespace hss::detail
