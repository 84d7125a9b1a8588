#pragma once
// The hidden-state pool: one arena allocated at construction, cut into fixed granules.
//
// Why fixed granules: entries of every shape (hidden dims, partial chunks, 16-bit and float32
// storage, several kinds and layers) share one pool. An entry takes ceil(bytes / granule)
// granules that need not be adjacent, so any free granule serves any entry: the pool cannot
// fragment, and an empty pool takes floor(capacity / chunk_bytes) chunks of any shape whose bytes
// are a multiple of the granule, whatever was stored before. The waste per entry is below one
// granule (64 KiB by default; smaller pools get smaller granules, see granule_for_pool).
// Free granules are a stack of ids reserved to its full size at construction, so allocate and
// release never allocate memory: O(granules of the entry), and release is noexcept. Fresh ids
// are handed out in ascending order so a fresh pool's entries lie in adjacent granules.
//
// Thread safety: all methods may be called concurrently; one short mutex guards the free stack.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "hss/detail/checked.hpp"

#include "pool/granule_home.hpp"

namespace hss::detail {

/// The granule ids of one entry: up to kInline of them inline (an entry of a chunk or less under
/// the default 64 KiB granule: most entries), more on the heap, so most entries cost no
/// allocation for their ids. reserve() is the only call that may allocate (resize() beyond the
/// capacity reserves first); clear() keeps the capacity. Move-only.
class BlockList {
 public:
  static constexpr size_t kInline = 4;

  BlockList() = default;
  BlockList(BlockList&& other) noexcept { take(other); }
  BlockList& operator=(BlockList&& other) noexcept {
    if (this != &other) take(other);
    return *this;
  }
  BlockList(const BlockList&) = delete;
  BlockList& operator=(const BlockList&) = delete;
  ~BlockList() = default;

  void reserve(size_t n) {
    if (n <= capacity_) return;
    auto heap = std::make_unique_for_overwrite<uint32_t[]>(n);
    std::copy_n(data(), size_, heap.get());
    heap_ = std::move(heap);
    capacity_ = n;
  }
  void resize(size_t n) {
    reserve(n);
    size_ = n;  // ids past the old size are unspecified until written (BlockPool::allocate)
  }
  void clear() noexcept { size_ = 0; }

  [[nodiscard]] size_t size() const noexcept { return size_; }
  [[nodiscard]] size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] uint32_t* data() noexcept { return heap_ ? heap_.get() : inline_.data(); }
  [[nodiscard]] const uint32_t* data() const noexcept {
    return heap_ ? heap_.get() : inline_.data();
  }
  [[nodiscard]] uint32_t* begin() noexcept { return data(); }
  [[nodiscard]] uint32_t* end() noexcept { return data() + size_; }
  [[nodiscard]] const uint32_t* begin() const noexcept { return data(); }
  [[nodiscard]] const uint32_t* end() const noexcept { return data() + size_; }
  [[nodiscard]] uint32_t& operator[](size_t i) noexcept { return data()[i]; }
  [[nodiscard]] uint32_t operator[](size_t i) const noexcept { return data()[i]; }

 private:
  void take(BlockList& other) noexcept {
    heap_ = std::move(other.heap_);
    if (!heap_) std::copy_n(other.inline_.data(), other.size_, inline_.data());
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, kInline);
  }

  std::array<uint32_t, kInline> inline_;
  std::unique_ptr<uint32_t[]> heap_;
  size_t size_ = 0;
  size_t capacity_ = kInline;
};

class BlockPool final : public GranuleHome {
 public:
  static constexpr uint64_t kDefaultGranuleBytes = uint64_t{64} << 10;
  static constexpr uint64_t kMinGranuleBytes = limits::kMinGranuleBytes;
  static constexpr uint64_t kMaxGranuleBytes = limits::kMaxGranuleBytes;

  /// The automatic granule: 64 KiB, or for pools under 64 MiB the largest power of two that
  /// leaves at least 1024 granules (at least 64 bytes, at most the pool rounded down to 64).
  [[nodiscard]] static uint64_t granule_for_pool(uint64_t capacity_bytes);

