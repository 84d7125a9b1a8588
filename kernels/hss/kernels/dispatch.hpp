#pragma once
// The launchers' rules, shared by the CUDA launchers (kernels/*.cu) and their host twins (the
// CUDA runtime model, tests/cuda_model): the grid limit, which (source, storage) pairs a store
// kernel supports and which output types a restore writes. Both sides reject exactly the same
// calls with the same messages, and launch with the same configuration. Host code only.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "hss/error.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/kernels/elem_visit.hpp"
#include "hss/kernels/fp8_tiling.hpp"
#include "hss/kernels/tiling.hpp"

namespace hss::kernels {

/// gridDim.x limit of a 1-D launch (one block per tile).
inline constexpr int64_t kMaxGridBlocks = 0x7FFFFFFF;

/// False when there is nothing to launch; hss::Error when the grid would be too large.
inline bool grid_needed(int64_t num_tiles, const char* kernel) {
  if (num_tiles <= 0) return false;
  if (num_tiles > kMaxGridBlocks)
    throw Error(std::string(kernel) + ": too many tiles for one grid");
  return true;
}

/// The launch of a tile kernel: one block of kBlockThreads per tile on `stream`, no dynamic shared
/// memory, no attributes. Launched with cudaLaunchKernelEx, whose returned status is the launch's
/// own (cuda_check.hpp says why not <<<>>> and cudaGetLastError). num_tiles: grid_needed() said so.
inline cudaLaunchConfig_t tile_launch(int64_t num_tiles, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(num_tiles), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(kBlockThreads), 1, 1);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = nullptr;
  config.numAttrs = 0;
  return config;
}

/// Calls fn.template operator()<S, D>() for a store kernel's supported (source S, storage D)
/// pair (store_pair_supported, elem_visit.hpp). hss::Error for any other.
template <typename Fn>
void dispatch_store_pair(ElemType src, ElemType dst, Fn&& fn) {
  if (visit_store_pair(src, dst, fn)) return;
  throw Error("gather_cast: unsupported (source, storage) element types (" +
              std::to_string(static_cast<int>(src)) + ", " + std::to_string(static_cast<int>(dst)) +
              ")");
}

/// Calls fn.template operator()<S, T>() for an FP8 store kernel's (source S, 8-bit storage T)
/// pair (visit_quantise_pair, fp8_tiling.hpp). hss::Error for any other.
template <typename Fn>
void dispatch_quantise_pair(ElemType src, ElemType dst, Fn&& fn) {
  if (visit_quantise_pair(src, dst, fn)) return;
  throw Error("gather_quantise: unsupported (source, storage) element types (" +
              std::to_string(static_cast<int>(src)) + ", " + std::to_string(static_cast<int>(dst)) +
              ")");
}

/// Calls fn.template operator()<S, T>() for every FP8 store pair (warm-up).
template <typename Fn>
void dispatch_each_quantise_pair(Fn&& fn) {
  for_each_elem_type([&]<ElemType S>() {
    for_each_fp8_type([&]<ElemType T>() { fn.template operator()<S, T>(); });
  });
}

/// Calls fn.template operator()<D>() for a restore output type D. hss::Error for an unknown one.
template <typename Fn>
void dispatch_output(ElemType out, Fn&& fn) {
  if (visit_elem_type(out, fn)) return;
  throw Error("restore_gather: unknown output element type " +
              std::to_string(static_cast<int>(out)));
}

/// Calls fn.template operator()<S, D>() for every supported store pair (warm-up).
template <typename Fn>
void dispatch_each_store_pair(Fn&& fn) {
  for_each_store_pair(fn);
}

/// Calls fn.template operator()<D>() for every restore output type (warm-up).
template <typename Fn>
void dispatch_each_output(Fn&& fn) {
  for_each_elem_type(fn);
}

/// Short names of the element types, for kernel names ("gather_cast<bf16,f32>").
inline const char* short_name(ElemType t) {
  switch (t) {
    case ElemType::kFloat32:
      return "f32";
    case ElemType::kFloat16:
      return "f16";
    case ElemType::kBFloat16:
      return "bf16";
    case ElemType::kFp8E4M3:
      return "e4m3";
    case ElemType::kFp8E5M2:
      return "e5m2";
  }
  return "?";  // not an ElemType
}

}  // namespace hss::kernels
