#pragma once
// Argument parsing shared by the hss and hss-demo command lines: no dependency, strict numbers,
// and one error type per exit code (usage errors exit 2, bad input 1).

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace hss::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  ///< bad input, failed check
inline constexpr int kExitUsage = 2;    ///< unknown flag or subcommand, missing value

/// A command line that cannot be understood; the message says what was wrong.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Walks argv once. Flags take their value from the next argument or after '='.
class Args {
 public:
  Args(int argc, char** argv);
  explicit Args(std::vector<std::string> args) : args_(std::move(args)) {}

  [[nodiscard]] bool done() const { return pos_ >= args_.size(); }
  [[nodiscard]] const std::string& peek() const { return args_.at(pos_); }
  /// The next argument (a flag or a positional one).
  std::string next();
  /// True (and consumed) when the next argument is `flag` or `flag=...`; the value, if any, is
  /// kept for value().
  bool take_flag(std::string_view flag);
  /// The value of the flag just taken; UsageError when there is none.
  std::string value(std::string_view flag);

 private:
  std::vector<std::string> args_;
  size_t pos_ = 0;
  std::string inline_value_;
  bool has_inline_value_ = false;
};

/// Decimal integer in [lo, hi]; UsageError naming the flag otherwise.
[[nodiscard]] int64_t parse_int(std::string_view flag, std::string_view text, int64_t lo,
                                int64_t hi);
/// Comma-separated integers, each in [lo, hi], at least one.
[[nodiscard]] std::vector<int64_t> parse_int_list(std::string_view flag, std::string_view text,
                                                  int64_t lo, int64_t hi);
/// "1.5 GiB", "512.0 MiB", "96 B".
[[nodiscard]] std::string format_bytes(double bytes);

}  // namespace hss::cli
