// Store kernels: gathers the rows of every chunk a store call writes from the caller's device
// tensor into device staging, casting to the storage type (one launch per staging round), and the
// batched form that writes every item of a batch straight into the device-mapped pool (one
// launch). One block per tile. The per-element work is store_tile (hss/kernels/tiling.hpp).

#include "cuda/cuda_check.hpp"
#include "hss/error.hpp"
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
  gather_cast_kernel<S, D>
      <<<static_cast<unsigned>(num_tiles), kBlockThreads, 0, stream>>>(src, tiles);
  HSS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_gather_cast(const SourceView& src, ElemType dst_type, const WriteSegment* tiles,
                        int64_t num_tiles, cudaStream_t stream) {
  if (num_tiles <= 0) return;
  if (num_tiles > 0x7FFFFFFF) throw Error("gather_cast: too many tiles for one grid");
  using enum ElemType;
  if (dst_type == kFloat32) {
    switch (src.type) {
      case kFloat32:
        return launch<kFloat32, kFloat32>(src, tiles, num_tiles, stream);
      case kFloat16:
        return launch<kFloat16, kFloat32>(src, tiles, num_tiles, stream);
      case kBFloat16:
        return launch<kBFloat16, kFloat32>(src, tiles, num_tiles, stream);
    }
  } else if (dst_type == src.type) {
    if (src.type == kFloat16) return launch<kFloat16, kFloat16>(src, tiles, num_tiles, stream);
    if (src.type == kBFloat16) return launch<kBFloat16, kBFloat16>(src, tiles, num_tiles, stream);
  }
  throw Error("gather_cast: unsupported (source, storage) element types (" +
              std::to_string(static_cast<int>(src.type)) + ", " +
              std::to_string(static_cast<int>(dst_type)) + ")");
}

void launch_store_batch(const BatchStoreTile* tiles, int64_t num_tiles, cudaStream_t stream) {
  if (num_tiles <= 0) return;
  if (num_tiles > 0x7FFFFFFF) throw Error("store_batch: too many tiles for one grid");
  store_batch_kernel<<<static_cast<unsigned>(num_tiles), kBlockThreads, 0, stream>>>(tiles);
  HSS_CUDA_CHECK_LAUNCH();
}

}  // namespace hss::kernels
