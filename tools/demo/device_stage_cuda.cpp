// The CUDA staging buffers of hss-demo (CUDA runtime only, never the driver library).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "demo/device_stage.hpp"
#include "hss/build_info.hpp"

namespace hss::demo {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("hss-demo: ") + what + ": " + cudaGetErrorString(status));
  }
}

/// One growing device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* reserve(size_t bytes) {
    if (bytes > capacity_) {
      if (data_ != nullptr) check(cudaFree(data_), "cudaFree");
      data_ = nullptr;
      check(cudaMalloc(&data_, bytes), "cudaMalloc");
      capacity_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

class CudaStage final : public DeviceStage {
 public:
  explicit CudaStage(std::string name) : name_(std::move(name)) {}

  TensorView upload_bf16(std::span<const uint16_t> host, int64_t rows, int64_t cols) override {
    void* dst = input_.reserve(host.size_bytes());
    check(cudaMemcpy(dst, host.data(), host.size_bytes(), cudaMemcpyHostToDevice), "upload");
    return {dst, DType::kBFloat16, rows, cols, 0, Device::kCuda, 0};
  }

  MutableTensorView output(int64_t rows, int64_t cols) override {
    void* dst = output_.reserve(static_cast<size_t>(rows * cols) * sizeof(float));
    return {dst, DType::kFloat32, rows, cols, 0, Device::kCuda, 0};
  }

  void download(const MutableTensorView& device, int64_t rows, std::span<float> host) override {
    const size_t bytes = static_cast<size_t>(rows * device.cols) * sizeof(float);
    if (host.size_bytes() < bytes)
      throw std::invalid_argument("hss-demo: download target too small");
    check(cudaMemcpy(host.data(), device.data, bytes, cudaMemcpyDeviceToHost), "download");
  }

  std::string name() const override { return name_; }

 private:
  std::string name_;
  DeviceBuffer input_, output_;
};

}  // namespace

std::unique_ptr<DeviceStage> DeviceStage::create(std::string& why_not) {
  const RuntimeInfo& runtime = runtime_info();
  if (!runtime.device_available || runtime.devices.empty()) {
    why_not = runtime.reason.empty() ? "no CUDA device found" : runtime.reason;
    return nullptr;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  return std::make_unique<CudaStage>(runtime.devices.front().name);
}

}  // namespace hss::demo
