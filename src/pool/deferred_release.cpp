#include "pool/deferred_release.hpp"

#include <algorithm>
#include <new>
#include <utility>

namespace hss::detail {

DeferredRelease::~DeferredRelease() { drain(); }

bool DeferredRelease::defer(BlockList& blocks, std::shared_ptr<CopyFence> fence) noexcept {
  try {
    std::lock_guard lock(mutex_);
    items_.push_back({std::move(blocks), std::move(fence)});
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

size_t DeferredRelease::reclaim() noexcept {
  {
    std::lock_guard lock(mutex_);
    if (items_.empty()) return 0;
    // Cached flags only (refreshed by DevicePath::poll()): no device query under any lock.
    auto split = std::partition(items_.begin(), items_.end(),
                                [](const Item& item) { return !item.fence->settled(); });
    for (auto it = split; it != items_.end(); ++it) {
      pool_.release(it->blocks);
    }
    size_t granules = 0;
    for (auto it = split; it != items_.end(); ++it) granules += it->blocks.size();
    items_.erase(split, items_.end());
    return granules;
  }
}

void DeferredRelease::drain() noexcept {
  std::vector<Item> all;
  {
    std::lock_guard lock(mutex_);
    all.swap(items_);
  }
  for (Item& item : all) {
    (void)item.fence->wait();  // a failed copy wrote nothing more: the granules are free either way
    pool_.release(item.blocks);
  }
}

size_t DeferredRelease::pending() const {
  std::lock_guard lock(mutex_);
  return items_.size();
}

}  // namespace hss::detail
