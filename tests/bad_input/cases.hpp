#pragma once
// One case of the bad-input matrix: a public call with one invalid argument.

#include <functional>
#include <string>
#include <vector>

#include "world.hpp"

namespace hss::bad_input {

enum class Expect {
  kInvalidArgument,  ///< throws hss::InvalidArgument
  kConfigError,      ///< throws hss::ConfigError
  kError,            ///< throws some hss::Error (file errors, a closed store)
  kNoEffect,         ///< may return (false, 0, nullopt) but must change nothing
};

struct Case {
  std::string name;  ///< Class::method(argument = value)
  Expect expect;
  std::function<void(World&)> run;
};

void add_core_cases(std::vector<Case>& cases);   ///< Config, token database, KV backend, Engine
void add_store_cases(std::vector<Case>& cases);  ///< HiddenStateStore

}  // namespace hss::bad_input
