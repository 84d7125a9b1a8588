#include "hss/pool_transfer.hpp"

#include <string>

#include "hss/error.hpp"
#include "store/import_state.hpp"
#include "store/transfer_side.hpp"

namespace hss {

PoolTransfer::PoolTransfer(HiddenStateStore& store) : store_(&store) {}

namespace {
detail::TransferSide& side_of(HiddenStateStore* store) { return detail::transfer_side(*store); }
}  // namespace

std::vector<MemoryRegion> PoolTransfer::memory_regions() const {
  return side_of(store_).memory_regions();
}

ChunkExport PoolTransfer::export_chunks(std::span<const Chunk> chunks, std::span<const Slot> slots,
                                        size_t first_chunk, std::chrono::milliseconds lease) {
  return side_of(store_).export_chunks(chunks, slots, first_chunk, lease);
}

bool PoolTransfer::release_lease(uint64_t lease_id) noexcept {
  return side_of(store_).release_lease(lease_id);
}

std::pair<size_t, size_t> PoolTransfer::missing_range(std::span<const Chunk> chunks,
                                                      std::span<const Slot> slots) const {
  return side_of(store_).missing_range(chunks, slots);
}

std::optional<std::array<std::byte, kEntryMacBytes>> PoolTransfer::handshake_tag(
    std::string_view label, std::span<const std::byte> transcript) const {
  return side_of(store_).handshake_tag(label, transcript);
}

Reservation PoolTransfer::reserve(std::span<const Chunk> chunks, const ChunkExport& source) {
  Reservation reservation;
  reservation.state_ = std::make_unique<Reservation::State>();
  reservation.state_->store = &side_of(store_);
  side_of(store_).reserve_import(chunks, source, *reservation.state_);
  return reservation;
}

Reservation::Reservation() noexcept = default;
Reservation::Reservation(Reservation&&) noexcept = default;
Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    abandon();
    state_ = std::move(other.state_);
  }
  return *this;
}
Reservation::~Reservation() { abandon(); }

std::span<const Reservation::Reserved> Reservation::entries() const {
  if (!state_) return {};
  return state_->reserved;
}

uint64_t Reservation::bytes() const {
  uint64_t total = 0;
  if (state_) {
    for (const auto& item : state_->items) total += item.entry->payload_bytes();
  }
  return total;
}

size_t Reservation::chunks_covered() const { return state_ ? state_->chunks_covered : 0; }

size_t Reservation::check(size_t first, size_t count) {
  const size_t size = state_ ? state_->items.size() : 0;
  if (first > size || count > size - first) {
    throw InvalidArgument("check(first = " + std::to_string(first) +
                          ", count = " + std::to_string(count) + ") is past the " +
                          std::to_string(size) + " reserved entries");
  }
  return count == 0 ? 0 : state_->store->check_import(*state_, first, count);
}

ImportResult Reservation::publish() {
  if (!state_ || state_->items.empty()) return {};
  return state_->store->publish_import(*state_);
}

void Reservation::abandon() noexcept {
  if (state_) state_->store->abandon_import(*state_);
}

std::vector<TransferPiece> transfer_pieces(const ChunkExport& source,
                                           const Reservation& reservation) {
  return transfer_pieces(source, reservation, 0, reservation.entries().size());
}

std::vector<TransferPiece> transfer_pieces(const ChunkExport& source,
                                           const Reservation& reservation, size_t first,
                                           size_t count) {
  const auto entries = reservation.entries();
  if (first > entries.size() || count > entries.size() - first) {
    throw InvalidArgument("transfer_pieces(first = " + std::to_string(first) +
                          ", count = " + std::to_string(count) + ") is past the " +
                          std::to_string(entries.size()) + " reserved entries");
  }
  std::vector<TransferPiece> pieces;
  for (const Reservation::Reserved& r : entries.subspan(first, count)) {
    if (r.source_entry >= source.entries.size()) {
      throw InvalidArgument("reservation entry " + std::to_string(r.source_entry) +
                            " is not an entry of this export");
    }
    const std::vector<Extent>& remote = source.entries[r.source_entry].extents;
    const std::vector<Extent>& local = r.extents;
    size_t ri = 0, li = 0;
    uint64_t roff = 0, loff = 0;
    while (ri < remote.size() && li < local.size()) {
      const uint64_t n = std::min(remote[ri].bytes - roff, local[li].bytes - loff);
      const TransferPiece piece{local[li].addr + loff, remote[ri].addr + roff, n};
      if (!pieces.empty() && pieces.back().local_addr + pieces.back().bytes == piece.local_addr &&
          pieces.back().remote_addr + pieces.back().bytes == piece.remote_addr) {
        pieces.back().bytes += n;
      } else {
        pieces.push_back(piece);
      }
      roff += n;
      loff += n;
      if (roff == remote[ri].bytes) ++ri, roff = 0;
      if (loff == local[li].bytes) ++li, loff = 0;
    }
    if (ri != remote.size() || li != local.size()) {
      throw InvalidArgument("source entry " + std::to_string(r.source_entry) +
                            " and its reservation differ in length");
    }
  }
  return pieces;
}

}  // namespace hss
