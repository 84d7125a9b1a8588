#pragma once
// The device-resident hot tier (hidden_state_device_cache_size): granules of device memory of
// the store's device, allocated once at construction (no allocation on the hot path), the home
// (Residency::kDevicePool) of the device copies that device stores keep beside their host-pool
// entries (write-through; docs/design.md, "The device-resident tier"). A device copy is an Entry
// of this home hanging off its host entry (Entry::device_copy), so dropping the host entry drops
// it too; device-pool pressure drops device copies only.
//
// Counts what stats().tiers reports in its `device` row: live device copies (granted and not yet
// released), granules in use, restores' hits, evictions, errors.
//
// Thread safety: every method may be called concurrently (the pool's mutex, atomics).

#include <atomic>
#include <cstdint>
#include <span>

#include "pool/block_pool.hpp"
#include "pool/granule_home.hpp"

namespace hss::detail {

class DeviceTier final : public GranuleHome {
 public:
  /// `capacity_bytes` of device memory on `device` in granules of `granule_bytes` (the host
  /// pool's, so a device copy lies over its granules as its host entry does). hss::Error when the
  /// allocation fails.
  DeviceTier(uint64_t capacity_bytes, uint64_t granule_bytes, int device)
      : pool_(capacity_bytes, granule_bytes, BlockPool::OnDevice{device}), device_(device) {}
  DeviceTier(const DeviceTier&) = delete;
  DeviceTier& operator=(const DeviceTier&) = delete;
  ~DeviceTier() = default;

  [[nodiscard]] Residency residency() const noexcept override { return Residency::kDevicePool; }
  /// A device copy's granules, or false and nothing taken. Never throws.
  [[nodiscard]] bool allocate(std::span<uint32_t> out) noexcept {
    if (!pool_.allocate(out)) return false;
    entries_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  void release(std::span<const uint32_t> blocks) noexcept override {
    if (blocks.empty()) return;  // an entry never granted
    pool_.release(blocks);
    entries_.fetch_sub(1, std::memory_order_relaxed);
  }

  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] const BlockPool& pool() const noexcept { return pool_; }
  [[nodiscard]] std::byte* block_address(uint32_t id) const { return pool_.block_address(id); }
  [[nodiscard]] uint64_t entries() const noexcept {
    return entries_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] uint64_t bytes_in_use() const {
    return (pool_.num_blocks() - pool_.free_blocks()) * pool_.granule_bytes();
  }

  /// Chunks (x slots) a device restore read from device copies.
  std::atomic<uint64_t> hits{0};
  /// Device copies dropped for device-pool pressure (their host entries stay).
  std::atomic<uint64_t> evictions{0};
  /// Device copies lost to a failed launch or a failed fence (the host entries serve instead).
  std::atomic<uint64_t> errors{0};

 private:
  BlockPool pool_;
  const int device_;
  std::atomic<uint64_t> entries_{0};
};

}  // namespace hss::detail
