#pragma once
// Shared by the store libFuzzer targets: the input reader, the violation report (libFuzzer saves
// the input on abort) and a value writer for exactly representable test values.

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "hss/kernels/convert.hpp"
#include "hss/tensor.hpp"

namespace hss::fuzz {

/// Aborts with `what` (prefixed by the program's name): libFuzzer keeps the input.
[[noreturn]] inline void violation(const std::string& what) {
  std::fprintf(stderr, "%s: VIOLATION: %s\n", program_invocation_short_name, what.c_str());
  std::abort();
}

inline void require(bool ok, const std::string& what) {
  if (!ok) violation(what);
}

/// The fuzzer's bytes as a stream of choices; zeros once exhausted.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  [[nodiscard]] bool done() const { return pos_ >= size_; }
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  size_t pick(size_t n) { return byte() % n; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

/// Writes `f` at `dst` as `dtype` (float16/bfloat16 rounded to nearest-even).
inline void write_value(void* dst, DType dtype, float f) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, &f, 4);
    return;
  }
  const uint16_t h =
      dtype == DType::kBFloat16 ? kernels::float_to_bf16(f) : kernels::float_to_f16(f);
  std::memcpy(dst, &h, 2);
}

}  // namespace hss::fuzz
