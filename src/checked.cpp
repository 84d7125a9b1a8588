#include "hss/detail/checked.hpp"

#include <string>

#include "hss/kernels/layout.hpp"

namespace hss::detail {

static_assert(limits::kMaxViewBytes == kernels::kMaxViewBytes, "one limit, two headers");

namespace {

// The error path of check_view_shape, out of line: the accepted shape costs a few compares and
// builds no string (this runs once per view of every call).
[[noreturn, gnu::cold, gnu::noinline]] void throw_bad_shape(DType dtype, Device device,
                                                            int64_t rows, int64_t cols,
                                                            int64_t row_stride,
                                                            std::string_view name) {
  const std::string n(name);
  if (!hss::is_valid(dtype)) {
    throw InvalidArgument(n + ".dtype = " + std::to_string(static_cast<int>(dtype)) +
                          " is not a DType");
  }
  if (!hss::is_valid(device)) {
    throw InvalidArgument(n + ".device = " + std::to_string(static_cast<int>(device)) +
                          " is not a Device");
  }
  if (rows < 0 || rows > limits::kMaxRows) {
    throw InvalidArgument(n + ".rows = " + std::to_string(rows) + " is outside [0, 2^31]");
  }
  if (cols <= 0 || cols > limits::kMaxCols) {
    throw InvalidArgument(n + ".cols = " + std::to_string(cols) + " is outside [1, 2^24]");
  }
  throw InvalidArgument(n + ".row_stride = " + std::to_string(row_stride) +
                        " must be 0 or in [cols = " + std::to_string(cols) + ", 2^32]");
}

}  // namespace

void check_view_shape(DType dtype, Device device, int64_t rows, int64_t cols, int64_t row_stride,
                      std::string_view name) {
  const bool ok = hss::is_valid(dtype) && hss::is_valid(device) && rows >= 0 &&
                  rows <= limits::kMaxRows && cols > 0 && cols <= limits::kMaxCols &&
                  (row_stride == 0 || (row_stride >= cols && row_stride <= limits::kMaxRowStride));
  if (!ok) [[unlikely]]
    throw_bad_shape(dtype, device, rows, cols, row_stride, name);
}

int64_t view_span_bytes(DType dtype, int64_t rows, int64_t cols, int64_t row_stride,
                        std::string_view name) {
  if (rows == 0) return 0;
  const int64_t stride = row_stride == 0 ? cols : row_stride;
  const int64_t elems =
      mul_or_throw(rows - 1, stride, "view rows * row_stride") + cols;  // <= 2^63 by the limits
  const int64_t bytes =
      mul_or_throw(elems, static_cast<int64_t>(element_size(dtype)), "view bytes");
  if (bytes > limits::kMaxViewBytes) {
    throw InvalidArgument(std::string(name) + ": " + std::to_string(rows) +
                          " rows with row_stride " + std::to_string(stride) + " spans " +
                          std::to_string(bytes) + " bytes, more than 2^48");
  }
  return bytes;
}

}  // namespace hss::detail