  /// Allocates capacity_bytes now: page-locked, device-mapped memory (on CUDA device `device`)
  /// when `try_pinned` and a device is present, else anonymous pages mapped for huge pages from a
  /// huge-page boundary (base/huge_pages.hpp), populated up front when `prefault`, after
  /// checking that they fit in the memory available to the process (hss::Error naming both
  /// otherwise). granule_bytes == 0 picks granule_for_pool; otherwise a
  /// multiple of 64 <= kMaxGranuleBytes.
  BlockPool(uint64_t capacity_bytes, uint64_t granule_bytes, bool try_pinned, bool prefault,
            int device = -1);
  /// Device memory of CUDA device `on_device.device` (cudaMalloc, once, now): the arena of the
  /// device-resident tier (device_tier.hpp). hss::Error naming the device and the CUDA error when
  /// the allocation fails; InvalidArgument for sizes as above.
  struct OnDevice {
    int device;
  };
  BlockPool(uint64_t capacity_bytes, uint64_t granule_bytes, OnDevice on_device);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  [[nodiscard]] uint64_t granule_bytes() const { return granule_bytes_; }
  /// Usable bytes: num_blocks() x granule_bytes().
  [[nodiscard]] uint64_t capacity_bytes() const { return num_blocks_ * granule_bytes_; }
  [[nodiscard]] uint64_t num_blocks() const { return num_blocks_; }
  [[nodiscard]] uint64_t free_blocks() const;
  [[nodiscard]] bool pinned() const { return pinned_; }

  /// Granules needed for `bytes`.
  [[nodiscard]] size_t blocks_for(uint64_t bytes) const {
    return static_cast<size_t>((bytes + granule_bytes_ - 1) / granule_bytes_);
  }
  /// Fills `out` with out.size() granule ids, or returns false and takes nothing. Never throws.
  [[nodiscard]] bool allocate(std::span<uint32_t> out) noexcept;
  void release(std::span<const uint32_t> blocks) noexcept override;
  [[nodiscard]] Residency residency() const noexcept override {
    return device_memory_ ? Residency::kDevicePool : Residency::kHostPool;
  }
  [[nodiscard]] std::byte* block_address(uint32_t id) const {
    return base_ + static_cast<uint64_t>(id) * granule_bytes_;
  }
  /// True when `id` is on the free stack (O(free); for check_invariants only).
  void free_ids(std::vector<uint32_t>& out) const;

  /// For GranuleStash, under one lock: `stash`'s ids go back on top of the free stack as they
  /// lie (its back on top), then the top min(want, free) ids move onto `stash` in the same order
  /// (the top at its back), or none when fewer than `need` are free (false). `stash` has the
  /// capacity for `want` ids. Never throws.
  bool restock(std::vector<uint32_t>& stash, size_t need, size_t want) noexcept;

 private:
  /// The size checks and the free stack of both constructors (before the arena is allocated).
  void check_sizes_and_reserve(uint64_t capacity_bytes);
  /// Every granule free, the lowest ids on top (after the arena is allocated).
  void fill_free_stack();

  uint64_t arena_bytes_;
  uint64_t granule_bytes_;
  uint64_t num_blocks_;
  std::byte* base_ = nullptr;
  bool pinned_ = false;
  bool device_memory_ = false;  // cudaMalloc'd (OnDevice): freed with cudaFree
  int device_ = -1;  // the CUDA device the pinned arena was allocated (and is freed) on
  mutable std::mutex mutex_;
  std::vector<uint32_t> free_;  // a stack; capacity == num_blocks_, so pushes never allocate
};

/// Granules taken from a BlockPool under one lock for the many entries of one call (a batch's
/// grants), then handed out without a lock; the ids not handed out go back when it dies.
/// Equivalent to allocating from the pool: the stash holds the top of the free stack in its
/// order, and a grant it cannot serve gives them back before refilling or failing, so every
/// grant succeeds exactly when one from the pool would have (a caller then evicts exactly as
/// before) and, with no release between two grants, gets the same ids (a release meanwhile, a
/// replaced entry's or another thread's, goes on the pool's top while the stash serves its own
/// first). Not synchronised: one call's, used under the store's index lock.
class GranuleStash {
 public:
  /// Room for `expected` ids, the call's estimate (may throw std::bad_alloc; nothing taken).
  GranuleStash(BlockPool& pool, size_t expected);
  ~GranuleStash();
  GranuleStash(const GranuleStash&) = delete;
  GranuleStash& operator=(const GranuleStash&) = delete;
  /// Like BlockPool::allocate: out.size() ids, or false and nothing taken. Refills, when
  /// short, with as many of the ids still expected as are free. Never throws.
  [[nodiscard]] bool allocate(std::span<uint32_t> out) noexcept {
    if (ids_.size() < out.size()) [[unlikely]]
      return refill_and_allocate(out);
    hand_out(out);
    return true;
  }

 private:
  bool refill_and_allocate(std::span<uint32_t> out) noexcept;
  void hand_out(std::span<uint32_t> out) noexcept {
    for (uint32_t& id : out) {  // the former top first, as BlockPool::allocate hands them out
      id = ids_.back();
      ids_.pop_back();
    }
    expected_ = expected_ > out.size() ? expected_ - out.size() : 0;
  }

  BlockPool& pool_;
  std::vector<uint32_t> ids_;  // the pool's former top at the back
  size_t expected_;            // ids the call may still ask for (an estimate)
};

}  // namespace hss::detail
