#pragma once
// Host-callable launchers for the kernels in kernels/*.cu. The .cu files only size the grid and
// launch; what each thread does lives in the HSS_HOST_DEVICE headers (tiling.hpp, layout.hpp,
// convert.hpp). Every launcher checks the status its launch returns (cudaLaunchKernelEx) and
// throws hss::Error with the CUDA error string; none reads or clears an error the engine left
// pending on the calling thread (cuda_check.hpp).
// Thread-safe: launchers keep no state.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "hss/kernels/layout.hpp"

namespace hss::kernels {

/// Store: one block per tile gathers the caller's rows and casts them to `dst_type` into device
/// staging. `tiles` is a device array of store tiles (tiling.hpp) whose dst is staging memory.
/// Supported (source, storage) pairs: f32->f32, f16->f32, bf16->f32, f16->f16, bf16->bf16.
void launch_gather_cast(const SourceView& src, ElemType dst_type, const WriteSegment* tiles,
                        int64_t num_tiles, cudaStream_t stream);

/// FP8 store: one block per tile (each inside one source row) finds its row's scale, writes it
/// to tile.scale when the tile starts the row, and quantises the tile's elements into 8-bit codes
/// of `dst_type` (fp8_e4m3 / fp8_e5m2) at tile.dst (fp8_tiling.hpp). Any unscaled source type.
/// `tiles` is a device array; dst and scale are device memory or the device-mapped pool.
void launch_gather_quantise(const SourceView& src, ElemType dst_type, const WriteSegment* tiles,
                            int64_t num_tiles, cudaStream_t stream);

/// Restore: one block per tile reads pool memory (device-mapped pinned host memory) and writes the
/// output of out.type (float32, float16 or bfloat16). `tiles` is a device array of restore tiles
/// (tiling.hpp), any storage types (FP8 tiles carry their row's scale); the array may live in
/// device-mapped pinned host memory.
void launch_restore_gather(const GatherSegment* tiles, int64_t num_tiles, const OutputView& out,
                           cudaStream_t stream);

/// Batched store: one block per tile (BatchStoreTile: each carries its item's source view, any
/// supported (source, storage) pair, FP8 storage included) writes straight into the device-mapped
/// pool. `tiles` may live in device-mapped pinned host memory. One launch for every item of a
/// batch on a stream.
void launch_store_batch(const BatchStoreTile* tiles, int64_t num_tiles, cudaStream_t stream);

/// Batched restore: one block per tile (BatchRestoreTile: each carries its item's output, any
/// storage and output types) reads the device-mapped pool.
void launch_restore_batch(const BatchRestoreTile* tiles, int64_t num_tiles, cudaStream_t stream);

/// cub::DeviceMemcpy::Batched over device arrays of source pointers, destination pointers and
/// byte sizes. The first call sizes the temporary storage; the second copies. cub reads the
/// thread's last error as its launches' status: with an error pending on the calling thread
/// (detail::last_error_pending) the copy is refused with hss::Error, nothing launched and the
/// pending error left where it is (the caller takes another implementation then).
[[nodiscard]] size_t cub_batched_memcpy_temp_bytes(int64_t num_buffers);
void launch_cub_batched_memcpy(void* temp, size_t temp_bytes, const void* const* srcs,
                               void* const* dsts, const uint64_t* sizes, int64_t num_buffers,
                               cudaStream_t stream);

/// Bytes of the descriptor table warm_up needs.
[[nodiscard]] size_t warm_up_table_bytes();
/// Launches every kernel above once over a table of empty tiles, so that their modules are loaded
/// now (CUDA loads a kernel's module at its first launch) and not on an engine's hot path.
/// `table_host` / `table_device`: a device-mapped pinned table of warm_up_table_bytes(), written
/// here; `cub_temp`: device scratch of cub_batched_memcpy_temp_bytes(1) bytes at least. The caller
/// synchronises `stream` before reusing the table.
void warm_up(void* table_host, const void* table_device, void* cub_temp, size_t cub_temp_bytes,
             cudaStream_t stream);

}  // namespace hss::kernels
