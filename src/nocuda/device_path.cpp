// Host-only build: there is no device path.
#include "data_path.hpp"

namespace hss::detail {

std::unique_ptr<DevicePath> DevicePath::create() { return nullptr; }

}  // namespace hss::detail
