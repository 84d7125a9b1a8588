#include "config/config_env.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>
#include <string>

#include "base/log.hpp"

namespace hss::detail {
namespace {

/// strtoull's reading (0 for text that is not a number), scaled by 2^shift, saturated at the
/// int64 range of Config's byte counts.
int64_t scaled(const char* text, int shift) {
  const unsigned long long value = std::strtoull(text, nullptr, 10);
  constexpr auto kMax = static_cast<unsigned long long>(std::numeric_limits<int64_t>::max());
  if (value > (kMax >> shift)) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(value << shift);
}

/// Unknown spellings read as info, as they always have.
LogLevel level_of(const char* value) {
  return log_level_from_string(value).value_or(LogLevel::kInfo);
}

/// The logger's process default (base/log.hpp reads no variable: it is a layer below this one),
/// set when the library loads, before any code of it logs.
[[maybe_unused]] const bool kLogLevelFromEnv = [] {
  if (const auto level = log_level_from_env()) set_log_level(*level);
  return true;
}();

/// Applies `value` to `config`; false when it changed nothing (a warning was logged).
using Apply = bool (*)(Config& config, const char* value);

struct Override {
  std::string_view variable;
  std::string_view key;
  Apply apply;
};

constexpr std::array kOverrides = {
    Override{"HSS_RESTORE_IMPL", "hidden_state_restore_impl",
             [](Config& c, const char* value) {
               const std::string_view v(value);
               if (v.empty()) return false;
               if (v == "memcpy") {  // the name copy_engine had before
                 c.tuning.restore_impl = RestoreImpl::kCopyEngine;
                 return true;
               }
               if (const auto impl = restore_impl_from_string(v)) {
                 c.tuning.restore_impl = *impl;
                 return true;
               }
               log(LogLevel::kWarn, "HSS_RESTORE_IMPL=" + std::string(v) +
                                        " is not one of kernel, copy_engine, cub; using the "
                                        "config's " +
                                        std::string(to_string(c.tuning.restore_impl)));
               return false;
             }},
    Override{"HSS_OUTPUT_CACHE_MB", "hidden_state_output_cache_bytes",
             [](Config& c, const char* value) {
               c.tuning.output_cache_bytes = scaled(value, 20);
               return true;
             }},
    Override{"HSS_STREAM_THRESHOLD_KB", "hidden_state_stream_threshold_bytes",
             [](Config& c, const char* value) {
               c.tuning.stream_threshold_bytes = scaled(value, 10);
               return true;
             }},
    Override{"HSS_COPY_THREADS", "hidden_state_copy_threads",
             [](Config& c, const char* value) {
               // An engine that builds the store from its own config (the LMCache drop-in)
               // has no other way to set the key.
               const std::string_view v(value);
               if (v == "auto") {
                 c.tuning.copy_threads.reset();
                 return true;
               }
               char* end = nullptr;
               const long n = std::strtol(value, &end, 10);
               if (end != value && *end == '\0' && n >= 1 && n <= 64) {
                 c.tuning.copy_threads = n;
                 return true;
               }
               log(LogLevel::kWarn,
                   "HSS_COPY_THREADS=" + std::string(v) +
                       " is neither auto nor 1..64; using the config's " +
                       (c.tuning.copy_threads ? std::to_string(*c.tuning.copy_threads)
                                              : std::string("auto")));
               return false;
             }},
    Override{"HSS_LOG_LEVEL", "hidden_state_log_level",
             [](Config& c, const char* value) {
               c.hidden_state_log_level = level_of(value);
               return true;
             }},
};

}  // namespace

void apply_env_overrides(Config& config) {
  for (const Override& o : kOverrides) {
    const std::string name(o.variable);
    const char* value = std::getenv(name.c_str());
    if (value == nullptr || !o.apply(config, value)) continue;
    if (std::ranges::find(config.env_overrides, o.variable) == config.env_overrides.end()) {
      config.env_overrides.push_back(name);
    }
  }
}

std::string_view key_overridden_by(std::string_view variable) {
  const auto it = std::ranges::find(kOverrides, variable, &Override::variable);
  return it == kOverrides.end() ? std::string_view() : it->key;
}

std::optional<LogLevel> log_level_from_env() {
  const char* value = std::getenv("HSS_LOG_LEVEL");
  if (value == nullptr) return std::nullopt;
  return level_of(value);
}

bool pool_memory_check_off() {
  const char* value = std::getenv("HSS_POOL_MEMORY_CHECK");
  return value != nullptr && std::string_view(value) == "0";
}

}  // namespace hss::detail
