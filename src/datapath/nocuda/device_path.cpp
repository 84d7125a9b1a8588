// Host-only build: there is no CUDA device path.
#include "datapath/data_path.hpp"

namespace hss::detail {

std::unique_ptr<DevicePath> create_platform_device_path(const Config&) { return nullptr; }

}  // namespace hss::detail
