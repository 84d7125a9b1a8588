#pragma once
// The process's view of the CUDA runtime, shared by the store and the tools. With no device or no
// driver (cudaErrorInsufficientDriver, cudaErrorNoDevice) everything here reports "unavailable"
// and the library runs on the host path. Detection runs once; all functions are thread-safe.

#include <cstddef>
#include <string>

#include "hss/build_info.hpp"
#include "hss/config.hpp"

namespace hss::detail {

/// True when a CUDA device is usable (detected once, logged once).
[[nodiscard]] bool cuda_device_available();

/// The store's device for `config` (Config::hidden_state_device; -1: the calling thread's current
/// device, asked without creating a context), or -1 without a usable device. ConfigError when it
/// names a device the process does not see.
[[nodiscard]] int store_device(const Config& config);

/// Page-locked, device-mapped, portable host memory allocated on `device` (by a helper thread, so
/// the caller's current device is untouched and no other device gets a context), or nullptr when
/// no device is available or the allocation fails (the caller falls back to ordinary pages).
[[nodiscard]] void* pinned_host_alloc(size_t bytes, int device);
/// Frees what pinned_host_alloc(…, device) returned, on that device (as it was allocated).
void pinned_host_free(void* ptr, int device) noexcept;

/// Device memory (cudaMalloc) on `device` (a device the process sees), allocated by a helper
/// thread as pinned_host_alloc is: the device-resident tier's arena. nullptr when the allocation
/// fails (the store then runs without the tier; `error` says why).
[[nodiscard]] void* device_memory_alloc(size_t bytes, int device, std::string* error);
/// Frees what device_memory_alloc(…, device) returned, on that device.
void device_memory_free(void* ptr, int device) noexcept;

/// Fills RuntimeInfo (called once by hss::runtime_info()).
[[nodiscard]] RuntimeInfo detect_runtime();

}  // namespace hss::detail
