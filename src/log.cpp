#include "log.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace hss::detail {
namespace {

LogLevel level_from_env() {
  const char* value = std::getenv("HSS_LOG_LEVEL");
  if (value == nullptr) return LogLevel::kInfo;
  if (std::strcmp(value, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(value, "warn") == 0) return LogLevel::kWarn;
  if (std::strcmp(value, "error") == 0) return LogLevel::kError;
  if (std::strcmp(value, "off") == 0) return LogLevel::kOff;
  return LogLevel::kInfo;
}

constexpr const char* kNames[] = {"debug", "info", "warning", "error", "off"};

}  // namespace

bool log_enabled(LogLevel level) {
  static const LogLevel threshold = level_from_env();
  return level >= threshold && level != LogLevel::kOff;
}

void log(LogLevel level, std::string_view message) {
  if (!log_enabled(level)) return;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "hss: %s: %.*s\n", kNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace hss::detail
