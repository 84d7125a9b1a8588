#pragma once
// Granules whose entry was dropped (drop_key, a coupled eviction, close) while a device-to-host
// copy into them may still be in flight. Dropping never waits for the copy: the entry hands its
// granules here, and they return to the pool once the copy's fence has landed (reclaim(), called
// before the store's eviction decisions, by flush(), and at destruction).
//
// Thread-safe; one short mutex. Never calls back into the store. Must be destroyed after every
// copy it tracks was waited for (the store destroys the device path first) and before the pool.

#include <memory>
#include <mutex>
#include <vector>

#include "datapath/data_path.hpp"
#include "pool/block_pool.hpp"

namespace hss::detail {

class DeferredRelease {
 public:
  explicit DeferredRelease(GranuleHome& pool) : pool_(pool) {}
  /// Waits for what is left, then returns it to the pool.
  ~DeferredRelease();
  DeferredRelease(const DeferredRelease&) = delete;
  DeferredRelease& operator=(const DeferredRelease&) = delete;

  /// Takes `blocks` to return once `fence` is ready. False (nothing taken) when out of memory;
  /// the caller then waits and releases itself.
  [[nodiscard]] bool defer(BlockList& blocks, std::shared_ptr<CopyFence> fence) noexcept;
  /// Returns the granules whose copies have landed; never waits. Returns how many granules.
  size_t reclaim() noexcept;
  /// Waits for every fence, then returns everything.
  void drain() noexcept;
  [[nodiscard]] size_t pending() const;

 private:
  struct Item {
    BlockList blocks;
    std::shared_ptr<CopyFence> fence;
  };
  GranuleHome& pool_;  // the host pool, or the device tier's (device_tier.hpp)
  mutable std::mutex mutex_;
  std::vector<Item> items_;
};

}  // namespace hss::detail
