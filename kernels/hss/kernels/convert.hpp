#pragma once
// Conversions between float32, float16 and bfloat16. Widening is exact (every float16 and
// bfloat16 value is a float32 value), so stored-then-restored rows are bit-identical; narrowing
// (float32 -> 16-bit restore outputs) rounds to nearest, ties to even, like PyTorch's .to().
//
// The two 8-bit storage types (fp8.hpp) are quantised per row: each stored row carries a float32
// scale (src/format/row_format.hpp says where), element = code x scale. The rules of the scale,
// the quantiser and the dequantiser are at the end of this file (row_scale, quantise,
// dequantise); every path, host and device, goes through them.

#include <cstdint>

#include "hss/kernels/float_bits.hpp"
#include "hss/kernels/fp8.hpp"
#include "hss/kernels/host_device.hpp"

namespace hss::kernels {

/// The element types the pool stores and the kernels read. hss::DType names the first three; they
/// convert only through src/format/dtype_codes.hpp (switches, not ordinals), which also owns the
/// wire codes. The 8-bit types are storage only (hidden_state_storage_dtype fp8_e4m3 / fp8_e5m2):
/// never a caller's tensor, always with per-row scales (is_scaled).
enum class ElemType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFp8E4M3 = 3,
  kFp8E5M2 = 4,
#ifdef HSS_ELEM_TYPE_PROBE  // tests/format/element_types_exhaustive.cmake: a type nothing handles
  kProbe = 255,
#endif
};

/// Every switch over ElemType lists every type with no default arm, and src/ and kernels/ build
/// with -Wswitch-enum as an error: a type added to the enum is a compile error in every place that
/// must learn it. A value outside the enum cannot be made (ElemType comes from DType through
/// src/format/dtype_codes.hpp's switches); reaching one is undefined (UBSan builds trap).
HSS_HOST_DEVICE constexpr uint32_t elem_bytes(ElemType t) {
  switch (t) {
    case ElemType::kFloat32:
      return 4u;
    case ElemType::kFloat16:
    case ElemType::kBFloat16:
      return 2u;
    case ElemType::kFp8E4M3:
    case ElemType::kFp8E5M2:
      return 1u;
  }
  __builtin_unreachable();
}

/// True for the 8-bit types: their rows are stored as codes x a per-row float32 scale.
HSS_HOST_DEVICE constexpr bool is_scaled(ElemType t) {
  switch (t) {
    case ElemType::kFloat32:
    case ElemType::kFloat16:
    case ElemType::kBFloat16:
      return false;
    case ElemType::kFp8E4M3:
    case ElemType::kFp8E5M2:
      return true;
  }
  __builtin_unreachable();
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

/// Round-to-nearest-even float32 -> IEEE binary16, with overflow to infinity, gradual underflow
/// to subnormals and NaN kept NaN (quiet, top payload bits kept).
HSS_HOST_DEVICE uint16_t float_to_f16(float f) {
  const uint32_t bits = float_to_bits(f);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) {  // inf / NaN
    if (magnitude == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);
    return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
  }
  // 65520 (halfway between 65504, the largest finite half, and 2^16) and above round to inf.
  if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
    const uint32_t exponent = magnitude >> 23;
    if (exponent < 102) return sign;  // below 2^-25: rounds to zero
    const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14..24: value in units of 2^-24
    uint32_t q = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u) != 0)) ++q;  // may carry into the smallest normal
    return static_cast<uint16_t>(sign | q);
  }
  const uint32_t rebased = magnitude - 0x38000000u;  // exponent bias 127 -> 15
  uint32_t h = rebased >> 13;
  const uint32_t rest = rebased & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;  // a carry bumps the exponent
  return static_cast<uint16_t>(sign | h);
}

/// float32 -> element type `t` (exact for float32, nearest-even for the 16-bit types).
template <ElemType T>
HSS_HOST_DEVICE auto narrow_from_float(float f) {
  static_assert(T == ElemType::kFloat32 || T == ElemType::kFloat16 || T == ElemType::kBFloat16,
                "narrow_from_float: a new element type needs its conversion here");
  if constexpr (T == ElemType::kFloat32) {
    return f;
  } else if constexpr (T == ElemType::kFloat16) {
    return float_to_f16(f);
  } else {
    return float_to_bf16(f);
  }
}

/// A 16-bit element of type S widened to float32 (exact).
template <ElemType S>
HSS_HOST_DEVICE float half_to_float(uint16_t h) {
  static_assert(S == ElemType::kFloat16 || S == ElemType::kBFloat16,
                "half_to_float: the 16-bit element types; a new one needs its conversion here");
  if constexpr (S == ElemType::kFloat16) {
    return f16_to_float(h);
  } else {
    return bf16_to_float(h);
  }
}

