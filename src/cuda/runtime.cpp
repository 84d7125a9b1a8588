#include <cuda_runtime_api.h>

#include "cuda_runtime.hpp"
#include "log.hpp"

namespace hss::detail {

RuntimeInfo detect_runtime() {
  RuntimeInfo info;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    info.reason = status != cudaSuccess
                      ? std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status)
                      : std::string("no CUDA device found");
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return info;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    info.devices.push_back(DeviceInfo{i, prop.name, prop.major, prop.minor,
                                      static_cast<uint64_t>(prop.totalGlobalMem)});
  }
  info.device_available = !info.devices.empty();
  if (!info.device_available) info.reason = "device properties could not be read";
  if (info.device_available) {
    void* probe = nullptr;
    if (cudaHostAlloc(&probe, 4096, cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess) {
      info.pinned_memory = true;
      (void)cudaFreeHost(probe);
    } else {
      (void)cudaGetLastError();
    }
  }
  return info;
}

void* pinned_host_alloc(size_t bytes) {
  if (!cuda_device_available()) return nullptr;
  void* ptr = nullptr;
  const cudaError_t status =
      cudaHostAlloc(&ptr, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    log(LogLevel::kWarn, std::string("cudaHostAlloc of ") + std::to_string(bytes) +
                             " bytes failed (" + cudaGetErrorString(status) +
                             "); hidden-state pool falls back to pageable memory");
    return nullptr;
  }
  return ptr;
}

void pinned_host_free(void* ptr) noexcept {
  if (ptr != nullptr) (void)cudaFreeHost(ptr);
}

}  // namespace hss::detail
