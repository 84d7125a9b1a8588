#pragma once
// Parsing of redis:// URLs for the remote tier (hidden_state_remote_url). Plain values, no I/O:
// safe from any thread. Needs no hiredis, so the parser is built (and tested) everywhere.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hss::detail {

/// One Redis/Valkey server: redis://[[user]:password@]host:port[/db].
struct RedisEndpoint {
  std::string host;
  int port = 6379;
  int64_t db = 0;
  std::string user;      ///< empty: the default user (AUTH password only)
  std::string password;  ///< empty: no AUTH

  friend bool operator==(const RedisEndpoint&, const RedisEndpoint&) = default;

  /// "host:port/db" with no credentials: for log lines and as the shard identity, so that a
  /// password change does not move keys between servers.
  [[nodiscard]] std::string display() const;
};

/// Parses one URL. Throws hss::ConfigError naming the URL (password masked) and the problem.
/// The port is required (an explicit address is easier to audit than a default).
[[nodiscard]] RedisEndpoint parse_redis_url(std::string_view url);

/// Parses every URL; a duplicate server (same host:port/db) is a ConfigError.
[[nodiscard]] std::vector<RedisEndpoint> parse_redis_urls(std::span<const std::string> urls);

/// The URL with the password replaced by "***" (for messages).
[[nodiscard]] std::string mask_redis_url(std::string_view url);

}  // namespace hss::detail
