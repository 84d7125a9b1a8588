#pragma once
// The two OCP 8-bit float formats (OCP "8-bit Floating Point Specification" 1.0, as PyTorch's
// float8_e4m3fn and float8_e5m2), bit-exact and shared by the host path and the kernels:
//   E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities; S.1111.111 is NaN;
//         largest finite 448 (0x7E), smallest normal 2^-6, smallest subnormal 2^-9.
//   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits. IEEE-like: S.11111.00 is infinity, the
//         other S.11111.xx NaN; largest finite 57344 (0x7B), smallest subnormal 2^-16.
// Encoding rounds to nearest, ties to even, and saturates: a finite value beyond the largest
// finite encodes as +-largest (PyTorch's `.to()` would give NaN for E4M3, infinity for E5M2;
// saturation is what a scaled quantiser wants, and with the row scales of convert.hpp no finite
// input reaches it anyway). NaN encodes as NaN; infinity as infinity in E5M2 and as NaN in E4M3,
// which has none (a saturated 448 would read back as a finite number that was never stored).
//
// Integer arithmetic on the float32 bits, like float_to_f16 (convert.hpp), but for one float32
// addition that rounds subnormal codes (the default round-to-nearest-even mode, which hsstore
// never changes; flush-to-zero cannot change it: what it flushes rounds to zero anyway), so
// host and device give the same bits.

#include <cstdint>

#include "hss/kernels/float_bits.hpp"
#include "hss/kernels/host_device.hpp"

namespace hss::kernels {

/// The parameters of one 8-bit format (types, not objects: usable in device code as constants).
struct E4M3Spec {
  static constexpr int exp_bits = 4, man_bits = 3, bias = 7;
  static constexpr uint32_t max_code = 0x7E;  ///< largest finite magnitude code
  static constexpr uint32_t nan_code = 0x7F;  ///< the NaN this encoder writes (sign bit added)
  static constexpr bool has_inf = false;
};
struct E5M2Spec {
  static constexpr int exp_bits = 5, man_bits = 2, bias = 15;
  static constexpr uint32_t max_code = 0x7B;
  static constexpr uint32_t nan_code = 0x7E;
  static constexpr bool has_inf = true;  ///< S.11111.00 is infinity
};
inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;

namespace fp8_detail {

/// Round-to-nearest-even float32 -> 8-bit code of `spec`, saturating finite values. Branch-free,
/// and the two selects that involve the subnormal path's float addition are bit masks, not `?:`:
/// GCC sinks a float operation used by only one arm of a select into a branch, which it will not
/// if-convert under -ftrapping-math (the default): the host's quantise loops would stay scalar.
template <typename Spec>
HSS_HOST_DEVICE uint8_t encode(float f) {
  constexpr int kDrop = 23 - Spec::man_bits;  // float32 mantissa bits dropped
  constexpr uint32_t kMinNormalExp32 = 127u + 1u - static_cast<uint32_t>(Spec::bias);
  // A float32 whose ulp is the smallest subnormal code: adding it rounds |f| to a multiple of
  // that code, nearest-even, in hardware (the default rounding mode on host and device).
  constexpr uint32_t kMagicBits =
      (127u + 23u + 1u - static_cast<uint32_t>(Spec::bias) - static_cast<uint32_t>(Spec::man_bits))
      << 23;
  const uint32_t bits = float_to_bits(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  // A normal code: keep man_bits, round the rest to nearest even (a carry bumps the exponent, as
  // the encoding counts), rebase the exponent. Meaningless below the smallest normal: not taken.
  const uint32_t rounded =
      (magnitude + (1u << (kDrop - 1)) - 1u + ((magnitude >> kDrop) & 1u)) >> kDrop;
  const uint32_t normal = rounded - ((127u - static_cast<uint32_t>(Spec::bias)) << Spec::man_bits);
  // A subnormal code: |f| in units of the smallest subnormal, rounded to nearest even; 1 <<
  // man_bits is the smallest normal, where the encoding continues.
  const uint32_t subnormal =
      float_to_bits(bits_to_float(magnitude) + bits_to_float(kMagicBits)) - kMagicBits;
  const uint32_t subnormal_mask = 0u - static_cast<uint32_t>(magnitude < (kMinNormalExp32 << 23));
  uint32_t code = (subnormal & subnormal_mask) | (normal & ~subnormal_mask);
  code = code < Spec::max_code ? code : Spec::max_code;  // saturate
  const uint32_t special =
      (Spec::has_inf && magnitude == 0x7F800000u) ? 0x7Cu : Spec::nan_code;  // inf / NaN
  const uint32_t special_mask = 0u - static_cast<uint32_t>(magnitude >= 0x7F800000u);
  code = (special & special_mask) | (code & ~special_mask);
  return static_cast<uint8_t>(sign | code);
}

/// 8-bit code of `spec` -> float32 (exact: every code is a float32 value). Selects, not
/// branches; no float32 subnormal is made or read (flush-to-zero modes cannot change it). The
/// host path reads these values from a table of the 256 codes (src/datapath/host/fp8_rows.cpp).
template <typename Spec>
HSS_HOST_DEVICE float decode(uint8_t c) {
  constexpr uint32_t kTopExp = (1u << Spec::exp_bits) - 1u;
  constexpr uint32_t kManMask = (1u << Spec::man_bits) - 1u;
  // mantissa x 2^(1 - bias - man_bits) for a subnormal code: an integer times a power of two.
  constexpr uint32_t kUnitBits = static_cast<uint32_t>(127 + 1 - Spec::bias - Spec::man_bits) << 23;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t exponent = (c >> Spec::man_bits) & kTopExp;
  const uint32_t mantissa = c & kManMask;
  const uint32_t normal = ((exponent + 127u - static_cast<uint32_t>(Spec::bias)) << 23) |
                          (mantissa << (23 - Spec::man_bits));
  const uint32_t subnormal = float_to_bits(static_cast<float>(mantissa) * bits_to_float(kUnitBits));
  uint32_t magnitude = exponent == 0 ? subnormal : normal;
  if constexpr (Spec::has_inf) {  // S.11111.00 infinity, else a quiet NaN with the payload
    const uint32_t special =
        0x7F800000u | (mantissa << (23 - Spec::man_bits)) | (mantissa != 0 ? 0x400000u : 0u);
    magnitude = exponent == kTopExp ? special : magnitude;
  } else {  // S.1111.111 is NaN
    magnitude = (c & 0x7Fu) == 0x7Fu ? 0x7FC00000u : magnitude;
  }
  return bits_to_float(sign | magnitude);
}

}  // namespace fp8_detail

HSS_HOST_DEVICE uint8_t float_to_e4m3(float f) { return fp8_detail::encode<E4M3Spec>(f); }
HSS_HOST_DEVICE uint8_t float_to_e5m2(float f) { return fp8_detail::encode<E5M2Spec>(f); }
HSS_HOST_DEVICE float e4m3_to_float(uint8_t c) { return fp8_detail::decode<E4M3Spec>(c); }
HSS_HOST_DEVICE float e5m2_to_float(uint8_t c) { return fp8_detail::decode<E5M2Spec>(c); }

}  // namespace hss::kernels
