// Store kernels: gathers the rows of every chunk a store call writes from the caller's device
// tensor into device staging, casting to the storage type or quantising to FP8 (one launch per
// staging round), and the batched form that writes every item of a batch straight into the
// device-mapped pool (one launch). One block per tile. The per-element work is store_tile
// (hss/kernels/tiling.hpp) and, for FP8, quantise_tile (hss/kernels/fp8_tiling.hpp); the
// dispatch rules are hss/kernels/dispatch.hpp (shared with the host twins of the CUDA model).
// Launches go through cudaLaunchKernelEx and check the status it returns: never the thread's
// last error, which belongs to the engine (hss/kernels/cuda_check.hpp).

#include "hss/error.hpp"
#include "hss/kernels/cuda_check.hpp"
#include "hss/kernels/dispatch.hpp"
#include "hss/kernels/launch.hpp"
#include "hss/kernels/tiling.hpp"

namespace hss::kernels {
namespace {

template <ElemType S, ElemType D>
__global__ void __launch_bounds__(kBlockThreads)
    gather_cast_kernel(SourceView src, const WriteSegment* __restrict__ tiles) {
  const WriteSegment tile = tiles[blockIdx.x];
  store_tile<S, D>(src, tile, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

// FP8 store tile, by the whole block: the lanes' shares of the row's amax reduced (a maximum of
// the bits of non-negative floats: any grouping gives the row's amax), then the scale, then each
// lane's codes (fp8_tiling.hpp). Called where every thread of the block takes the same branch.
template <ElemType S, ElemType T>
__device__ void quantise_tile_block(const SourceView& src, const WriteSegment& tile) {
  __shared__ uint32_t warp_amax[kBlockThreads / 32];
  if (tile.count <= 0) return;  // block-uniform (warm-up's empty tiles)
  const int lane = static_cast<int>(threadIdx.x);
  const int lanes = static_cast<int>(blockDim.x);
  uint32_t amax = row_amax_bits_part<S>(src, tile_row(src, tile), lane, lanes);
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, amax, offset);
    amax = other > amax ? other : amax;
  }
  if (lane % 32 == 0) warp_amax[lane / 32] = amax;
  __syncthreads();
  amax = 0;
  for (int w = 0; w < (lanes + 31) / 32; ++w) amax = warp_amax[w] > amax ? warp_amax[w] : amax;
  const float scale = row_scale(bits_to_float(amax), T);
  if (lane == 0) write_row_scale(src, tile, scale);
  quantise_tile<S, T>(src, tile, scale, lane, lanes);
}

template <ElemType S, ElemType T>
__global__ void __launch_bounds__(kBlockThreads)
    gather_quantise_kernel(SourceView src, const WriteSegment* __restrict__ tiles) {
  const WriteSegment tile = tiles[blockIdx.x];
  quantise_tile_block<S, T>(src, tile);
}

// Batched store: the types vary per tile (block-uniform), the destination is the mapped pool.
__global__ void __launch_bounds__(kBlockThreads)
    store_batch_kernel(const BatchStoreTile* __restrict__ tiles) {
  const BatchStoreTile tile = tiles[blockIdx.x];
  if (visit_quantise_pair(tile.src.type, tile.seg.dst_type, [&]<ElemType S, ElemType T>() {
        quantise_tile_block<S, T>(tile.src, tile.seg);
      })) {
    return;
  }
  store_tile_any(tile.src, tile.seg, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

template <ElemType S, ElemType D>
void launch(const SourceView& src, const WriteSegment* tiles, int64_t num_tiles,
            cudaStream_t stream) {
  const cudaLaunchConfig_t config = tile_launch(num_tiles, stream);
  HSS_CUDA_CHECK(cudaLaunchKernelEx(&config, gather_cast_kernel<S, D>, src, tiles));
}

}  // namespace

void launch_gather_cast(const SourceView& src, ElemType dst_type, const WriteSegment* tiles,
                        int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "gather_cast")) return;
  dispatch_store_pair(src.type, dst_type, [&]<ElemType S, ElemType D>() {
    launch<S, D>(src, tiles, num_tiles, stream);
  });
}

void launch_gather_quantise(const SourceView& src, ElemType dst_type, const WriteSegment* tiles,
                            int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "gather_quantise")) return;
  dispatch_quantise_pair(src.type, dst_type, [&]<ElemType S, ElemType T>() {
    const cudaLaunchConfig_t config = tile_launch(num_tiles, stream);
    HSS_CUDA_CHECK(cudaLaunchKernelEx(&config, gather_quantise_kernel<S, T>, src, tiles));
  });
}

void launch_store_batch(const BatchStoreTile* tiles, int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "store_batch")) return;
  const cudaLaunchConfig_t config = tile_launch(num_tiles, stream);
  HSS_CUDA_CHECK(cudaLaunchKernelEx(&config, store_batch_kernel, tiles));
}

}  // namespace hss::kernels
