#include "base/log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace hss::detail {

namespace {

constexpr const char* kNames[] = {"debug", "info", "warning", "error", "off"};

std::atomic<LogLevel>& threshold() {
  // Info until config/config_env.cpp applies HSS_LOG_LEVEL, when the library loads.
  static std::atomic<LogLevel> value{LogLevel::kInfo};
  return value;
}

}  // namespace

bool log_enabled(LogLevel level) {
  return level >= threshold().load(std::memory_order_relaxed) && level != LogLevel::kOff;
}

void set_log_level(LogLevel level) { threshold().store(level, std::memory_order_relaxed); }

void log(LogLevel level, std::string_view message) {
  if (!log_enabled(level)) return;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "hss: %s: %.*s\n", kNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace hss::detail
