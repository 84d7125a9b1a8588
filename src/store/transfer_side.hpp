#pragma once
// What PoolTransfer and Reservation (hss/pool_transfer.hpp, src/transfer/) need of a store: the
// export and import side, and nothing else. The store implements it (StoreTransfer); the public
// classes reach it through detail::transfer_side(store), the one door HiddenStateStore opens for
// them, so they never see the store's Impl. The rules of each call: hss/pool_transfer.hpp.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "hss/pool_transfer.hpp"

namespace hss::detail {

class TransferSide {
 public:
  [[nodiscard]] virtual std::vector<MemoryRegion> memory_regions() const = 0;
  [[nodiscard]] virtual ChunkExport export_chunks(std::span<const Chunk> chunks,
                                                  std::span<const Slot> slots, size_t first_chunk,
                                                  std::chrono::milliseconds lease) = 0;
  virtual bool release_lease(uint64_t lease_id) noexcept = 0;
  [[nodiscard]] virtual std::pair<size_t, size_t> missing_range(
      std::span<const Chunk> chunks, std::span<const Slot> slots) const = 0;
  /// Fills `state` (its items and reserved extents) for the export's entries.
  virtual void reserve_import(std::span<const Chunk> chunks, const ChunkExport& source,
                              Reservation::State& state) = 0;
  virtual ImportResult publish_import(Reservation::State& state) = 0;
  /// Checks items [first, first + count) of a reservation (no lock); the failures.
  virtual size_t check_import(Reservation::State& state, size_t first, size_t count) const = 0;
  virtual void abandon_import(Reservation::State& state) noexcept = 0;
  [[nodiscard]] virtual std::optional<std::array<std::byte, kEntryMacBytes>> handshake_tag(
      std::string_view label, std::span<const std::byte> transcript) const = 0;

 protected:
  TransferSide() = default;
  ~TransferSide() = default;  // owned by the store, never through this interface
  TransferSide(const TransferSide&) = default;
  TransferSide& operator=(const TransferSide&) = default;
};

/// The store's transfer side (a friend of HiddenStateStore: the one door into it).
[[nodiscard]] TransferSide& transfer_side(HiddenStateStore& store);

}  // namespace hss::detail
