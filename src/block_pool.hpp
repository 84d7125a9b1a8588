#pragma once
// The hidden-state pool: one arena allocated at construction, carved into equal blocks.
//
// Why blocks: hidden-state chunks of one shape are the common case, so the granule is fixed on
// first use to the byte size of one full chunk of that shape (or Config::hidden_state_block_bytes)
// and uniform chunks fill the arena exactly: floor(capacity / chunk_bytes) of them. Other shapes
// (trailing partial chunks, other hidden dims) take ceil(bytes / block_bytes) blocks that need not
// be adjacent, so the pool never fragments: any free block serves any entry. Free blocks are a
// stack of ids: alloc and free are O(blocks of the entry), O(1) for uniform chunks. Metadata
// (the stack, entries' block lists) lives outside the arena.
//
// Thread safety: all methods may be called concurrently; one short mutex guards the free stack.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace hss::detail {

using BlockList = std::vector<uint32_t>;

class BlockPool {
 public:
  /// Allocates capacity_bytes now: page-locked, device-mapped memory when `try_pinned` and a
  /// device is present, else anonymous pages (populated up front when `prefault`).
  BlockPool(uint64_t capacity_bytes, bool try_pinned, bool prefault);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  /// Fixes the block size on first call (rounded up to 16 bytes, capped at the capacity) and
  /// returns the block size in force.
  uint64_t ensure_block_bytes(uint64_t preferred);
  [[nodiscard]] uint64_t block_bytes() const;
  [[nodiscard]] uint64_t capacity_bytes() const { return capacity_bytes_; }
  [[nodiscard]] uint64_t num_blocks() const;
  [[nodiscard]] uint64_t free_blocks() const;
  [[nodiscard]] bool pinned() const { return pinned_; }

  /// Blocks needed for `bytes` (block size must be fixed).
  [[nodiscard]] size_t blocks_for(uint64_t bytes) const;
  /// Appends n block ids to `out`, or returns false and takes nothing.
  [[nodiscard]] bool allocate(size_t n, BlockList& out);
  void release(std::span<const uint32_t> blocks) noexcept;
  [[nodiscard]] std::byte* block_address(uint32_t id) const {
    return base_ + static_cast<uint64_t>(id) * block_bytes_relaxed_;
  }

 private:
  uint64_t capacity_bytes_;
  std::byte* base_ = nullptr;
  bool pinned_ = false;
  uint64_t block_bytes_relaxed_ = 0;  // written once under mutex_ before any block exists
  mutable std::mutex mutex_;
  uint64_t num_blocks_ = 0;
  std::vector<uint32_t> free_;
};

}  // namespace hss::detail
