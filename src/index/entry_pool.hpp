#pragma once
// Pooled entries: every Entry of a store, with its shared_ptr control block (one allocation for
// both, std::allocate_shared), is a fixed-size node of slabs the store owns, not a heap block.
//
// Why: a store or a batch creates one entry per chunk and slot, and pool pressure, drops and
// coupled evictions destroy them in bulk. Through malloc those are a block of ~190 bytes each:
// too large for glibc's fast bins, so every free goes through the unsorted bin and consolidation
// (~20% of a batch's instructions were malloc/free, docs/perf.md). Here a node is a pop and a
// push on a free list, nodes are cache-line aligned (an entry's fence and state never share a
// line with another entry's), and a slab's entries lie together.
//
// Thread safety: make() may run on any thread (the store, the remote read-through, an import);
// a spin lock guards the free list it pops (a critical section of a few instructions, taken once
// per entry: a mutex's lock and unlock calls cost more than the pop; contention yields). A node
// comes back from whichever thread drops the entry's last reference, lock-free (a push onto an
// atomic stack that make() takes whole when its own list is empty). Nothing here waits for a copy
// or calls into CUDA.
//
// Lifetime: the pool must outlive every entry made from it (the store declares it before its
// BlockPool, so both outlive the index, the device path, the leases and the remote tier).
//
// Memory: slabs are never returned before the pool dies, so the pool holds the most entries
// that were alive at once (each holds at least one granule, so at most the granule count plus
// the detached entries readers still pin), ~192 bytes each.

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "index/store_index.hpp"

namespace hss::detail {

class EntryPool {
 public:
  /// Bytes of one node: an Entry and its control block, rounded up to cache lines.
  static constexpr size_t kNodeBytes = (sizeof(Entry) + 4 * sizeof(void*) + 63) / 64 * 64;
  static constexpr size_t kNodeAlign = 64;

  EntryPool() = default;
  ~EntryPool();
  EntryPool(const EntryPool&) = delete;
  EntryPool& operator=(const EntryPool&) = delete;

  /// A new entry (state kPending) in a pooled node. May throw std::bad_alloc (a new slab).
  template <typename... Args>
  [[nodiscard]] EntryRef make(Args&&... args) {
    return std::allocate_shared<Entry>(Allocator<Entry>(this), std::forward<Args>(args)...);
  }

  /// Nodes of every slab, and those holding an entry now (tests, check_invariants).
  [[nodiscard]] size_t nodes() const;
  [[nodiscard]] size_t nodes_in_use() const;

  /// The allocator allocate_shared rebinds to its control block: one node for one object that
  /// fits, the heap for anything else (the decision depends on the type alone, so deallocate
  /// makes the same one).
  template <typename T>
  struct Allocator {
    using value_type = T;
    explicit Allocator(EntryPool* pool_) noexcept : pool(pool_) {}
    template <typename U>
    Allocator(const Allocator<U>& other) noexcept : pool(other.pool) {}  // NOLINT: rebinding

    static constexpr bool kPooled = sizeof(T) <= kNodeBytes && alignof(T) <= kNodeAlign;
    [[nodiscard]] T* allocate(size_t n) {
      if (kPooled && n == 1) return static_cast<T*>(pool->take());
      return std::allocator<T>().allocate(n);
    }
    void deallocate(T* p, size_t n) noexcept {
      if (kPooled && n == 1) return pool->give(p);
      std::allocator<T>().deallocate(p, n);
    }
    template <typename U>
    bool operator==(const Allocator<U>& other) const noexcept {
      return pool == other.pool;
    }

    EntryPool* pool;
  };

 private:
  struct FreeNode {
    FreeNode* next;
  };
  static constexpr size_t kFirstSlabNodes = 64;
  static constexpr size_t kMaxSlabNodes = 4096;

  void* take();
  void give(void* node) noexcept;
  void grow();  // under mutex_

  class SpinLock {
   public:
    void lock() noexcept {
      while (locked_.exchange(true, std::memory_order_acquire)) {
        while (locked_.load(std::memory_order_relaxed)) std::this_thread::yield();
      }
    }
    void unlock() noexcept { locked_.store(false, std::memory_order_release); }

   private:
    std::atomic<bool> locked_{false};
  };
  mutable SpinLock mutex_;  // guards free_, slabs_, nodes_ (make's side only)
  FreeNode* free_ = nullptr;
  std::atomic<FreeNode*> returned_{nullptr};  // pushed lock-free by give()
  struct SlabDelete {
    void operator()(std::byte* p) const noexcept {
      ::operator delete[](p, std::align_val_t{kNodeAlign});
    }
  };
  struct Slab {
    std::unique_ptr<std::byte[], SlabDelete> memory;
    size_t nodes = 0;
  };
  std::vector<Slab> slabs_;
  size_t nodes_ = 0;
};

}  // namespace hss::detail
