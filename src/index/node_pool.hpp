#pragma once
// The index's memory for its own small blocks: map nodes (a key and its record) and the slot
// vectors of the records. A new key through malloc cost two ~190-instruction allocations, and
// std::pmr's pool resources were hardly cheaper (~170 each, measured with callgrind: docs/perf.md);
// here a block is a pop from a free list of its 16-byte size class, and a free is a push.
//
// Blocks of up to kMaxPooledBytes with an alignment of at most 16 come from slabs the pool owns
// (each size class its own, doubling from 16 to 1024 blocks); anything larger (the map's bucket
// array) goes to the heap. Under AddressSanitizer every block goes to the heap, so a use after
// free of a node stays a report.
//
// Thread safety: none. The index uses it under the index mutex only, as it does every map.
// Memory: slabs go back only when the pool dies, so it holds the most blocks that were alive at
// once (the index's peak of keys).

#include <array>
#include <cstddef>
#include <memory>
#include <memory_resource>
#include <vector>

namespace hss::detail {

class NodePool final : public std::pmr::memory_resource {
 public:
  static constexpr size_t kClassBytes = 16;
  static constexpr size_t kMaxPooledBytes = 1024;

  NodePool() = default;
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;
  ~NodePool() override = default;

  /// Blocks handed out and not yet returned (tests and check_invariants).
  [[nodiscard]] size_t live_blocks() const noexcept { return live_; }
  /// Blocks the slabs hold, live or free.
  [[nodiscard]] size_t slab_blocks() const noexcept { return slab_blocks_; }

 private:
  static constexpr size_t kClasses = kMaxPooledBytes / kClassBytes;
  struct FreeBlock {
    FreeBlock* next;
  };

  void* do_allocate(size_t bytes, size_t alignment) override;
  void do_deallocate(void* block, size_t bytes, size_t alignment) override;
  [[nodiscard]] bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }
  [[nodiscard]] static bool pooled(size_t bytes, size_t alignment) noexcept;
  /// Carves a new slab for size class `c` onto its free list (may throw std::bad_alloc).
  void grow(size_t c);

  std::array<FreeBlock*, kClasses> free_{};
  std::array<size_t, kClasses> next_slab_blocks_{};
  std::vector<std::unique_ptr<std::byte[]>> slabs_;
  size_t live_ = 0;
  size_t slab_blocks_ = 0;
};

}  // namespace hss::detail
