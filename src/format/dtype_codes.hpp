#pragma once
// The one place element types convert. hss::DType (public views), kernels::ElemType (what the
// pool stores and the kernels read) and the wire code (byte 6 of every remote value and exported
// transfer header, src/format/value_codec.cpp) name the same three types. Conversions are switches, never
// casts through an ordinal, so reordering an enumerator cannot change what a stored value means;
// the wire codes are fixed forever (tests/format/test_value_codec.cpp pins them).

#include <cstdint>
#include <optional>

#include "hss/error.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/tensor.hpp"

namespace hss::detail {

/// Wire codes of the remote value format (kRemoteFormatVersion 1). Never renumber: values already
/// in Redis/Valkey, and peers on another build, read these bytes.
inline constexpr uint8_t kWireFloat32 = 0;
inline constexpr uint8_t kWireFloat16 = 1;
inline constexpr uint8_t kWireBFloat16 = 2;

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
/// and no wire code has them yet): hss::Error. A store with fp8 storage has no backing tier and
/// exports nothing (Config::validate, the export's check), so no path asks.
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

static_assert(to_dtype(to_elem_type(DType::kBFloat16)) == DType::kBFloat16);
static_assert(to_dtype(to_elem_type(DType::kFloat16)) == DType::kFloat16);
static_assert(kernels::elem_bytes(to_elem_type(DType::kFloat32)) == element_size(DType::kFloat32));
static_assert(kernels::elem_bytes(to_elem_type(DType::kBFloat16)) ==
              element_size(DType::kBFloat16));

}  // namespace hss::detail
