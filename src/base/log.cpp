#include "base/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace hss::detail {

std::optional<LogLevel> log_level_from_env() {
  const char* value = std::getenv("HSS_LOG_LEVEL");
  if (value == nullptr) return std::nullopt;
  return log_level_from_string(value).value_or(LogLevel::kInfo);  // unknown spellings: info
}

namespace {

constexpr const char* kNames[] = {"debug", "info", "warning", "error", "off"};

std::atomic<LogLevel>& threshold() {
  static std::atomic<LogLevel> value{log_level_from_env().value_or(LogLevel::kInfo)};
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
