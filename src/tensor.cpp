#include "hss/tensor.hpp"

#include <string>

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
  if (rows < 0 || cols < 0) {
    throw InvalidArgument("HostTensor: rows and cols must be >= 0, got rows=" +
                          std::to_string(rows) + " cols=" + std::to_string(cols));
  }
  buffer_ = detail::HostBuffer::acquire(std::max<size_t>(bytes(), 1));
}

}  // namespace hss
