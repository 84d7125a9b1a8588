#pragma once
// The HSS_* debugging variables: the one place hsstore reads them (Config::with_env_overrides
// and Config::from_env apply them; README, "Environment"). Each one wins over the key it
// overrides, whatever the source of the Config (file, LMCACHE_<KEY>, YAML text, or code), because
// a store runs with config.with_env_overrides(). Their spelling is as lenient as it always was
// (a number that does not parse reads as 0) since CI and the benchmarks set them as they are.
//
// Not here: HSS_POOL_MEMORY_CHECK (block_pool.cpp). It describes the machine, not the store (a
// VM whose memory is plugged in as it is used reports a MemAvailable far below what it will
// give), changes no value a store runs with, and must not travel in a config file to another
// machine; so it stays a process setting beside the check it turns off.

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

}  // namespace hss::detail
