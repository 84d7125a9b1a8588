// Store kernels: gathers the rows of every chunk a store call writes from the caller's device
// tensor into device staging, casting to the storage type (one launch per staging round), and the
// batched form that writes every item of a batch straight into the device-mapped pool (one
// launch). One block per tile. The per-element work is store_tile (hss/kernels/tiling.hpp); the
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

// Batched store: the types vary per tile (block-uniform), the destination is the mapped pool.
__global__ void __launch_bounds__(kBlockThreads)
    store_batch_kernel(const BatchStoreTile* __restrict__ tiles) {
  const BatchStoreTile tile = tiles[blockIdx.x];
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

void launch_store_batch(const BatchStoreTile* tiles, int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "store_batch")) return;
  const cudaLaunchConfig_t config = tile_launch(num_tiles, stream);
  HSS_CUDA_CHECK(cudaLaunchKernelEx(&config, store_batch_kernel, tiles));
}

}  // namespace hss::kernels
