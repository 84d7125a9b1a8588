#pragma once
// The store's side of the pool transfer (hss/pool_transfer.hpp): exports under a lease, imports
// into reserved PENDING entries, checked before they are published. Implements TransferSide.
//
// Locks: the index mutex for index updates only (as everywhere); hashing, MACs and the lease
// table's mutex are never under it.

#include "store/read_pipeline.hpp"
#include "store/store_state.hpp"
#include "store/transfer_side.hpp"

namespace hss::detail {

class StoreTransfer final : public TransferSide {
 public:
  StoreTransfer(StoreState& store, ReadPipeline& read) : store_(store), read_(read) {}

  std::vector<MemoryRegion> memory_regions() const override;
  ChunkExport export_chunks(std::span<const Chunk> chunks, std::span<const Slot> slots,
                            size_t first_chunk, std::chrono::milliseconds lease) override;
  bool release_lease(uint64_t lease_id) noexcept override;
  std::pair<size_t, size_t> missing_range(std::span<const Chunk> chunks,
                                          std::span<const Slot> slots) const override;
  void reserve_import(std::span<const Chunk> chunks, const ChunkExport& source,
                      Reservation::State& state) override;
  ImportResult publish_import(Reservation::State& state) override;
  size_t check_import(Reservation::State& state, size_t first, size_t count) const override;
  void abandon_import(Reservation::State& state) noexcept override;
  std::optional<std::array<std::byte, kEntryMacBytes>> handshake_tag(
      std::string_view label, std::span<const std::byte> transcript) const override;

 private:
  /// Counts a refused export and throws: InvalidArgument (`bad_request`) or hss::Error.
  [[noreturn]] void refuse_export(const std::string& why, bool bad_request) const;

  StoreState& store_;
  ReadPipeline& read_;
};

}  // namespace hss::detail
