#include "config/config_yaml.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>

#include "hss/error.hpp"

namespace hss::detail {
namespace {

// A quoted scalar is a string in YAML even when it looks like a number (PyYAML hands LMCache a
// str for chunk_size: "256"), so numeric and boolean keys take plain scalars only.
bool is_plain_scalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

std::string lower(std::string_view text) {
  std::string out(text);
  std::ranges::transform(out, out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

}  // namespace

void fail_config_key(std::string_view key, std::string_view problem, std::string_view value,
                     std::string_view where) {
  std::string msg = "config key '" + std::string(key) + "': " + std::string(problem) + ", got '" +
                    std::string(value) + "'";
  if (!where.empty()) msg += " (" + std::string(where) + ")";
  throw ConfigError(msg);
}

std::string describe(const YAML::Node& node) {
  std::string text;
  if (!node.IsDefined() || node.IsNull()) {
    text = "null";
  } else if (node.IsScalar()) {
    text = node.Scalar();
  } else {
    // One line in a message, whatever style the input used.
    YAML::Node flow = YAML::Clone(node);
    flow.SetStyle(YAML::EmitterStyle::Flow);
    YAML::Emitter emitter;
    emitter << flow;
    text = emitter.c_str();
  }
  // Shortened so a huge flow sequence cannot flood the log.
  constexpr size_t kMaxShown = 80;
  if (text.size() > kMaxShown) {
    // In place: `substr(...) + "..."` moved into `text` is where g++ 12's -Warray-bounds misfires
    // inside libstdc++ (cmake/HssWarnings.cmake).
    text.resize(kMaxShown);
    text += "...";
  }
  return text;
}

std::string line_of(const YAML::Mark& mark) {
  // yaml-cpp counts lines from 0; editors and users count from 1.
  return mark.is_null() ? std::string("unknown line") : "line " + std::to_string(mark.line + 1);
}

std::optional<int64_t> parse_int_text(std::string_view text) {
  bool negative = false;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    base = 16;
    text.remove_prefix(2);
  }
  if (text.empty()) return std::nullopt;
  uint64_t magnitude = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), magnitude, base);
  if (ec != std::errc{} || ptr != text.data() + text.size()) return std::nullopt;
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (negative) {
    if (magnitude > kMax + 1) return std::nullopt;
    return magnitude == kMax + 1 ? std::numeric_limits<int64_t>::min()
                                 : -static_cast<int64_t>(magnitude);
  }
  if (magnitude > kMax) return std::nullopt;
  return static_cast<int64_t>(magnitude);
}

int64_t parse_int(std::string_view key, const YAML::Node& node, ValueWhere where) {
  if (is_plain_scalar(node)) {
    if (auto value = parse_int_text(node.Scalar())) return *value;
  }
  fail_config_key(key, "expected an integer", describe(node), where.text);
}

double parse_double(std::string_view key, const YAML::Node& node, ValueWhere where) {
  if (is_plain_scalar(node)) {
    std::string_view text = node.Scalar();
    if (!text.empty() && text.front() == '+') text.remove_prefix(1);
    double value = 0.0;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc{} && ptr == text.data() + text.size() && !text.empty()) {
      if (!std::isfinite(value)) {
        fail_config_key(key, "expected a finite number", describe(node), where.text);
      }
      return value;
    }
  }
  fail_config_key(key, "expected a number", describe(node), where.text);
}

std::optional<int64_t> parse_auto_int(std::string_view key, const YAML::Node& node,
                                      ValueWhere where) {
  if (node.IsNull() || (node.IsScalar() && lower(node.Scalar()) == "auto")) return std::nullopt;
  if (is_plain_scalar(node)) {
    if (auto value = parse_int_text(node.Scalar())) return *value;
  }
  fail_config_key(key, "expected an integer, auto or null", describe(node), where.text);
}

bool parse_bool(std::string_view key, const YAML::Node& node, ValueWhere where) {
  if (is_plain_scalar(node)) {
    const std::string text = lower(node.Scalar());
    if (text == "true" || text == "yes" || text == "on") return true;
    if (text == "false" || text == "no" || text == "off") return false;
  }
  fail_config_key(key, "expected true or false", describe(node), where.text);
}

