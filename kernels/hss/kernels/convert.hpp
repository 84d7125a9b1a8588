#pragma once
// Exact widening of 16-bit floats to float32. Both conversions are exact (every float16 and
// bfloat16 value is a float32 value), so stored-then-restored rows are bit-identical.

#include <cstdint>
#include <cstring>

#include "hss/kernels/host_device.hpp"

namespace hss::kernels {

/// Storage/element type codes shared with hss::DType (same order).
enum class ElemType : uint8_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

HSS_HOST_DEVICE constexpr uint32_t elem_bytes(ElemType t) {
  return t == ElemType::kFloat32 ? 4u : 2u;
}

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

/// bfloat16 is the top half of a float32.
HSS_HOST_DEVICE float bf16_to_float(uint16_t h) {
  return bits_to_float(static_cast<uint32_t>(h) << 16);
}

/// IEEE binary16 -> binary32, exact, including subnormals, infinities and NaN payloads.
HSS_HOST_DEVICE float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) {  // inf / NaN
    return bits_to_float(sign | 0x7F800000u | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    // Subnormal: normalise. Value = mantissa * 2^-24.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3FFu;
    const uint32_t exp32 = static_cast<uint32_t>(127 - 15 + 1 - shift);
    return bits_to_float(sign | (exp32 << 23) | (mantissa << 13));
  }
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

/// Round-to-nearest-even float32 -> bfloat16 (tests and synthetic data).
HSS_HOST_DEVICE uint16_t float_to_bf16(float f) {
  uint32_t bits = float_to_bits(f);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x7FFFFFu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN stays NaN
  }
  const uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

/// Element `index` of a row whose elements have type `t`, widened to float32.
HSS_HOST_DEVICE float load_as_float(const void* row, int64_t index, ElemType t) {
  switch (t) {
    case ElemType::kFloat32:
      return static_cast<const float*>(row)[index];
    case ElemType::kFloat16:
      return f16_to_float(static_cast<const uint16_t*>(row)[index]);
    default:
      return bf16_to_float(static_cast<const uint16_t*>(row)[index]);
  }
}

}  // namespace hss::kernels
