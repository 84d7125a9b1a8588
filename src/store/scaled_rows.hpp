#pragma once
// The row x granule walk of a scaled entry (8-bit storage, ScaleLayout::kRowF32Trailing,
// format/row_format.hpp), in one place: the write pipeline plans its quantising segments by it
// and the read pipeline its dequantising ones, so a change of the layout (where a row's scale
// lies, how a row is cut at granule ends) is made once and both sides stay the same bytes.

#include <cstddef>
#include <cstdint>

#include "hss/kernels/layout.hpp"
#include "store/store_state.hpp"

namespace hss::detail {

/// Walks rows [first_row, entry.rows) of `entry`: for each row, its scale's address (4 bytes of
/// the trailing scale block) and the row's codes cut into the pieces that lie in one granule.
/// Calls visit(scale, codes, first_elem, count) per piece: the row's scale, the piece's first
/// code in the pool (host pool or device tier, the entry's home), the piece's first element
/// (flat, entry-relative) and its element count. A segment never spans two rows (one scale
/// each). Nothing for an unscaled entry. Reads no lock-guarded state: the caller pins `entry`.
template <typename Visit>
void for_each_scaled_piece(const StoreState& store, const Entry& entry, int64_t first_row,
                           Visit&& visit) {
  switch (entry.format.scales) {
    case ScaleLayout::kRowF32Trailing:
      break;
    case ScaleLayout::kNone:
      return;
  }
  const auto granule = static_cast<uint64_t>(store.pool().granule_bytes());
  const uint64_t scale_offset = RowFormat::scale_offset(entry.rows, entry.cols);
  const BlockPool& home = store.home_pool(entry);
  for (int64_t r = first_row; r < entry.rows; ++r) {
    const uint64_t at = scale_offset + 4 * static_cast<uint64_t>(r);
    std::byte* scale =
        home.block_address(entry.blocks[static_cast<size_t>(at / granule)]) + at % granule;
    kernels::for_each_block_piece(
        r * entry.cols, entry.cols, 1, static_cast<int64_t>(granule),
        [&](int64_t block, int64_t byte_offset, int64_t first, int64_t count) {
          std::byte* codes =
              home.block_address(entry.blocks[static_cast<size_t>(block)]) + byte_offset;
          visit(scale, codes, first, count);
        });
  }
}

}  // namespace hss::detail
