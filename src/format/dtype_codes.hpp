#pragma once
// The one place element types convert. hss::DType (public views) names three types;
// kernels::ElemType (what the pool stores and the kernels read) those three and the two 8-bit
// storage types; the wire code (byte 6 of every tier value and exported transfer header,
// src/format/value_codec.cpp) names a whole RowFormat (row_format.hpp): the three unscaled types
// and the two FP8 types with their float32 per-row scales in a trailing block. Conversions are
// switches, never casts through an ordinal, so reordering an enumerator cannot change what a
// stored value means; the wire codes are fixed forever (tests/format/test_value_codec.cpp pins
// them).

#include <cstdint>
#include <optional>

#include "format/row_format.hpp"
#include "hss/error.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/tensor.hpp"

namespace hss::detail {

/// Wire codes of the value format (kRemoteFormatVersion 1). Never renumber: values already in
/// Redis/Valkey or on disk, and peers on another build, read these bytes. Codes 3 and 4 came
/// with FP8 storage; a build before them reads such a value as a bad header (a counted miss),
/// never as another type.
inline constexpr uint8_t kWireFloat32 = 0;
inline constexpr uint8_t kWireFloat16 = 1;
inline constexpr uint8_t kWireBFloat16 = 2;
/// fp8_e4m3 codes, then one float32 scale per row in a trailing block (kRowF32Trailing).
inline constexpr uint8_t kWireFp8E4M3RowF32 = 3;
/// fp8_e5m2 codes, then one float32 scale per row in a trailing block (kRowF32Trailing).
inline constexpr uint8_t kWireFp8E5M2RowF32 = 4;

[[nodiscard]] constexpr kernels::ElemType to_elem_type(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat16:
      return kernels::ElemType::kFloat16;
    case DType::kBFloat16:
      return kernels::ElemType::kBFloat16;
    case DType::kFloat32:
      break;
  }
  return kernels::ElemType::kFloat32;  // views are validated (is_valid) before any conversion
}

/// The DType of an unscaled storage type. The 8-bit storage types have none (no caller's tensor
/// has them): hss::Error. Values and exports name their RowFormat (wire_code below), not a DType.
[[nodiscard]] constexpr DType to_dtype(kernels::ElemType type) {
  switch (type) {
    case kernels::ElemType::kFloat16:
      return DType::kFloat16;
    case kernels::ElemType::kBFloat16:
      return DType::kBFloat16;
    case kernels::ElemType::kFloat32:
      break;
    case kernels::ElemType::kFp8E4M3:
    case kernels::ElemType::kFp8E5M2:
      throw Error("8-bit storage has no tensor dtype or wire code");
  }
  return DType::kFloat32;
}

[[nodiscard]] constexpr uint8_t wire_code(DType dtype) noexcept {
  switch (dtype) {
    case DType::kFloat16:
      return kWireFloat16;
    case DType::kBFloat16:
      return kWireBFloat16;
    case DType::kFloat32:
      break;
  }
  return kWireFloat32;
}

/// nullopt for a code no build has written: the value is corrupt or from a newer format.
[[nodiscard]] constexpr std::optional<DType> dtype_from_wire(uint8_t code) noexcept {
  switch (code) {
    case kWireFloat32:
      return DType::kFloat32;
    case kWireFloat16:
      return DType::kFloat16;
    case kWireBFloat16:
      return DType::kBFloat16;
    default:
      return std::nullopt;
  }
}

/// The row format of an unscaled DType (what a caller's tensor of that type is stored as).
[[nodiscard]] constexpr RowFormat to_row_format(DType dtype) noexcept {
  return RowFormat::of(to_elem_type(dtype));
}

/// The wire code of a row format; nullopt for a combination no store writes (an unscaled type
/// with scales, an 8-bit type without them).
[[nodiscard]] constexpr std::optional<uint8_t> wire_code(RowFormat format) noexcept {
  const bool scaled = format.scales == ScaleLayout::kRowF32Trailing;
  if (scaled != kernels::is_scaled(format.elem)) return std::nullopt;
  switch (format.elem) {
    case kernels::ElemType::kFloat32:
      return kWireFloat32;
    case kernels::ElemType::kFloat16:
      return kWireFloat16;
    case kernels::ElemType::kBFloat16:
      return kWireBFloat16;
    case kernels::ElemType::kFp8E4M3:
      return kWireFp8E4M3RowF32;
    case kernels::ElemType::kFp8E5M2:
      return kWireFp8E5M2RowF32;
  }
  return std::nullopt;
}

/// nullopt for a code no build has written: the value is corrupt or from a newer format.
[[nodiscard]] constexpr std::optional<RowFormat> row_format_from_wire(uint8_t code) noexcept {
  switch (code) {
    case kWireFp8E4M3RowF32:
      return RowFormat{kernels::ElemType::kFp8E4M3, ScaleLayout::kRowF32Trailing};
    case kWireFp8E5M2RowF32:
      return RowFormat{kernels::ElemType::kFp8E5M2, ScaleLayout::kRowF32Trailing};
    default:
      break;
  }
  const std::optional<DType> dtype = dtype_from_wire(code);
  if (!dtype) return std::nullopt;
  return to_row_format(*dtype);
}

static_assert(to_dtype(to_elem_type(DType::kBFloat16)) == DType::kBFloat16);
static_assert(to_dtype(to_elem_type(DType::kFloat16)) == DType::kFloat16);
static_assert(kernels::elem_bytes(to_elem_type(DType::kFloat32)) == element_size(DType::kFloat32));
static_assert(kernels::elem_bytes(to_elem_type(DType::kBFloat16)) ==
              element_size(DType::kBFloat16));
static_assert(wire_code(to_row_format(DType::kBFloat16)) == wire_code(DType::kBFloat16));
static_assert(row_format_from_wire(kWireFp8E5M2RowF32) ==
              RowFormat::of(kernels::ElemType::kFp8E5M2));

}  // namespace hss::detail
