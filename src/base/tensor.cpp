#include "hss/tensor.hpp"

#include <algorithm>
#include <string>

#include "hss/detail/checked.hpp"
#include "hss/error.hpp"

namespace hss {

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

std::string_view to_string(Device device) { return device == Device::kHost ? "host" : "cuda"; }

HostTensor::HostTensor(int64_t rows, int64_t cols) : rows_(rows), cols_(cols) {
  // Limits of hss/detail/checked.hpp: rows <= 2^31, cols <= 2^24, so rows * cols * 4 <= 2^57.
  if (rows < 0 || cols < 0 || rows > limits::kMaxRows || cols > limits::kMaxCols) {
    throw InvalidArgument("HostTensor: rows must be in [0, 2^31] and cols in [0, 2^24], got rows=" +
                          std::to_string(rows) + " cols=" + std::to_string(cols));
  }
  const int64_t bytes =
      detail::mul_or_throw(detail::mul_or_throw(rows, cols, "HostTensor rows * cols"),
                           sizeof(float), "HostTensor bytes");
  buffer_ = detail::HostBuffer::acquire(std::max<size_t>(static_cast<size_t>(bytes), 1));
}

}  // namespace hss
