#include <cuda_runtime_api.h>

#include <string>

#include "base/log.hpp"
#include "datapath/cuda/cuda_raii.hpp"
#include "datapath/cuda_runtime.hpp"
#include "hss/error.hpp"

namespace hss::detail {

RuntimeInfo detect_runtime() {
  RuntimeInfo info;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    info.reason = status != cudaSuccess
                      ? std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status)
                      : std::string("no CUDA device found");
    clear_own_error(status);  // not the engine's to find in its last-error slot
    return info;
  }
  // Properties only: nothing here creates a context (an allocation would, on whatever device
  // is current: device 0 in every worker that has not selected one yet).
  bool mappable = true;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (const cudaError_t e = cudaGetDeviceProperties(&prop, i); e != cudaSuccess) {
      clear_own_error(e);
      continue;
    }
    info.devices.push_back(DeviceInfo{i, prop.name, prop.major, prop.minor,
                                      static_cast<uint64_t>(prop.totalGlobalMem)});
    mappable = mappable && prop.canMapHostMemory != 0 && prop.unifiedAddressing != 0;
  }
  info.device_available = !info.devices.empty();
  if (!info.device_available) info.reason = "device properties could not be read";
  info.pinned_memory = info.device_available && mappable;
  return info;
}

int store_device(const Config& config) {
  if (!cuda_device_available()) return -1;
  if (config.hidden_state_device < 0) {
    int current = 0;
    HSS_CUDA_CHECK(cudaGetDevice(&current));  // creates no context
    return current;
  }
  const auto count = static_cast<int64_t>(runtime_info().devices.size());
  if (config.hidden_state_device >= count) {
    throw ConfigError("hidden_state_device = " + std::to_string(config.hidden_state_device) +
                      " but the process sees " + std::to_string(count) + " CUDA device(s)");
  }
  return static_cast<int>(config.hidden_state_device);
}

void* pinned_host_alloc(size_t bytes, int device) {
  if (!cuda_device_available() || device < 0) return nullptr;
  void* ptr = nullptr;
  cudaError_t status = cudaSuccess;
  cuda::run_on_device(device, [&] {
    status = cudaHostAlloc(&ptr, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    clear_own_error(status);  // (on the helper thread: nobody else's slot)
  });
  if (status != cudaSuccess) {
    log(LogLevel::kWarn, std::string("cudaHostAlloc of ") + std::to_string(bytes) +
                             " bytes failed (" + cudaGetErrorString(status) +
                             "); hidden-state pool falls back to pageable memory");
    return nullptr;
  }
  return ptr;
}

void pinned_host_free(void* ptr, int device) noexcept {
  if (ptr == nullptr) return;
  try {
    cuda::run_on_device(device, [&] { clear_own_error(cudaFreeHost(ptr)); });
  } catch (...) {  // no thread, or the device is lost: free it here
    clear_own_error(cudaFreeHost(ptr));
  }
}

void* device_memory_alloc(size_t bytes, int device, std::string* error) {
  // Asked only with a device found (the store's device path exists; store_device() >= 0).
  void* ptr = nullptr;
  cudaError_t status = cudaSuccess;
  cuda::run_on_device(device, [&] {
    status = cudaMalloc(&ptr, bytes);
    clear_own_error(status);
  });
  if (status != cudaSuccess) {
    if (error != nullptr) *error = std::string(cudaGetErrorName(status)) + ": " +
                                   cudaGetErrorString(status);
    return nullptr;
  }
  return ptr;
}

void device_memory_free(void* ptr, int device) noexcept {
  if (ptr == nullptr) return;
  try {
    cuda::run_on_device(device, [&] { clear_own_error(cudaFree(ptr)); });
  } catch (...) {  // no thread, or the device is lost: free it here
    clear_own_error(cudaFree(ptr));
  }
}

}  // namespace hss::detail
