#pragma once
// The bits of a float32 and back, in host and device code alike: the one bit cast that the
// integer-arithmetic conversions (convert.hpp's f16 and bf16, fp8.hpp's 8-bit formats) are
// written on, so every format reads and writes the same bits on both sides.

#include <cstdint>
#include <cstring>

#include "hss/kernels/host_device.hpp"

namespace hss::kernels {

HSS_HOST_DEVICE float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

HSS_HOST_DEVICE uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
#endif
}

}  // namespace hss::kernels
