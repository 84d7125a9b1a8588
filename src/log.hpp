#pragma once
// Minimal stderr logging. HSS_LOG_LEVEL=debug|info|warn|error|off (default info).

#include <string_view>

namespace hss::detail {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

[[nodiscard]] bool log_enabled(LogLevel level);
void log(LogLevel level, std::string_view message);

}  // namespace hss::detail
