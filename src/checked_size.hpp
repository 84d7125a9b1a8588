#pragma once
// Checked size arithmetic for byte counts computed from caller-supplied shapes.

#include <cstdint>
#include <string>

#include "hss/error.hpp"

namespace hss::detail {

/// rows x cols x element bytes, all >= 0; InvalidArgument naming the shape when it overflows.
[[nodiscard]] inline uint64_t checked_bytes(int64_t rows, int64_t cols, int64_t esize) {
  uint64_t elems = 0, bytes = 0;
  if (rows < 0 || cols < 0 || esize < 0 ||
      __builtin_mul_overflow(static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), &elems) ||
      __builtin_mul_overflow(elems, static_cast<uint64_t>(esize), &bytes) ||
      bytes > static_cast<uint64_t>(INT64_MAX)) {
    throw InvalidArgument("size of " + std::to_string(rows) + " x " + std::to_string(cols) +
                          " elements of " + std::to_string(esize) + " bytes overflows 63 bits");
  }
  return bytes;
}

}  // namespace hss::detail
