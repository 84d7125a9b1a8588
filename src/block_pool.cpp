#include "block_pool.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <string>

#include "cuda_runtime.hpp"
#include "hss/error.hpp"

namespace hss::detail {

BlockPool::BlockPool(uint64_t capacity_bytes, bool try_pinned, bool prefault)
    : capacity_bytes_(capacity_bytes) {
  if (capacity_bytes == 0) throw InvalidArgument("pool capacity_bytes must be > 0, got 0");
  if (try_pinned) {
    base_ = static_cast<std::byte*>(pinned_host_alloc(capacity_bytes));
    pinned_ = base_ != nullptr;
  }
  if (base_ == nullptr) {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (prefault) flags |= MAP_POPULATE;
    void* mem = mmap(nullptr, capacity_bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (mem == MAP_FAILED) {
      throw Error("hidden-state pool: could not map " + std::to_string(capacity_bytes) + " bytes");
    }
    (void)madvise(mem, capacity_bytes, MADV_HUGEPAGE);
    base_ = static_cast<std::byte*>(mem);
  }
}

BlockPool::~BlockPool() {
  if (pinned_) {
    pinned_host_free(base_);
  } else {
    munmap(base_, capacity_bytes_);
  }
}

uint64_t BlockPool::ensure_block_bytes(uint64_t preferred) {
  std::lock_guard lock(mutex_);
  if (block_bytes_relaxed_ != 0) return block_bytes_relaxed_;
  uint64_t bytes = (std::max<uint64_t>(preferred, 16) + 15) / 16 * 16;
  bytes = std::min(bytes, capacity_bytes_ / 16 * 16);
  if (bytes == 0) bytes = 16;
  block_bytes_relaxed_ = bytes;
  num_blocks_ = capacity_bytes_ / bytes;
  free_.resize(num_blocks_);
  // Lowest ids on top of the stack: the first entries fill the arena from its start.
  for (uint64_t i = 0; i < num_blocks_; ++i) free_[i] = static_cast<uint32_t>(num_blocks_ - 1 - i);
  return bytes;
}

uint64_t BlockPool::block_bytes() const {
  std::lock_guard lock(mutex_);
  return block_bytes_relaxed_;
}

uint64_t BlockPool::num_blocks() const {
  std::lock_guard lock(mutex_);
  return num_blocks_;
}

uint64_t BlockPool::free_blocks() const {
  std::lock_guard lock(mutex_);
  return free_.size();
}

size_t BlockPool::blocks_for(uint64_t bytes) const {
  return static_cast<size_t>((bytes + block_bytes_relaxed_ - 1) / block_bytes_relaxed_);
}

bool BlockPool::allocate(size_t n, BlockList& out) {
  std::lock_guard lock(mutex_);
  if (free_.size() < n) return false;
  out.insert(out.end(), free_.end() - static_cast<ptrdiff_t>(n), free_.end());
  free_.resize(free_.size() - n);
  return true;
}

void BlockPool::release(std::span<const uint32_t> blocks) noexcept {
  if (blocks.empty()) return;
  std::lock_guard lock(mutex_);
  free_.insert(free_.end(), blocks.rbegin(), blocks.rend());
}

}  // namespace hss::detail
