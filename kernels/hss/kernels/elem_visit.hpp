#pragma once
// The one (source, storage) and output-type dispatch of the kernels, host and device alike: the
// device kernels' per-tile switches (store_tile_any, restore_tile_to, restore_tile_any in
// tiling.hpp), the launchers (dispatch.hpp: gather_cast, restore_gather, their host twins in the
// CUDA runtime model) and the warm-up instantiations all go through these, so the supported pairs
// are written once: store_pair_supported.

#include "hss/kernels/convert.hpp"
#include "hss/kernels/host_device.hpp"

namespace hss::kernels {

/// The store kernels' (source S, storage D) pairs: any element type into float32, and a 16-bit
/// type into itself (native storage). f32->f32, f16->f32, bf16->f32, f16->f16, bf16->bf16.
HSS_HOST_DEVICE constexpr bool store_pair_supported(ElemType src, ElemType dst) {
  return dst == ElemType::kFloat32 || dst == src;
}

/// Calls fn.template operator()<T>() for the unscaled `type`. False (nothing called) for a value
/// outside the enum, and for the 8-bit storage types, which take their own tiles (visit_fp8_type:
/// kernels/hss/kernels/fp8_tiling.hpp on the device, src/datapath/host/fp8_rows.cpp on the host).
template <typename Fn>
HSS_HOST_DEVICE bool visit_elem_type(ElemType type, Fn&& fn) {
  switch (type) {
    case ElemType::kFloat32:
      fn.template operator()<ElemType::kFloat32>();
      return true;
    case ElemType::kFloat16:
      fn.template operator()<ElemType::kFloat16>();
      return true;
    case ElemType::kBFloat16:
      fn.template operator()<ElemType::kBFloat16>();
      return true;
    case ElemType::kFp8E4M3:
    case ElemType::kFp8E5M2:
      return false;
  }
  return false;
}

/// Calls fn.template operator()<T>() for the 8-bit storage type `type` (scaled rows: a code per
/// element and a float32 scale per row). False (nothing called) for any other type.
template <typename Fn>
HSS_HOST_DEVICE bool visit_fp8_type(ElemType type, Fn&& fn) {
  switch (type) {
    case ElemType::kFp8E4M3:
      fn.template operator()<ElemType::kFp8E4M3>();
      return true;
    case ElemType::kFp8E5M2:
      fn.template operator()<ElemType::kFp8E5M2>();
      return true;
    case ElemType::kFloat32:
    case ElemType::kFloat16:
    case ElemType::kBFloat16:
      return false;
  }
  return false;
}

/// Calls fn.template operator()<S, D>() for a supported store pair (src, dst). False (nothing
/// called) for any other.
template <typename Fn>
HSS_HOST_DEVICE bool visit_store_pair(ElemType src, ElemType dst, Fn&& fn) {
  if (!store_pair_supported(src, dst)) return false;
  return visit_elem_type(src, [&]<ElemType S>() {
    if (dst == ElemType::kFloat32) {
      fn.template operator()<S, ElemType::kFloat32>();
    } else if constexpr (S != ElemType::kFloat32) {
      fn.template operator()<S, S>();
    }
  });
}

/// Calls fn.template operator()<T>() for every unscaled element type (compile-time enumeration;
/// the 8-bit types are for_each_fp8_type's).
template <typename Fn>
HSS_HOST_DEVICE void for_each_elem_type(Fn&& fn) {
  fn.template operator()<ElemType::kFloat32>();
  fn.template operator()<ElemType::kFloat16>();
  fn.template operator()<ElemType::kBFloat16>();
}

/// Calls fn.template operator()<T>() for each 8-bit storage type (compile-time enumeration).
template <typename Fn>
HSS_HOST_DEVICE void for_each_fp8_type(Fn&& fn) {
  fn.template operator()<ElemType::kFp8E4M3>();
  fn.template operator()<ElemType::kFp8E5M2>();
}

/// Calls fn.template operator()<S, D>() for every supported store pair (warm-up).
template <typename Fn>
HSS_HOST_DEVICE void for_each_store_pair(Fn&& fn) {
  for_each_elem_type([&]<ElemType S>() {
    for_each_elem_type([&]<ElemType D>() {
      if constexpr (store_pair_supported(S, D)) fn.template operator()<S, D>();
    });
  });
}

}  // namespace hss::kernels
