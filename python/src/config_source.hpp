#pragma once
// Turning the Python objects a caller may pass as a config into an hss::Config.

#include <nanobind/nanobind.h>

#include "hss/config.hpp"

namespace hss::python {

/// None, dict, YAML text, path, hsstore.Config or an LMCache-style config object (see config.cpp).
/// Throws hss::ConfigError.
[[nodiscard]] hss::Config config_from(nanobind::handle source);

}  // namespace hss::python
