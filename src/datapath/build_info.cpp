#include "hss/build_info.hpp"

#include <string>

#include "base/log.hpp"
#include "datapath/cuda_runtime.hpp"

namespace hss {

BuildInfo build_info() {
  BuildInfo info;
  info.version = HSS_VERSION;
  info.cuda = HSS_WITH_CUDA != 0;
  info.cuda_architectures = info.cuda ? HSS_CUDA_ARCHITECTURES : "";
  info.nvtx = HSS_HAVE_NVTX != 0;
  return info;
}

const RuntimeInfo& runtime_info() {
  static const RuntimeInfo info = [] {
    RuntimeInfo detected = detail::detect_runtime();
    if (detected.device_available) {
      detail::log(detail::LogLevel::kInfo,
                  "CUDA device path enabled (" + std::to_string(detected.devices.size()) +
                      " device(s), first: " + detected.devices.front().name + ")");
    } else {
      detail::log(detail::LogLevel::kInfo,
                  "no CUDA device: using the host path (" + detected.reason + ")");
    }
    return detected;
  }();
  return info;
}

namespace detail {
bool cuda_device_available() { return runtime_info().device_available; }
}  // namespace detail

}  // namespace hss
