#pragma once
// Reading and writing single YAML values of hss::Config keys: the parsers, formatters and the
// error message every bad value gets ("config key 'K': problem, got 'V' (where)"). The key table
// (config_keys.hpp) combines them per key.

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hss/activation.hpp"

namespace hss::detail {

/// Where a value came from: "line 3" (of a file), or "environment variable X". `is_line`: the
/// place is a line, so a list element can be pointed at on its own line.
struct ValueWhere {
  std::string_view text;
  bool is_line = false;
};

/// Throws ConfigError: "config key 'key': problem, got 'value' (where)".
[[noreturn]] void fail_config_key(std::string_view key, std::string_view problem,
                                  std::string_view value, std::string_view where);

/// A node as an error message shows it: one line, at most 80 characters.
[[nodiscard]] std::string describe(const YAML::Node& node);
/// "line N" (counted from 1) or "unknown line".
[[nodiscard]] std::string line_of(const YAML::Mark& mark);
/// Decimal or 0x hex, with an optional sign; nullopt when out of int64 range or not a number.
[[nodiscard]] std::optional<int64_t> parse_int_text(std::string_view text);

// The readers: each throws through fail_config_key naming `key`, the value and where.
[[nodiscard]] int64_t parse_int(std::string_view key, const YAML::Node& node, ValueWhere where);
/// A finite number.
[[nodiscard]] double parse_double(std::string_view key, const YAML::Node& node, ValueWhere where);
/// An integer, or `auto` / null (nullopt: chosen by hsstore).
[[nodiscard]] std::optional<int64_t> parse_auto_int(std::string_view key, const YAML::Node& node,
                                                    ValueWhere where);
/// The YAML 1.1 spellings (true/yes/on, false/no/off), as PyYAML reads LMCache's files.
[[nodiscard]] bool parse_bool(std::string_view key, const YAML::Node& node, ValueWhere where);
/// Any scalar; null is the empty string.
[[nodiscard]] std::string parse_string(std::string_view key, const YAML::Node& node,
                                       ValueWhere where);
/// A list of integers, or null (nullopt).
[[nodiscard]] std::optional<std::vector<int64_t>> parse_layers(std::string_view key,
                                                               const YAML::Node& node,
                                                               ValueWhere where);
/// A URL or a list of URLs; null is none (checked in validation).
[[nodiscard]] std::vector<std::string> parse_urls(std::string_view key, const YAML::Node& node,
                                                  ValueWhere where);
/// A list of activation kinds by name, or null (nullopt).
[[nodiscard]] std::optional<std::vector<ActivationKind>> parse_kinds(std::string_view key,
                                                                     const YAML::Node& node,
                                                                     ValueWhere where);
/// A name among `names` (scalar, quoted or not): its index. Fails "expected 'a', 'b' or 'c'".
[[nodiscard]] size_t parse_name(std::string_view key, const YAML::Node& node, ValueWhere where,
                                const std::vector<std::string_view>& names);

// The writers (to_yaml: each value round-trips through its reader).
/// Shortest round-trip text, always with a '.' or exponent so YAML 1.1 readers see a float.
[[nodiscard]] std::string format_double(double value);
/// Shortest round-trip text as typed in messages (no ".0" added).
[[nodiscard]] std::string plain_double(double value);
/// A double-quoted YAML string.
[[nodiscard]] std::string yaml_quoted(std::string_view text);
/// A flow sequence "[a, b]" of already formatted items.
[[nodiscard]] std::string flow_list(const std::vector<std::string>& items);

}  // namespace hss::detail
