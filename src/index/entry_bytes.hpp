#pragma once
// An entry's payload as the pool holds it: the pieces of its granules, in order (entries fill
// whole granules but the last). How a backing tier borrows an entry's bytes, and how a value
// from a tier or a P/D producer fills a fresh entry.
//
// Thread safety: free functions over the caller's objects; the caller makes sure nobody else
// writes the granules (a PENDING entry for fill_entry, a READY one for entry_pieces).

#include <cstddef>
#include <span>
#include <vector>

#include "index/store_index.hpp"
#include "pool/block_pool.hpp"

namespace hss::detail {

/// The entry's payload as pieces of its granules, in order.
[[nodiscard]] std::vector<std::span<const std::byte>> entry_pieces(const Entry& entry,
                                                                   const BlockPool& pool);
/// Copies a payload into the entry's granules (sizes must match: InvalidArgument).
void fill_entry(const Entry& entry, const BlockPool& pool, std::span<const std::byte> payload);

}  // namespace hss::detail
