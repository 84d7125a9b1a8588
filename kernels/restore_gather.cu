// Restore kernels: the custom batched gather (one block per tile, instantiated per output type:
// float32, float16, bfloat16; conversions through restore_tile in hss/kernels/tiling.hpp) and the
// cub::DeviceMemcpy::Batched baseline it is measured against (docs/kernels.md).

#include <cub/device/device_memcpy.cuh>

#include "hss/error.hpp"
#include "hss/kernels/cuda_check.hpp"
#include "hss/kernels/dispatch.hpp"
#include "hss/kernels/launch.hpp"
#include "hss/kernels/tiling.hpp"

namespace hss::kernels {
namespace {

template <ElemType D>
__global__ void __launch_bounds__(kBlockThreads)
    restore_gather_kernel(const GatherSegment* __restrict__ tiles, OutputView out) {
  const GatherSegment tile = tiles[blockIdx.x];
  restore_tile_to<D>(tile, out, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

// Batched restore: storage and output types vary per tile (block-uniform).
__global__ void __launch_bounds__(kBlockThreads)
    restore_batch_kernel(const BatchRestoreTile* __restrict__ tiles) {
  const BatchRestoreTile tile = tiles[blockIdx.x];
  restore_tile_any(tile.seg, tile.out, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

}  // namespace

void launch_restore_gather(const GatherSegment* tiles, int64_t num_tiles, const OutputView& out,
                           cudaStream_t stream) {
  if (!grid_needed(num_tiles, "restore_gather")) return;
  dispatch_output(out.type, [&]<ElemType D>() {
    HSS_CUDA_CLEAR_STALE_ERROR();
    restore_gather_kernel<D>
        <<<static_cast<unsigned>(num_tiles), kBlockThreads, 0, stream>>>(tiles, out);
    HSS_CUDA_CHECK_LAUNCH();
  });
}

void launch_restore_batch(const BatchRestoreTile* tiles, int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "restore_batch")) return;
  HSS_CUDA_CLEAR_STALE_ERROR();
  restore_batch_kernel<<<static_cast<unsigned>(num_tiles), kBlockThreads, 0, stream>>>(tiles);
  HSS_CUDA_CHECK_LAUNCH();
}

size_t cub_batched_memcpy_temp_bytes(int64_t num_buffers) {
  size_t bytes = 0;
  HSS_CUDA_CHECK(cub::DeviceMemcpy::Batched(
      nullptr, bytes, static_cast<const void* const*>(nullptr), static_cast<void* const*>(nullptr),
      static_cast<const uint64_t*>(nullptr), num_buffers));
  return bytes;
}

void launch_cub_batched_memcpy(void* temp, size_t temp_bytes, const void* const* srcs,
                               void* const* dsts, const uint64_t* sizes, int64_t num_buffers,
                               cudaStream_t stream) {
  if (num_buffers <= 0) return;
  HSS_CUDA_CLEAR_STALE_ERROR();
  HSS_CUDA_CHECK(
      cub::DeviceMemcpy::Batched(temp, temp_bytes, srcs, dsts, sizes, num_buffers, stream));
  HSS_CUDA_CHECK_LAUNCH();
}

}  // namespace hss::kernels
