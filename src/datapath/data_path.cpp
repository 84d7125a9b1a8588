// DevicePath::create (data_path.hpp): the platform's path, CUDA or none.
#include "datapath/data_path.hpp"

namespace hss::detail {

std::unique_ptr<DevicePath> DevicePath::create(const Config& config) {
  return create_platform_device_path(config);
}

}  // namespace hss::detail
