// DevicePath::create and the test hook that substitutes the simulated path (data_path.hpp).
#include "data_path.hpp"

#include <utility>

namespace hss::detail {
namespace {

DevicePathFactory& installed_factory() {
  static DevicePathFactory factory;
  return factory;
}

}  // namespace

std::unique_ptr<DevicePath> DevicePath::create(const Config& config) {
  if (const DevicePathFactory& factory = installed_factory()) return factory(config);
  return create_platform_device_path(config);
}

ScopedDevicePathFactory::ScopedDevicePathFactory(DevicePathFactory factory)
    : previous_(std::exchange(installed_factory(), std::move(factory))) {}

ScopedDevicePathFactory::~ScopedDevicePathFactory() { installed_factory() = std::move(previous_); }

}  // namespace hss::detail
