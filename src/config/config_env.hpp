#pragma once
// The HSS_* debugging variables: the one place hsstore reads them (Config::with_env_overrides
// and Config::from_env apply them; README, "Environment"). Each one wins over the key it
// overrides, whatever the source of the Config (file, LMCACHE_<KEY>, YAML text, or code), because
// a store runs with config.with_env_overrides(). Their spelling is as lenient as it always was
// (a number that does not parse reads as 0) since CI and the benchmarks set them as they are.
//
// Two more are read here but override no key: HSS_LOG_LEVEL's process default for the logger
// (base/log.hpp, a layer below this one, which therefore reads no variable itself: this file sets
// the logger's threshold when the library loads) and HSS_POOL_MEMORY_CHECK (block_pool.cpp). The
// second describes the machine, not the store (a VM whose memory is plugged in as it is used
// reports a MemAvailable far below what it will
// give), changes no value a store runs with, and must not travel in a config file to another
// machine; so it stays a process setting, not a key.

#include <optional>
#include <string_view>

#include "hss/config.hpp"

namespace hss::detail {

/// Applies every HSS_* debugging variable that is set to `config` and lists it in
/// config.env_overrides. Logs a warning for an HSS_RESTORE_IMPL it does not know (and keeps the
/// config's value).
void apply_env_overrides(Config& config);

/// The key an HSS_* variable overrides ("" for a name that is not one of them).
[[nodiscard]] std::string_view key_overridden_by(std::string_view variable);

/// HSS_LOG_LEVEL as a level (unknown spellings read as info, as they always did); nullopt when
/// unset. Never logs. The logger's process default when the library loads (base/log.hpp), and
/// the value apply_env_overrides gives hidden_state_log_level.
[[nodiscard]] std::optional<LogLevel> log_level_from_env();

/// HSS_POOL_MEMORY_CHECK=0: the pool's check against the memory available is off
/// (pool/block_pool.cpp).
[[nodiscard]] bool pool_memory_check_off();

}  // namespace hss::detail
