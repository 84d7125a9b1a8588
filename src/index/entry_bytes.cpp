#include "index/entry_bytes.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "hss/error.hpp"

namespace hss::detail {

std::vector<std::span<const std::byte>> entry_pieces(const Entry& entry, const BlockPool& pool) {
  std::vector<std::span<const std::byte>> pieces;
  pieces.reserve(entry.blocks.size());
  uint64_t left = entry.payload_bytes();
  const uint64_t block_bytes = pool.granule_bytes();
  for (const uint32_t id : entry.blocks) {
    if (left == 0) break;
    const uint64_t n = std::min(left, block_bytes);
    pieces.emplace_back(pool.block_address(id), static_cast<size_t>(n));
    left -= n;
  }
  return pieces;
}

void fill_entry(const Entry& entry, const BlockPool& pool, std::span<const std::byte> payload) {
  if (payload.size() != entry.payload_bytes()) {
    throw InvalidArgument("payload of " + std::to_string(payload.size()) +
                          " bytes for an entry of " + std::to_string(entry.payload_bytes()));
  }
  size_t at = 0;
  const uint64_t block_bytes = pool.granule_bytes();
  for (const uint32_t id : entry.blocks) {
    if (at == payload.size()) break;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(payload.size() - at, block_bytes));
    std::memcpy(pool.block_address(id), payload.data() + at, n);
    at += n;
  }
}

}  // namespace hss::detail
