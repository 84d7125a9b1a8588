#pragma once
// hsstore's CUDA calls and an engine's CUDA graph captures. In CUDA's default (global) capture
// mode, a potentially unsafe call (an event or stream query or synchronisation, an allocation)
// made by any thread while some thread captures in global mode fails and invalidates that
// capture. hsstore's own calls never belong to an engine's capture (a device call on a capturing
// stream is refused: CudaDevicePath::check_stream), so they run in relaxed mode: they neither
// fail nor break the engine's graph. Calls that conflict with a capture by nature (querying an
// event recorded in it, synchronising a capturing stream) are still refused by CUDA.

#include <cuda_runtime_api.h>

#include "hss/kernels/cuda_check.hpp"

namespace hss::detail::cuda {

/// The calling thread's capture interaction mode is relaxed for the scope, then restored.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() noexcept {
    clear_own_error(cudaThreadExchangeStreamCaptureMode(&previous_));
  }
  ~RelaxedCaptureMode() { clear_own_error(cudaThreadExchangeStreamCaptureMode(&previous_)); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace hss::detail::cuda
