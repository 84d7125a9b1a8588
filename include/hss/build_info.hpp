#pragma once
// What this build of hsstore contains and what the process found at run time.
// Thread-safe: runtime detection happens once (the first call), later calls read the result.

#include <cstdint>
#include <string>
#include <vector>

namespace hss {

struct BuildInfo {
  std::string version;
  bool cuda = false;               ///< the CUDA data path was compiled in
  std::string cuda_architectures;  ///< e.g. "80;90"
  bool nvtx = false;               ///< NVTX v3 ranges are emitted (else only the trace hook)
};

struct DeviceInfo {
  int index = 0;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  uint64_t total_memory = 0;
};

struct RuntimeInfo {
  bool device_available = false;  ///< a CUDA device and driver were found
  std::string reason;             ///< why not, when not (the CUDA error string)
  std::vector<DeviceInfo> devices;
  /// The devices map page-locked host memory into their address space (unified addressing): the
  /// pool is allocated so when it fits (stats().pinned says whether it was).
  bool pinned_memory = false;
};

[[nodiscard]] BuildInfo build_info();
[[nodiscard]] const RuntimeInfo& runtime_info();

}  // namespace hss
