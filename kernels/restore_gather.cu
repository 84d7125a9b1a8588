// Restore kernels: the custom batched gather (one block per tile, instantiated per output type:
// float32, float16, bfloat16; conversions through restore_tile in hss/kernels/tiling.hpp) and the
// cub::DeviceMemcpy::Batched baseline it is measured against (docs/kernels.md). Launches go
// through cudaLaunchKernelEx and check the status it returns: never the thread's last error, which
// belongs to the engine (hss/kernels/cuda_check.hpp).

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
  const cudaLaunchConfig_t config = tile_launch(num_tiles, stream);
  dispatch_output(out.type, [&]<ElemType D>() {
    HSS_CUDA_CHECK(cudaLaunchKernelEx(&config, restore_gather_kernel<D>, tiles, out));
  });
}

void launch_restore_batch(const BatchRestoreTile* tiles, int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "restore_batch")) return;
  const cudaLaunchConfig_t config = tile_launch(num_tiles, stream);
  HSS_CUDA_CHECK(cudaLaunchKernelEx(&config, restore_batch_kernel, tiles));
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
  // cub launches with <<<>>> and returns cudaPeekAtLastError() as each launch's status (CCCL 3.0:
  // thrust/system/cuda/detail/core/triple_chevron_launch.h, doit_host). An error the engine left
  // pending on this thread would read as cub's own, and cub would stop after its first kernel
  // with nothing copied: refused here (the restore takes the custom kernel instead,
  // device_restore.cpp). The status cub returns is then its own: a failed launch of cub's is also
  // left in the slot (peeking clears nothing), and HSS_CUDA_CHECK takes it out.
  if (detail::last_error_pending()) {
    throw Error("cub_batched_memcpy: the calling thread has a CUDA error pending, which cub would "
                "report as its own launch's; nothing was launched");
  }
  HSS_CUDA_CHECK(
      cub::DeviceMemcpy::Batched(temp, temp_bytes, srcs, dsts, sizes, num_buffers, stream));
}

}  // namespace hss::kernels