std::string parse_string(std::string_view key, const YAML::Node& node, ValueWhere where) {
  if (node.IsNull()) return {};
  if (!node.IsScalar()) fail_config_key(key, "expected a string", describe(node), where.text);
  return node.Scalar();
}

std::optional<std::vector<int64_t>> parse_layers(std::string_view key, const YAML::Node& node,
                                                 ValueWhere where) {
  if (node.IsNull()) return std::nullopt;
  if (!node.IsSequence()) {
    fail_config_key(key, "expected a list of integers or null", describe(node), where.text);
  }
  std::vector<int64_t> layers;
  layers.reserve(node.size());
  for (const YAML::Node& item : node) {
    std::optional<int64_t> value;
    if (is_plain_scalar(item)) value = parse_int_text(item.Scalar());
    if (!value) {
      // In a block sequence the offending element may sit lines below the key.
      const std::string item_where = where.is_line ? line_of(item.Mark()) : std::string(where.text);
      fail_config_key(
          key, "expected a list of integers or null (element '" + describe(item) + "' is not one)",
          describe(node), item_where);
    }
    layers.push_back(*value);
  }
  return layers;
}

std::vector<std::string> parse_urls(std::string_view key, const YAML::Node& node,
                                    ValueWhere where) {
  if (node.IsNull()) return {};
  if (node.IsScalar()) return {node.Scalar()};
  constexpr std::string_view kExpected = "expected a URL or a list of URLs";
  if (!node.IsSequence()) fail_config_key(key, kExpected, describe(node), where.text);
  std::vector<std::string> urls;
  for (const YAML::Node& item : node) {
    if (!item.IsScalar()) fail_config_key(key, kExpected, describe(node), where.text);
    urls.push_back(item.Scalar());
  }
  return urls;
}

std::optional<std::vector<ActivationKind>> parse_kinds(std::string_view key, const YAML::Node& node,
                                                       ValueWhere where) {
  if (node.IsNull()) return std::nullopt;
  constexpr std::string_view kExpected =
      "expected a list of kinds (hidden, query, key, value, mlp_intermediate) or null";
  if (!node.IsSequence()) fail_config_key(key, kExpected, describe(node), where.text);
  std::vector<ActivationKind> kinds;
  for (const YAML::Node& item : node) {
    const auto kind = item.IsScalar() ? activation_kind_from_string(item.Scalar()) : std::nullopt;
    if (!kind) fail_config_key(key, kExpected, describe(node), where.text);
    kinds.push_back(*kind);
  }
  return kinds;
}

size_t parse_name(std::string_view key, const YAML::Node& node, ValueWhere where,
                  const std::vector<std::string_view>& names) {
  if (node.IsScalar()) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (node.Scalar() == names[i]) return i;
    }
  }
  std::string expected = "expected ";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i != 0) expected += i + 1 == names.size() ? " or " : ", ";
    expected += '\'';
    expected += names[i];
    expected += '\'';
  }
  fail_config_key(key, expected, describe(node), where.text);
}

std::string format_double(double value) {
  std::string text = plain_double(value);
  // Shortest round-trip output may lack a '.', and "5" or "1e+20" read as an int or a string to
  // YAML 1.1 readers (PyYAML); LMCache's tools should see a float.
  if (std::isfinite(value) && text.find('.') == std::string::npos) {
    const auto exp = text.find('e');
    text.insert(exp == std::string::npos ? text.size() : exp, ".0");
  }
  return text;
}

std::string plain_double(double value) {
  std::array<char, 64> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value);
  return ec == std::errc{} ? std::string(buf.data(), end) : std::string("?");
}

std::string yaml_quoted(std::string_view text) {
  // Double-quoted YAML: a password or path may hold characters YAML would otherwise read.
  // Control characters are escaped (\xHH): a raw line break inside a double-quoted scalar is
  // folded into a space when read back, so the value would not round-trip.
  static constexpr char kHex[] = "0123456789abcdef";
  std::string q = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      q += "\\x";
      q += kHex[byte >> 4];
      q += kHex[byte & 0xf];
      continue;
    }
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

std::string flow_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i != 0) out += ", ";
    out += items[i];
  }
  return out + "]";
}

}  // namespace hss::detail
