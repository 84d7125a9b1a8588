#pragma once
// Exceptions thrown by hsstore. Everything derives from hss::Error, itself a std::runtime_error,
// so one catch clause covers the library.

#include <stdexcept>
#include <string>

namespace hss {

/// Any failure inside hsstore, including CUDA errors (the message carries the CUDA error string).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A configuration value that cannot be used. The message names the key, the value and, for
/// YAML input, the line.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A bad argument to a call. The message names the argument and its value. A call that throws
/// this has changed nothing.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

}  // namespace hss
