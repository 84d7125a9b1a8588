// The consumer's own CUDA code (HSS_CONSUMER_CUDA): a consumer that enables CUDA in its project
// links one CUDA runtime, libcudart.so, beside hsstore's (tests/consumer/consumer_test.cmake).
#include <cuda_runtime_api.h>

__global__ void consumer_scale(float* data, float factor, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) data[i] *= factor;
}

/// Launches nothing when there is no device; returns the runtime's answer to the device count.
int consumer_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}
