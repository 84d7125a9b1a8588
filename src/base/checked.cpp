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
  const bool ok =
      hss::is_valid(dtype) && hss::is_valid(device) && view_dims_ok(rows, cols, row_stride);
  if (!ok) [[unlikely]]
    throw_bad_shape(dtype, device, rows, cols, row_stride, name);
}

int64_t view_span_bytes(DType dtype, int64_t rows, int64_t cols, int64_t row_stride,
                        std::string_view name) {
  // The precondition of view_span_if_within_limit, checked (the device is not this function's).
  check_view_shape(dtype, Device::kHost, rows, cols, row_stride, name);
  if (const auto bytes = view_span_if_within_limit(dtype, rows, cols, row_stride)) [[likely]]
    return *bytes;
  const int64_t stride = row_stride == 0 ? cols : row_stride;
  throw InvalidArgument(std::string(name) + ": " + std::to_string(rows) + " rows with row_stride " +
                        std::to_string(stride) + " span " +
                        std::to_string((rows - 1) * stride + cols) + " elements of " +
                        std::to_string(element_size(dtype)) + " bytes, more than 2^48 bytes");
}

}  // namespace hss::detail
