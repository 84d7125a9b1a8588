#pragma once
// The host path's 8-bit rows: the row scale, the quantiser and the dequantiser of
// kernels/hss/kernels/convert.hpp (row_scale, quantise_as, dequantise_as), bit for bit, as loops
// GCC vectorises on the x86-64 baseline (fp8_rows.cpp says how).

#include <cstdint>
#include <span>

#include "datapath/host/host_copy.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/kernels/layout.hpp"

namespace hss::detail {

/// The scale of source row `row` for the 8-bit type `type`: kernels::source_row_scale's value
/// (a 16-bit row widened in the loops of `isa`: the same value from each).
[[nodiscard]] float fp8_row_scale(const kernels::SourceView& src, int64_t row,
                                  kernels::ElemType type, CopyIsa isa);

/// Quantises n contiguous source elements of `src_type` against `scale` into 8-bit codes of
/// `type`: kernels::quantise_as per element, in the loops of `isa` (the same bits from each).
void fp8_quantise_run(const void* src, kernels::ElemType src_type, uint8_t* dst, int64_t n,
                      float scale, kernels::ElemType type, CopyIsa isa);

/// Dequantises n codes of `type` in a row of scale `scale` into n contiguous elements of an
/// output of type `out_type`: kernels::dequantise_as per element, then narrow_from_float for a
/// 16-bit output (nearest-even).
void fp8_dequantise_run(const uint8_t* src, kernels::ElemType type, float scale, void* dst,
                        kernels::ElemType out_type, int64_t n);

/// The value of each of the 256 codes of the 8-bit type `type` (fp8.hpp's decode, tabulated).
[[nodiscard]] std::span<const float, 256> fp8_code_values(kernels::ElemType type);

}  // namespace hss::detail