/// Element `index` of a row whose elements have type `t`, widened to float32.
HSS_HOST_DEVICE float load_as_float(const void* row, int64_t index, ElemType t) {
  switch (t) {
    case ElemType::kFloat32:
      HSS_DEVICE_ACCESS(static_cast<const float*>(row) + index, 4, false);
      return static_cast<const float*>(row)[index];
    case ElemType::kFloat16:
      HSS_DEVICE_ACCESS(static_cast<const uint16_t*>(row) + index, 2, false);
      return f16_to_float(static_cast<const uint16_t*>(row)[index]);
    case ElemType::kBFloat16:
      HSS_DEVICE_ACCESS(static_cast<const uint16_t*>(row) + index, 2, false);
      return bf16_to_float(static_cast<const uint16_t*>(row)[index]);
    case ElemType::kFp8E4M3:  // the code's own value: the caller multiplies by the row's scale
      HSS_DEVICE_ACCESS(static_cast<const uint8_t*>(row) + index, 1, false);
      return e4m3_to_float(static_cast<const uint8_t*>(row)[index]);
    case ElemType::kFp8E5M2:
      HSS_DEVICE_ACCESS(static_cast<const uint8_t*>(row) + index, 1, false);
      return e5m2_to_float(static_cast<const uint8_t*>(row)[index]);
  }
  __builtin_unreachable();
}

/// Writes `value` as element `index` of a row of type `t` (rounded to nearest-even for 16 bits).
HSS_HOST_DEVICE void store_from_float(void* row, int64_t index, ElemType t, float value) {
  switch (t) {
    case ElemType::kFloat32:
      HSS_DEVICE_ACCESS(static_cast<float*>(row) + index, 4, true);
      static_cast<float*>(row)[index] = value;
      break;
    case ElemType::kFloat16:
      HSS_DEVICE_ACCESS(static_cast<uint16_t*>(row) + index, 2, true);
      static_cast<uint16_t*>(row)[index] = float_to_f16(value);
      break;
    case ElemType::kBFloat16:
      HSS_DEVICE_ACCESS(static_cast<uint16_t*>(row) + index, 2, true);
      static_cast<uint16_t*>(row)[index] = float_to_bf16(value);
      break;
    case ElemType::kFp8E4M3:  // `value` already divided by the row's scale (quantise)
      HSS_DEVICE_ACCESS(static_cast<uint8_t*>(row) + index, 1, true);
      static_cast<uint8_t*>(row)[index] = float_to_e4m3(value);
      break;
    case ElemType::kFp8E5M2:
      HSS_DEVICE_ACCESS(static_cast<uint8_t*>(row) + index, 1, true);
      static_cast<uint8_t*>(row)[index] = float_to_e5m2(value);
      break;
  }
}

// ---- Per-row quantisation of the 8-bit types.
//
// A row's scale is amax / max_finite (448 for E4M3, 57344 for E5M2), amax = the largest |x| over
// the row's finite elements, so the row's largest element maps onto the format's largest finite
// value and nothing saturates. A row with no finite non-zero element has scale 1 (its codes are
// zeros, NaN, or E5M2 infinities). Where amax / max_finite is a float32 subnormal (amax below
// 448 x 2^-126 for E4M3, 57344 x 2^-126 for E5M2) the scale has few significant bits, and
// rounded to nearest it may lie below amax / max_finite: the row's largest element would
// saturate (an error of amax / 8 at amax near 2^-139). There the scale is rounded up instead, to
// the next multiple of 2^-149 (never zero: x / scale is never a division by zero), so that
// amax / scale <= max_finite still holds. Stored code = encode(x / scale) (nearest-even,
// saturating); restored value = decode(code) x scale, clamped to +-FLT_MAX: a finite input never
// restores as infinity or NaN.
//
// Error bound (finite x, amax as above, the f32 output), in two domains split by the scale:
// * a normal float32 scale (amax >= 448 x 2^-126 ~ 3.8e-36 for E4M3, >= 57344 x 2^-126 ~ 6.5e-34
//   for E5M2): |restored - x| <= amax / 28 for E4M3 (half the spacing 32 of [256, 448], over
//   448) and amax / 14 for E5M2 (4096 / 57344), plus float32 rounding of the division and the
//   product (a few 2^-24 relative);
// * a subnormal scale (smaller amax): |restored - x| <= amax / 16 for E4M3 and amax / 8 for
//   E5M2 (amax / scale may fall below the top binade, whose half spacing over its lower end is
//   2^-4, resp. 2^-3), plus float32 rounding of the product (at most 2^-150 there).
// Per element |restored - x| <= 2^-4 |x| (E4M3; 2^-3 for E5M2) wherever x / scale is a normal
// 8-bit value. NaN stays NaN; +-infinity stays infinity in E5M2 and becomes NaN in E4M3 (fp8.hpp).

