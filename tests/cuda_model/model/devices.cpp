// Devices, contexts and errors of the model. Every device reports compute capability 9.0 with
// host memory mapping and unified addressing. As in CUDA 12 and later, cudaSetDevice initialises
// the device's primary context; cudaGetDeviceCount, cudaGetDeviceProperties, cudaGetDevice and
// cudaPointerGetAttributes create none.

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>

#include "model/names.hpp"
#include "model/state.hpp"

using namespace hss::cuda_model::detail;

cudaError_t cudaGetDeviceCount(int* count) {
  if (this_thread().in_host_func) return result(cudaErrorNotPermitted);
  if (count == nullptr) return result(cudaErrorInvalidValue);
  const Model& m = Model::get();
  *count = m.device_count;
  return m.device_count == 0 ? result(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (device == nullptr) return result(cudaErrorInvalidValue);
  *device = this_thread().device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  if (device < 0 || device >= m.device_count) return result(cudaErrorInvalidDevice);
  std::unique_lock lock(m.mutex);
  ThreadState& t = this_thread();
  t.device = device;
  t.device_set = true;
  init_context(m.devices[static_cast<size_t>(device)]);
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  const Model& m = Model::get();
  if (prop == nullptr) return result(cudaErrorInvalidValue);
  if (device < 0 || device >= m.device_count) return result(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "hsstore CUDA model %d", device);
  prop->totalGlobalMem = m.device_memory;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 2;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7FFFFFFF;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->canMapHostMemory = 1;
  prop->unifiedAddressing = 1;
  prop->asyncEngineCount = 2;
  prop->concurrentKernels = 1;
  prop->pciDeviceID = device;
  return cudaSuccess;
}

namespace hss::cuda_model::detail {
namespace {
// Bit p of g_peer_masks[d]: kernels of device d may access device p's memory.
std::array<std::atomic<uint32_t>, 8> g_peer_masks{};
std::atomic<bool> g_peer_supported{true};
}  // namespace

bool peer_access_enabled(int device, int peer) {
  if (device < 0 || device >= 8 || peer < 0 || peer >= 8) return false;
  const uint32_t mask = g_peer_masks[static_cast<size_t>(device)].load(std::memory_order_acquire);
  return (mask >> peer & 1U) != 0;
}

void set_peer_supported(bool supported) { g_peer_supported.store(supported); }
void clear_peer_access(int device) {
  g_peer_masks[static_cast<size_t>(device)].store(0, std::memory_order_release);
}
}  // namespace hss::cuda_model::detail

// Every pair of distinct devices can access each other unless a test says otherwise
// (cuda_model::set_peer_access_supported).
cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  const Model& m = Model::get();
  if (can == nullptr) return result(cudaErrorInvalidValue);
  if (device < 0 || device >= m.device_count || peer < 0 || peer >= m.device_count) {
    return result(cudaErrorInvalidDevice);
  }
  *can = device != peer && g_peer_supported.load() ? 1 : 0;
  return cudaSuccess;
}

// From the current device's context (created if needed), as CUDA does.
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  if (flags != 0) return result(cudaErrorInvalidValue);
  if (peer < 0 || peer >= m.device_count) return result(cudaErrorInvalidDevice);
  DeviceState& d = current_device(lock);
  if (peer == d.index || !g_peer_supported.load()) return result(cudaErrorPeerAccessUnsupported);
  auto& mask = g_peer_masks[static_cast<size_t>(d.index)];
  const uint32_t bit = 1U << peer;
  if ((mask.fetch_or(bit, std::memory_order_acq_rel) & bit) != 0) {
    return result(cudaErrorPeerAccessAlreadyEnabled);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceReset() {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  DeviceState& d = current_device(lock);
  // The primary context goes with everything it owned: memory, and the sticky error with it.
  free_device_allocations(d.index);
  d.device_bytes = 0;
  d.sticky = cudaSuccess;
  d.sticky_what.clear();
  d.loaded.clear();
  d.context = false;
  clear_peer_access(d.index);  // peer access belongs to the context
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  (void)Model::get();
  ThreadState& t = this_thread();
  Model& m = Model::get();
  if (m.device_count > 0) {
    std::unique_lock lock(m.mutex);
    // A sticky error cannot be cleared: every call keeps reporting it.
    if (const cudaError_t sticky = current_device(lock).sticky; sticky != cudaSuccess) {
      return sticky;
    }
  }
  return std::exchange(t.last, cudaSuccess);
}

cudaError_t cudaPeekAtLastError() {
  Model& m = Model::get();
  if (m.device_count > 0) {
    std::unique_lock lock(m.mutex);
    if (const cudaError_t sticky = current_device(lock).sticky; sticky != cudaSuccess) {
      return sticky;
    }
  }
  return this_thread().last;
}

const char* cudaGetErrorName(cudaError_t error) { return error_name(error); }

const char* cudaGetErrorString(cudaError_t error) { return error_string(error); }

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* driverStatus) {
  // The driver functions hsstore asks for: cuEventQuery (a query that leaves the runtime's
  // last-error slot alone; cuda_raii.cpp). Any other symbol is not found.
  if (symbol == nullptr || funcPtr == nullptr || cudaVersion < 2000 ||
      (flags & ~static_cast<unsigned long long>(cudaEnablePerThreadDefaultStream)) != 0) {
    return result(cudaErrorInvalidValue);
  }
  *funcPtr = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (std::strcmp(symbol, "cuEventQuery") == 0) {
    *funcPtr = reinterpret_cast<void*>(&driver_event_query);
    found = cudaDriverEntryPointSuccess;
  }
  if (driverStatus != nullptr) *driverStatus = found;
  return found == cudaDriverEntryPointSuccess ? cudaSuccess : result(cudaErrorSymbolNotFound);
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return result(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return result(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}
