#pragma once
// The pool transfer's binding (transfer.cpp), as the config binding needs it.

#include "hss/config.hpp"

namespace hss::python {

/// ConfigError when the config names a transfer whose Python package is not installed
/// (hidden_state_transfer: nixl without nixl): the error belongs to configuration time.
void check_transfer_available(const hss::Config& config);

}  // namespace hss::python
