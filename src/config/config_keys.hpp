#pragma once
// The one table of hss::Config keys. Each row names a key and says, once, which member holds it,
// how its YAML value is read and written, what values it takes and what it means:
//   * parse:    from_yaml, from_file and the LMCACHE_<KEY> variables of from_env;
//   * format:   to_yaml (every row in table order; a secret is never written, only said set);
//   * describe: the value as a validation message quotes it when the input did not give it;
//   * value:    Config::value, the Python attributes (python/src/config.cpp makes one per row);
//   * validate: Config::validate, in table order (nullptr: every value the parser gives is fine);
//   * doc:      Config::doc, README's "meaning" column (tests/config/test_config_keys.cpp checks the
//               README table row by row) and the Python attributes' docstrings.
// Adding a key: a member in include/hss/config.hpp, a row here, a row in README's table, a
// property in python/hsstore/_hsstore.pyi (test_stubs checks it).

#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hss/config.hpp"

namespace YAML {
class Node;
}  // namespace YAML

namespace hss::detail {

struct ValueWhere;  // config_yaml.hpp

/// Where a key's value came from ("line 3 of config file 'x'", "environment variable X") and
/// its text there, so validation messages quote the input rather than a reformatted number.
/// Keys absent from the map kept their defaults or were set in code.
struct KeySource {
  std::string where;
  std::string text;
};
using KeyOrigins = std::map<std::string, KeySource, std::less<>>;

class KeyCheck;

struct KeySpec {
  std::string_view name;
  std::string_view doc;
  void (*parse)(Config& config, std::string_view key, const YAML::Node& value, ValueWhere where);
  std::string (*format)(const Config& config);
  std::string (*describe)(const Config& config);
  ConfigValue (*value)(const Config& config);
  void (*validate)(const Config& config, const KeyCheck& check);
  /// Never written by to_yaml nor quoted by a message (the MAC key).
  bool secret = false;
};

/// Every key, in to_yaml's order.
[[nodiscard]] std::span<const KeySpec> key_table();
/// The names of key_table(), in its order (Config::keys()).
[[nodiscard]] std::span<const std::string_view> key_names();
/// The row of `name`, or nullptr.
[[nodiscard]] const KeySpec* find_key(std::string_view name);

/// What a validator is handed: the key it checks, and failures that name a key with its value
/// as the input gave it (or as `describe` writes it) and where it came from.
class KeyCheck {
 public:
  KeyCheck(const Config& config, const KeyOrigins& origins, std::string_view key)
      : config_(config), origins_(origins), key_(key) {}

  [[nodiscard]] std::string_view key() const { return key_; }
  /// True when the input gave `key` (a file line or a variable).
  [[nodiscard]] bool given(std::string_view key) const { return origins_.contains(key); }
  /// Where the input gave `key`; empty when it did not.
  [[nodiscard]] std::string origin(std::string_view key) const;
  /// Throws ConfigError naming this check's key, its value and where it came from.
  [[noreturn]] void fail(std::string_view problem) const { fail(key_, problem); }
  /// The same for another key (a rule over two keys names the one to change).
  [[noreturn]] void fail(std::string_view key, std::string_view problem) const;

 private:
  const Config& config_;
  const KeyOrigins& origins_;
  std::string_view key_;
};

/// The directories a local_disk value names, read as LMCache 0.5.6's _parse_local_disk reads
/// it: comma-separated, each part trimmed and maybe prefixed with file:// (stripped, so
/// "file://local_disk/" is relative); empty parts are skipped. Views into `value`.
[[nodiscard]] std::vector<std::string_view> disk_paths(std::string_view value);

/// Runs every row's validator in table order; the first failure throws ConfigError.
void validate_keys(const Config& config, const KeyOrigins& origins);

}  // namespace hss::detail
