// Host-only build: no CUDA runtime is linked.
#include "datapath/cuda_runtime.hpp"

namespace hss::detail {

RuntimeInfo detect_runtime() {
  RuntimeInfo info;
  info.reason = "built without CUDA (HSS_ENABLE_CUDA=OFF)";
  return info;
}

int store_device(const Config&) { return -1; }
void* pinned_host_alloc(size_t, int) { return nullptr; }
void pinned_host_free(void*, int) noexcept {}
void* device_memory_alloc(size_t, int, std::string* error) {
  if (error != nullptr) *error = "built without CUDA";
  return nullptr;
}
void device_memory_free(void*, int) noexcept {}

}  // namespace hss::detail
