#pragma once
// How an entry's rows are encoded in its bytes: the element type and, for a quantised type,
// where the per-row scales live. The one answer to "how many bytes does an entry of rows x cols
// take", for the pool, the tiers, the codec and the P/D wire alike.
//
// Where the scales of an 8-bit (FP8) entry live: ScaleLayout::kRowF32Trailing, a trailing block.
//   bytes [0, rows x cols)                      the codes, row-major, one byte each
//   bytes [scale_offset, scale_offset + 4 rows) row r's float32 scale at scale_offset + 4 r,
//                                               scale_offset = rows x cols rounded up to 16
// Why trailing, not a scale before or after each row:
//   * the codes keep the element layout of every other type (element e at byte e x esize), so
//     kernels::for_each_block_piece, the write and read planners' granule walk, the host copy's
//     split over threads and a row's 16-byte alignment in the pool stay as they are;
//   * an entry spans several pool granules (index/entry_bytes.hpp: entry_pieces hands a tier the
//     payload as pieces, in order). Granules are multiples of 64 bytes and scale_offset is a
//     multiple of 16, so no 4-byte scale straddles two granules (a per-row prefix would put row
//     boundaries, and scales, anywhere in a granule); the planners find row r's scale with one
//     division, like an element;
//   * the payload is still one contiguous byte string (pieces in order) for the tiers' values
//     and the P/D export: nothing there needs to know where the scales are.
// On the wire: the value codec's header names the whole RowFormat by one code (dtype_codes.hpp:
// 3 = fp8_e4m3 with kRowF32Trailing scales, 4 = fp8_e5m2), so the disk and remote tiers and the
// P/D export carry an FP8 entry's payload, scales included, as they carry any other.
//
// A plain value: safe to copy and read from any thread.

#include <cstdint>
#include <optional>

#include "hss/detail/checked.hpp"
#include "hss/kernels/convert.hpp"

namespace hss::detail {

/// Where a quantised type's per-row scales live (kNone: the type has no scales).
enum class ScaleLayout : uint8_t {
  kNone,
  kRowF32Trailing,  ///< one float32 per row, in a block after the codes (above)
};

/// A kRowF32Trailing entry's scale block starts at a multiple of this many bytes.
inline constexpr uint64_t kScaleBlockAlign = 16;

struct RowFormat {
  kernels::ElemType elem = kernels::ElemType::kFloat32;
  ScaleLayout scales = ScaleLayout::kNone;

  /// The format the store writes for storage type `elem`: scales for the 8-bit types.
  [[nodiscard]] static constexpr RowFormat of(kernels::ElemType elem) {
    return {elem, kernels::is_scaled(elem) ? ScaleLayout::kRowF32Trailing : ScaleLayout::kNone};
  }

  /// Byte offset of row 0's scale in the payload (kRowF32Trailing; rows x cols already checked).
  [[nodiscard]] static constexpr uint64_t scale_offset(int64_t rows, int64_t cols) {
    const uint64_t codes = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
    return (codes + kScaleBlockAlign - 1) / kScaleBlockAlign * kScaleBlockAlign;
  }

  /// Bytes of rows x cols in this format (scales included); nullopt when it overflows.
  [[nodiscard]] constexpr std::optional<uint64_t> checked_payload_bytes(int64_t rows,
                                                                       int64_t cols) const {
    const auto elems = checked_mul(rows, cols);
    if (!elems) return std::nullopt;
    const auto data = checked_mul(*elems, static_cast<int64_t>(kernels::elem_bytes(elem)));
    if (!data) return std::nullopt;
    switch (scales) {
      case ScaleLayout::kNone:
        return static_cast<uint64_t>(*data);
      case ScaleLayout::kRowF32Trailing: {
        const auto padded = checked_add(*data, static_cast<int64_t>(kScaleBlockAlign - 1));
        if (!padded) return std::nullopt;
        const int64_t codes = *padded / static_cast<int64_t>(kScaleBlockAlign) *
                              static_cast<int64_t>(kScaleBlockAlign);
        const auto scale_bytes = checked_mul(rows, int64_t{4});
        if (!scale_bytes) return std::nullopt;
        const auto total = checked_add(codes, *scale_bytes);
        if (!total) return std::nullopt;
        return static_cast<uint64_t>(*total);
      }
    }
    return std::nullopt;
  }
  /// The same for a shape already checked (an entry's: its rows and cols were validated when it
  /// was planned, and its payload fits in the pool), unchecked: it is on every grant's path.
  [[nodiscard]] constexpr uint64_t payload_bytes(int64_t rows, int64_t cols) const {
    const uint64_t data =
        static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) * kernels::elem_bytes(elem);
    switch (scales) {
      case ScaleLayout::kNone:
        return data;
      case ScaleLayout::kRowF32Trailing:
        return scale_offset(rows, cols) + 4 * static_cast<uint64_t>(rows);
    }
    return data;
  }

  friend constexpr bool operator==(const RowFormat&, const RowFormat&) = default;
};

}  // namespace hss::detail
