#pragma once
// Tensor views and the owning float32 host tensor that retrieval returns.
//
// Views are plain values; a HostTensor is an ordinary value type (one object is not
// synchronised). Thread safety: docs/design.md, "What may run concurrently and what may block the
// host".

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "hss/detail/host_buffer.hpp"

// cudaStream_t is `CUstream_st*`: naming the struct keeps CUDA headers out of public headers while
// the type stays identical, so a cudaStream_t (or torch's stream handle) converts without a cast.
struct CUstream_st;

namespace hss {

/// A CUDA stream (identical to cudaStream_t). nullptr is the legacy default stream.
using Stream = CUstream_st*;

enum class DType { kFloat32, kFloat16, kBFloat16 };
enum class Device { kHost, kCuda };

/// Bytes of one element; 0 for a value outside the enum (views are checked with is_valid first).
[[nodiscard]] constexpr size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}
/// True for the enumerators (a cast integer may be anything; views are validated with these).
[[nodiscard]] constexpr bool is_valid(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}
[[nodiscard]] constexpr bool is_valid(Device device) {
  return device == Device::kHost || device == Device::kCuda;
}
[[nodiscard]] std::string_view to_string(DType dtype);
[[nodiscard]] std::string_view to_string(Device device);

/// Non-owning 2-D view, rows x cols. row_stride is in elements; 0 means contiguous (== cols).
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0;
  Device device = Device::kHost;
  int device_index = 0;

  [[nodiscard]] int64_t stride() const { return row_stride == 0 ? cols : row_stride; }
};

/// A writable view; the fields mean what they mean in TensorView.
struct MutableTensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0;
  Device device = Device::kHost;
  int device_index = 0;

  [[nodiscard]] int64_t stride() const { return row_stride == 0 ? cols : row_stride; }
  [[nodiscard]] TensorView as_const() const {
    return {data, dtype, rows, cols, row_stride, device, device_index};
  }
};

/// An owning, contiguous [rows, cols] float32 tensor in host memory. Its buffer comes from a
/// process-wide recycler (released buffers are reused, large ones are backed by huge pages), so a
/// fresh tensor per call does not pay a page fault per 4 KiB.
class HostTensor {
 public:
  HostTensor() = default;
  /// Uninitialised contents. rows, cols >= 0, else InvalidArgument.
  HostTensor(int64_t rows, int64_t cols);

  [[nodiscard]] int64_t rows() const { return rows_; }
  [[nodiscard]] int64_t cols() const { return cols_; }
  [[nodiscard]] int64_t numel() const { return rows_ * cols_; }
  [[nodiscard]] size_t bytes() const { return static_cast<size_t>(numel()) * sizeof(float); }
  [[nodiscard]] float* data() { return static_cast<float*>(buffer_.data()); }
  [[nodiscard]] const float* data() const { return static_cast<const float*>(buffer_.data()); }
  [[nodiscard]] std::span<float> values() { return {data(), static_cast<size_t>(numel())}; }
  [[nodiscard]] std::span<const float> values() const {
    return {data(), static_cast<size_t>(numel())};
  }
  [[nodiscard]] std::span<const float> row(int64_t r) const {
    return {data() + r * cols_, static_cast<size_t>(cols_)};
  }
  [[nodiscard]] TensorView view() const {
    return {data(), DType::kFloat32, rows_, cols_, 0, Device::kHost, 0};
  }
  [[nodiscard]] MutableTensorView mutable_view() {
    return {data(), DType::kFloat32, rows_, cols_, 0, Device::kHost, 0};
  }

 private:
  detail::HostBuffer buffer_;
  int64_t rows_ = 0, cols_ = 0;
};

}  // namespace hss