/// The bits of FLT_MIN (2^-126), the smallest normal float32: below it a scale is subnormal.
inline constexpr uint32_t kFloat32MinNormalBits = 0x00800000u;

/// The largest finite value of an 8-bit type (0 for the others: they are never scaled).
HSS_HOST_DEVICE constexpr float fp8_max(ElemType t) {
  switch (t) {
    case ElemType::kFp8E4M3:
      return kE4M3Max;
    case ElemType::kFp8E5M2:
      return kE5M2Max;
    case ElemType::kFloat32:
    case ElemType::kFloat16:
    case ElemType::kBFloat16:
      return 0.0f;
  }
  __builtin_unreachable();
}

/// The bits of |x| for a finite x, 0 (the bits of +0) for NaN and infinities: what amax counts.
/// Non-negative non-NaN floats order as their bits do, so a running maximum of these as integers
/// is the bits of amax (the host's amax loops: integer maxima vectorise, float ones do not).
HSS_HOST_DEVICE uint32_t finite_magnitude_bits(float x) {
  const uint32_t magnitude = float_to_bits(x) & 0x7FFFFFFFu;
  return magnitude < 0x7F800000u ? magnitude : 0u;
}

/// amax folded with one more element: non-finite elements do not count.
HSS_HOST_DEVICE float amax_add(float amax, float x) {
  const float a = bits_to_float(finite_magnitude_bits(x));
  return a > amax ? a : amax;
}

/// The scale of a row whose finite elements have largest magnitude `amax`, for type `t`.
HSS_HOST_DEVICE float row_scale(float amax, ElemType t) {
  if (!(amax > 0.0f)) return 1.0f;
  const float max_finite = fp8_max(t);
  const float scale = amax / max_finite;
  const uint32_t bits = float_to_bits(scale);
  if (bits >= kFloat32MinNormalBits) return scale;
  // A subnormal (or zero) scale: the next multiple of 2^-149 up when the nearest one lies below
  // amax / max_finite (one step is enough: rounding to nearest moved it by half a step at most).
  if (bits == 0u) return bits_to_float(1u);  // 2^-149: never zero
  return amax / scale > max_finite ? bits_to_float(bits + 1u) : scale;
}

/// The 8-bit code of `x` in a row of scale `scale`, for a type known at compile time (the host
/// loops: they vectorise).
template <ElemType T>
HSS_HOST_DEVICE uint8_t quantise_as(float x, float scale) {
  static_assert(T == ElemType::kFp8E4M3 || T == ElemType::kFp8E5M2, "an 8-bit type");
  const float y = x / scale;
  if constexpr (T == ElemType::kFp8E5M2) {
    return float_to_e5m2(y);
  } else {
    return float_to_e4m3(y);
  }
}

/// The value of a code whose own value (fp8.hpp's decode) is `c`, in a row of scale `scale`
/// (finite codes stay finite: see above). The host's dequantiser takes `c` from a table.
HSS_HOST_DEVICE float dequantise_value(float c, float scale) {
  const uint32_t v_bits = float_to_bits(c * scale);
  const bool finite_code = (float_to_bits(c) & 0x7FFFFFFFu) < 0x7F800000u;
  const bool overflowed = (v_bits & 0x7FFFFFFFu) == 0x7F800000u;
  // A finite code whose product overflowed: the largest finite float32 of its sign.
  return bits_to_float((finite_code & overflowed) ? (v_bits & 0x80000000u) | 0x7F7FFFFFu : v_bits);
}

/// The value of `code` in a row of scale `scale`.
template <ElemType T>
HSS_HOST_DEVICE float dequantise_as(uint8_t code, float scale) {
  static_assert(T == ElemType::kFp8E4M3 || T == ElemType::kFp8E5M2, "an 8-bit type");
  return dequantise_value(T == ElemType::kFp8E5M2 ? e5m2_to_float(code) : e4m3_to_float(code),
                          scale);
}

/// quantise_as / dequantise_as for a type known at run time.
HSS_HOST_DEVICE uint8_t quantise(float x, float scale, ElemType t) {
  return t == ElemType::kFp8E5M2 ? quantise_as<ElemType::kFp8E5M2>(x, scale)
                                 : quantise_as<ElemType::kFp8E4M3>(x, scale);
}
HSS_HOST_DEVICE float dequantise(uint8_t code, float scale, ElemType t) {
  return t == ElemType::kFp8E5M2 ? dequantise_as<ElemType::kFp8E5M2>(code, scale)
                                 : dequantise_as<ElemType::kFp8E4M3>(code, scale);
}

}  // namespace hss::kernels
