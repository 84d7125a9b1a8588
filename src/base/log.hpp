#pragma once
// Minimal stderr logging, process-wide. The threshold starts at HSS_LOG_LEVEL
// (debug|info|warn|error|off, default info; config/config_env.cpp, the one place HSS_* variables
// are read, sets it when the library loads) and a store whose config sets hidden_state_log_level
// applies it.
//
// Why a process default and not only a Config key: logging runs before any Config exists (static
// set-up, config parsing itself) and is shared by every store of the process, so the variable
// sets the default and Config::from_env / with_env_overrides reflect it in hidden_state_log_level
// (to_yaml shows the level in effect), rather than each store holding a level of its own.

#include <optional>
#include <string_view>

#include "hss/config.hpp"

namespace hss::detail {

using hss::LogLevel;

[[nodiscard]] bool log_enabled(LogLevel level);
void log(LogLevel level, std::string_view message);

/// Sets the process-wide threshold (a store's hidden_state_log_level).
void set_log_level(LogLevel level);

}  // namespace hss::detail
