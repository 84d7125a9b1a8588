#include "common/cli.hpp"

#include <charconv>
#include <cstdio>

namespace hss::cli {

Args::Args(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) args_.emplace_back(argv[i]);
}

std::string Args::next() {
  if (done()) throw UsageError("missing argument");
  has_inline_value_ = false;
  return args_[pos_++];
}

bool Args::take_flag(std::string_view flag) {
  if (done()) return false;
  const std::string_view arg = args_[pos_];
  if (arg == flag) {
    has_inline_value_ = false;
  } else if (arg.size() > flag.size() && arg.starts_with(flag) && arg[flag.size()] == '=') {
    inline_value_ = std::string(arg.substr(flag.size() + 1));
    has_inline_value_ = true;
  } else {
    return false;
  }
  ++pos_;
  return true;
}

std::string Args::value(std::string_view flag) {
  if (has_inline_value_) {
    has_inline_value_ = false;
    return inline_value_;
  }
  if (done()) throw UsageError(std::string(flag) + " needs a value");
  return args_[pos_++];
}

int64_t parse_int(std::string_view flag, std::string_view text, int64_t lo, int64_t hi) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) {
    throw UsageError(std::string(flag) + " expects an integer, got '" + std::string(text) + "'");
  }
  if (value < lo || value > hi) {
    throw UsageError(std::string(flag) + " = " + std::to_string(value) + " is outside [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return value;
}

std::vector<int64_t> parse_int_list(std::string_view flag, std::string_view text, int64_t lo,
                                    int64_t hi) {
  std::vector<int64_t> values;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    values.push_back(parse_int(flag, text.substr(start, comma - start), lo, hi));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return values;
}

std::string format_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  while (bytes >= 1024.0 && unit + 1 < std::size(kUnits)) {
    bytes /= 1024.0;
    ++unit;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.2f %s", bytes, kUnits[unit]);
  return buf;
}

}  // namespace hss::cli
