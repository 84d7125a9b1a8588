#pragma once
// How an entry's rows are encoded in its bytes: the element type and, for a quantised type,
// where the per-row scales live. The one answer to "how many bytes does an entry of rows x cols
// take", for the pool, the tiers, the codec and the P/D wire alike.
//
// Today every storage type is a plain 16- or 32-bit float: no scales. FP8 (the tiers issue)
// adds a ScaleLayout, and the switches below, built with -Werror=switch-enum, show each place
// that must learn it.
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
};

struct RowFormat {
  kernels::ElemType elem = kernels::ElemType::kFloat32;
  ScaleLayout scales = ScaleLayout::kNone;

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
    }
    return data;
  }

  friend constexpr bool operator==(const RowFormat&, const RowFormat&) = default;
};

}  // namespace hss::detail
