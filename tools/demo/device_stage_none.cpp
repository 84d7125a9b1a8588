// Built when hsstore has no CUDA data path: the demo always takes the host path.
#include "demo/device_stage.hpp"

namespace hss::demo {

std::unique_ptr<DeviceStage> DeviceStage::create(std::string& why_not) {
  why_not = "hsstore was built without CUDA";
  return nullptr;
}

}  // namespace hss::demo
