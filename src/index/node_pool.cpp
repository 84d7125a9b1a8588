#include "index/node_pool.hpp"

#include <algorithm>
#include <new>

#include "base/address_sanitizer.hpp"

namespace hss::detail {

bool NodePool::pooled(size_t bytes, size_t alignment) noexcept {
#if defined(HSS_ADDRESS_SANITIZER)
  (void)bytes;
  (void)alignment;
  return false;  // every block from the heap: ASan sees each node's lifetime
#else
  return bytes != 0 && bytes <= kMaxPooledBytes && alignment <= kClassBytes;
#endif
}

void* NodePool::do_allocate(size_t bytes, size_t alignment) {
  if (!pooled(bytes, alignment)) {
    void* block = ::operator new(bytes, std::align_val_t(alignment));
    ++live_;
    return block;
  }
  const size_t c = (bytes - 1) / kClassBytes;
  if (free_[c] == nullptr) grow(c);
  FreeBlock* block = free_[c];
  free_[c] = block->next;
  ++live_;
  return block;
}

void NodePool::do_deallocate(void* block, size_t bytes, size_t alignment) {
  --live_;
  if (!pooled(bytes, alignment)) {
    // Unsized: clang 14 declares no sized operator delete without -fsized-deallocation.
    ::operator delete(block, std::align_val_t(alignment));
    return;
  }
  const size_t c = (bytes - 1) / kClassBytes;
  auto* free_block = static_cast<FreeBlock*>(block);
  free_block->next = free_[c];
  free_[c] = free_block;
}

void NodePool::grow(size_t c) {
  const size_t block_bytes = (c + 1) * kClassBytes;
  const size_t blocks = std::max<size_t>(next_slab_blocks_[c], 16);
  slabs_.reserve(slabs_.size() + 1);  // the only throw after the slab exists would leak it
  auto slab = std::make_unique_for_overwrite<std::byte[]>(blocks * block_bytes);
  std::byte* base = slab.get();
  slabs_.push_back(std::move(slab));
  for (size_t i = blocks; i-- > 0;) {
    auto* block = reinterpret_cast<FreeBlock*>(base + i * block_bytes);
    block->next = free_[c];
    free_[c] = block;
  }
  slab_blocks_ += blocks;
  next_slab_blocks_[c] = std::min<size_t>(blocks * 2, 1024);
}

}  // namespace hss::detail
