#pragma once
// Checked size arithmetic and the documented size limits of hsstore's tensors and chunks.
//
// Every product of caller-controlled sizes (rows * cols * element size, chunk_size * hidden dim,
// KV bytes) goes through these helpers, so a huge value is an InvalidArgument/ConfigError and never
// a wrapped size. The limits keep every byte count of one chunk or one tensor far below 2^63:
// chunk 2^20 tokens x 2^24 columns x 8 bytes = 2^47.
//
// Thread safety: pure functions and constants.

#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "hss/error.hpp"
#include "hss/tensor.hpp"

namespace hss::limits {

/// Largest chunk_size accepted by Config::validate and the token databases (tokens per chunk).
inline constexpr int64_t kMaxChunkSize = int64_t{1} << 20;
/// Largest number of columns (hidden dim, KV row width in elements) of a tensor or view.
inline constexpr int64_t kMaxCols = int64_t{1} << 24;
/// Largest number of rows (tokens) of a tensor or view.
inline constexpr int64_t kMaxRows = int64_t{1} << 31;
/// Largest row stride of a view, in elements.
inline constexpr int64_t kMaxRowStride = int64_t{1} << 32;
/// Largest byte span of one view: beyond any address space (the kernels' layout relies on it).
inline constexpr int64_t kMaxViewBytes = int64_t{1} << 48;
/// Pool granules (hidden_state_block_bytes): multiples of the smallest, at most the largest.
inline constexpr uint64_t kMinGranuleBytes = 64;
inline constexpr uint64_t kMaxGranuleBytes = uint64_t{64} << 20;

}  // namespace hss::limits

namespace hss::detail {

/// a * b, or nullopt when it does not fit in int64_t (or either operand is negative).
[[nodiscard]] constexpr std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  if (a < 0 || b < 0) return std::nullopt;
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

/// a + b, or nullopt when it does not fit in int64_t (or either operand is negative).
[[nodiscard]] constexpr std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  if (a < 0 || b < 0) return std::nullopt;
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

/// Throws the InvalidArgument of mul_or_throw (out of line: the check stays a few instructions
/// on the hot paths that compute sizes per chunk).
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_mul_overflow(int64_t a, int64_t b,
                                                                      std::string_view what) {
  throw InvalidArgument(std::string(what) + ": " + std::to_string(a) + " * " + std::to_string(b) +
                        " does not fit in a 64-bit size");
}

/// a * b, or InvalidArgument naming `what` and both operands.
[[nodiscard]] inline int64_t mul_or_throw(int64_t a, int64_t b, std::string_view what) {
  if (const auto out = checked_mul(a, b)) [[likely]]
    return *out;
  throw_mul_overflow(a, b, what);
}

/// The view limits, stated once (check_view_shape, view_span_bytes and the store's one-expression
/// view check all use these two): 0 <= rows <= kMaxRows, 0 < cols <= kMaxCols, row_stride 0 or in
/// [cols, kMaxRowStride].
[[nodiscard]] constexpr bool view_dims_ok(int64_t rows, int64_t cols, int64_t row_stride) noexcept {
  return rows >= 0 && rows <= limits::kMaxRows && cols > 0 && cols <= limits::kMaxCols &&
         (row_stride == 0 || (row_stride >= cols && row_stride <= limits::kMaxRowStride));
}
/// The byte span of rows x cols with row_stride of dtype, (rows - 1) * stride + cols elements, or
/// nullopt beyond kMaxViewBytes. Requires view_dims_ok and a valid dtype: then the element count
/// is below 2^63 (2^31 rows of stride 2^32), and the element sizes (powers of two) divide 2^48, so
/// the limit in elements is a shift, with no multiply that could wrap.
[[nodiscard]] constexpr std::optional<int64_t> view_span_if_within_limit(
    DType dtype, int64_t rows, int64_t cols, int64_t row_stride) noexcept {
  if (rows == 0) return int64_t{0};
  const int64_t stride = row_stride == 0 ? cols : row_stride;
  const int64_t elems = (rows - 1) * stride + cols;
  const int shift = std::countr_zero(element_size(dtype));
  if (elems > (limits::kMaxViewBytes >> shift)) return std::nullopt;
  return elems << shift;
}

/// Checks the shape of a view against the limits (hss::limits): dtype and device are enumerators,
/// 0 <= rows <= kMaxRows, 0 < cols <= kMaxCols, row_stride 0 or in [cols, kMaxRowStride].
/// Throws InvalidArgument naming `name` and the field. Says nothing about data or device index.
void check_view_shape(DType dtype, Device device, int64_t rows, int64_t cols, int64_t row_stride,
                      std::string_view name);

/// Bytes spanned by rows x cols with row_stride (elements) of dtype: (rows - 1) * stride + cols
/// elements. InvalidArgument beyond kMaxViewBytes. Call after check_view_shape.
[[nodiscard]] int64_t view_span_bytes(DType dtype, int64_t rows, int64_t cols, int64_t row_stride,
                                      std::string_view name = "view");

}  // namespace hss::detail
