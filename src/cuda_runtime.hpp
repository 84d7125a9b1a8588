#pragma once
// The process's view of the CUDA runtime, shared by the store and the tools. With no device or no
// driver (cudaErrorInsufficientDriver, cudaErrorNoDevice) everything here reports "unavailable"
// and the library runs on the host path. Detection runs once; all functions are thread-safe.

#include <cstddef>

#include "hss/build_info.hpp"

namespace hss::detail {

/// True when a CUDA device is usable (detected once, logged once).
[[nodiscard]] bool cuda_device_available();

/// Page-locked, device-mapped, portable host memory, or nullptr when no device is available or
/// the allocation fails (the caller falls back to ordinary pages).
[[nodiscard]] void* pinned_host_alloc(size_t bytes);
void pinned_host_free(void* ptr) noexcept;

/// Fills RuntimeInfo (called once by hss::runtime_info()).
[[nodiscard]] RuntimeInfo detect_runtime();

}  // namespace hss::detail
