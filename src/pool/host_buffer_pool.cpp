// Process-wide recycler for HostTensor buffers.
//
// Why: an engine asks for a fresh restored tensor per request. Fresh anonymous memory pays a page
// fault per 4 KiB page on first touch, which by itself caps a restore at a few percent of memcpy
// speed for large prefixes. Large buffers are therefore mapped for huge pages
// (base/huge_pages.hpp: one fault per 2 MiB) and, when released, kept for reuse up to a byte
// limit (hidden_state_output_cache_bytes, default 2048 MiB; each store sets it from its config,
// HSS_OUTPUT_CACHE_MB overriding it through Config::with_env_overrides), so the steady state
// touches no new pages at all. Small buffers use malloc.

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>

#include "base/huge_pages.hpp"
#include "hss/config.hpp"
#include "hss/detail/host_buffer.hpp"
#include "hss/error.hpp"

namespace hss::detail {
namespace {

constexpr size_t kLargeThreshold = size_t{1} << 20;

/// Before any store sets it: the default config's limit, as the environment overrides it.
size_t initial_limit() {
  return static_cast<size_t>(Config().with_env_overrides().tuning.output_cache_bytes);
}

/// What the recycler hands out: the memory and its capacity (at least the bytes asked for).
struct Allocation {
  void* data;
  size_t capacity;
};

class Recycler {
 public:
  Allocation acquire(size_t bytes) {
    if (bytes < kLargeThreshold) {
      void* ptr = std::aligned_alloc(64, (std::max<size_t>(bytes, 64) + 63) / 64 * 64);
      if (ptr == nullptr) throw std::bad_alloc();
      return {ptr, bytes};
    }
    // Power-of-two size classes: restores of varying prefix lengths land in a handful of classes,
    // so a released buffer nearly always serves the next request of similar size. The unused
    // tail of a class costs address space only; its pages are never touched.
    const size_t rounded = std::bit_ceil(std::max(bytes, kHugePageBytes));
    {
      std::lock_guard lock(mutex_);
      auto it = free_.find(rounded);
      if (it != free_.end()) {
        const Allocation allocation{it->second, it->first};
        cached_bytes_ -= it->first;
        free_.erase(it);
        ++reuses_;
        return allocation;
      }
      ++fresh_;
    }
    void* mem = map_huge_pages(rounded);
    if (mem == nullptr) throw std::bad_alloc();
    return {mem, rounded};
  }

  void release(void* ptr, size_t capacity) noexcept {
    if (capacity < kLargeThreshold) {
      std::free(ptr);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      if (cached_bytes_ + capacity <= limit_) {
        free_.emplace(capacity, ptr);
        cached_bytes_ += capacity;
        return;
      }
    }
    unmap_huge_pages(ptr, capacity);
  }

  HostBufferPoolStats stats() {
    std::lock_guard lock(mutex_);
    return {cached_bytes_, limit_, reuses_, fresh_};
  }

  void set_limit(size_t bytes) {
    std::lock_guard lock(mutex_);
    limit_ = bytes;
  }

  void trim() {
    std::multimap<size_t, void*> drained;
    {
      std::lock_guard lock(mutex_);
      drained.swap(free_);
      cached_bytes_ = 0;
    }
    for (auto& [capacity, ptr] : drained) unmap_huge_pages(ptr, capacity);
  }

 private:
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  size_t cached_bytes_ = 0;
  size_t limit_ = initial_limit();
  size_t reuses_ = 0;
  size_t fresh_ = 0;
};

// Leaked on purpose: HostTensors may be destroyed during static destruction of other objects.
Recycler& recycler() {
  static auto* instance = new Recycler();
  return *instance;
}

}  // namespace

HostBuffer HostBuffer::acquire(size_t bytes) {
  const Allocation allocation = recycler().acquire(bytes);
  return HostBuffer(allocation.data, allocation.capacity);
}

void HostBuffer::reset() noexcept {
  if (data_ != nullptr) recycler().release(data_, capacity_);
  data_ = nullptr;
  capacity_ = 0;
}

HostBufferPoolStats host_buffer_pool_stats() { return recycler().stats(); }
void host_buffer_pool_trim() { recycler().trim(); }
void host_buffer_pool_set_limit(size_t bytes) { recycler().set_limit(bytes); }

}  // namespace hss::detail
