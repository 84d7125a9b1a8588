#include "index/entry_pool.hpp"

#include <algorithm>

#include "base/address_sanitizer.hpp"
#ifdef HSS_ADDRESS_SANITIZER
#include <sanitizer/asan_interface.h>
#endif

namespace hss::detail {
namespace {

// Under ASan a free node is poisoned past its link, so a use of an entry after its last reference
// dropped is still an ASan report, as it was with heap entries. No-ops otherwise.
void poison_node([[maybe_unused]] void* node) noexcept {
#ifdef HSS_ADDRESS_SANITIZER
  ASAN_POISON_MEMORY_REGION(static_cast<std::byte*>(node) + sizeof(void*),
                            EntryPool::kNodeBytes - sizeof(void*));
#endif
}
void unpoison([[maybe_unused]] void* memory, [[maybe_unused]] size_t bytes) noexcept {
#ifdef HSS_ADDRESS_SANITIZER
  ASAN_UNPOISON_MEMORY_REGION(memory, bytes);
#endif
}

}  // namespace

EntryPool::~EntryPool() {
  // Slabs go back to the heap whole: unpoisoned first.
  for (const Slab& slab : slabs_) unpoison(slab.memory.get(), slab.nodes * kNodeBytes);
}

void* EntryPool::take() {
  std::lock_guard lock(mutex_);
  if (free_ == nullptr) free_ = returned_.exchange(nullptr, std::memory_order_acquire);
  if (free_ == nullptr) grow();
  FreeNode* node = free_;
  free_ = node->next;
  unpoison(node, kNodeBytes);
  return node;
}

void EntryPool::give(void* p) noexcept {
  auto* node = static_cast<FreeNode*>(p);
  poison_node(node);  // before it is visible: take() may unpoison it as soon as it is pushed
  FreeNode* head = returned_.load(std::memory_order_relaxed);
  do {
    node->next = head;
  } while (!returned_.compare_exchange_weak(head, node, std::memory_order_release,
                                            std::memory_order_relaxed));
}

void EntryPool::grow() {
  // Slabs double up to kMaxSlabNodes nodes: a small store stays small, a large one makes few
  // slabs. Nothing changes when the allocation throws.
  const size_t count =
      slabs_.empty() ? kFirstSlabNodes : std::min(kMaxSlabNodes, std::max(kFirstSlabNodes, nodes_));
  slabs_.reserve(slabs_.size() + 1);
  Slab slab{std::unique_ptr<std::byte[], SlabDelete>(static_cast<std::byte*>(
                ::operator new[](count* kNodeBytes, std::align_val_t{kNodeAlign}))),
            count};
  std::byte* base = slab.memory.get();
  slabs_.push_back(std::move(slab));  // capacity reserved: does not throw
  nodes_ += count;
  for (size_t i = count; i-- > 0;) {
    auto* node = reinterpret_cast<FreeNode*>(base + i * kNodeBytes);
    node->next = free_;
    free_ = node;
    poison_node(node);
  }
}

size_t EntryPool::nodes() const {
  std::lock_guard lock(mutex_);
  return nodes_;
}

size_t EntryPool::nodes_in_use() const {
  std::lock_guard lock(mutex_);
  size_t free = 0;
  for (const FreeNode* n = free_; n != nullptr; n = n->next) ++free;
  for (const FreeNode* n = returned_.load(std::memory_order_acquire); n != nullptr; n = n->next)
    ++free;
  return nodes_ - free;
}

}  // namespace hss::detail
