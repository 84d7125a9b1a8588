#pragma once
// Device staging for hss-demo: where a real engine's tensors live when a GPU is present. The demo
// uploads the thinker's rows before storing them and restores into device memory, so the store's
// CUDA data path is what moves the bytes. Built without CUDA, create() always returns nullptr.
//
// Thread safety: one DeviceStage per thread. All copies run on the legacy default stream, which
// orders them after the store's own work on that stream (the demo passes stream = nullptr).

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "hss/tensor.hpp"

namespace hss::demo {

class DeviceStage {
 public:
  virtual ~DeviceStage() = default;

  /// nullptr when no device is usable; `why_not` then says why.
  [[nodiscard]] static std::unique_ptr<DeviceStage> create(std::string& why_not);

  /// Copies bfloat16 rows to a device buffer reused by the next upload (ordered on the stream).
  [[nodiscard]] virtual TensorView upload_bf16(std::span<const uint16_t> host, int64_t rows,
                                               int64_t cols) = 0;
  /// A float32 device buffer of at least rows x cols, reused by the next call.
  [[nodiscard]] virtual MutableTensorView output(int64_t rows, int64_t cols) = 0;
  /// Waits for the stream and copies rows x cols floats of `device` into `host`.
  virtual void download(const MutableTensorView& device, int64_t rows, std::span<float> host) = 0;
  [[nodiscard]] virtual std::string name() const = 0;
};

}  // namespace hss::demo
