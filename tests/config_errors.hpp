#pragma once
// The config tests' view of a ConfigError: its message, for checking that it names the key, the
// value and the line (tests/config, tests/tiers/test_remote_config.cpp).

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

#include "hss/config.hpp"
#include "hss/error.hpp"

namespace hss::test {

/// Runs `fn`, expects a ConfigError and returns its message (empty when none was thrown or
/// another exception was, which also fails the test). `input`: what the failure names.
template <typename Fn>
std::string config_error_of(Fn&& fn, const std::string& input = {}) {
  const std::string of = input.empty() ? std::string() : " for: " + input;
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected hss::ConfigError" << of << ", got another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected hss::ConfigError" << of << ", nothing was thrown";
  return {};
}

/// The ConfigError message of Config::from_yaml(yaml) (see config_error_of).
inline std::string yaml_error(const std::string& yaml) {
  return config_error_of([&] { (void)Config::from_yaml(yaml); }, yaml);
}

/// Expects every fragment in the message, so a failure shows the whole message once.
inline void expect_mentions(const std::string& message,
                            const std::vector<std::string>& fragments) {
  for (const std::string& fragment : fragments) {
    EXPECT_NE(message.find(fragment), std::string::npos)
        << "message lacks '" << fragment << "': " << message;
  }
}

}  // namespace hss::test
