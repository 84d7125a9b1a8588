// The kernels of the model: cudaLaunchKernel / cudaLaunchKernelExC, and the launchers of
// hss/kernels/launch.hpp, which launch host twins through them as kernels/*.cu launch their
// __global__ functions: cudaLaunchKernelEx with tile_launch's configuration and the same dispatch
// rules (hss/kernels/dispatch.hpp), the returned status checked, the thread's last error never
// read. A twin runs every block and every thread of the grid in stream order, through the same
// per-thread code (tiling.hpp); cub::DeviceMemcpy::Batched has a twin too. Each twin reads its
// descriptor tables through checked accesses, and every typed load and store of the shared code
// goes through twin_access (HSS_DEVICE_ACCESS): alignment to the access width
// (cudaErrorMisalignedAddress) and a live allocation this device may touch, device memory of the
// launching device or device-mapped page-locked memory (cudaErrorIllegalAddress). Both errors are
// sticky, as on the hardware: the context is lost.
//
// A launch, as in CUDA: a function the model does not know is cudaErrorInvalidDeviceFunction; a
// bad configuration cudaErrorInvalidConfiguration; a lost context its sticky error; a planted
// fault (cuda_model::fail_launch) its error. The status is returned and, when it is an error,
// written to the calling thread's last-error slot (over what was pending, as every failed runtime
// call does); a launch that succeeds leaves the slot alone.

#include <cuda_runtime.h>  // cudaLaunchKernelEx's C++ form, as nvcc includes it for kernels/*.cu

#include <array>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "cuda_model.hpp"
#include "hss/kernels/cuda_check.hpp"
#include "hss/kernels/dispatch.hpp"
#include "hss/kernels/launch.hpp"
#include "hss/kernels/tiling.hpp"
#include "model/state.hpp"

namespace hss::cuda_model::detail {
namespace {

/// The launch a thread is running as a twin, with a small cache of the allocations it touched.
struct KernelContext {
  int device = 0;
  std::string name;
  int64_t grid = 0;  // blocks (gridDim.x)
  int block = 0;     // threads per block (blockDim.x)
  struct Range {
    uintptr_t begin = 0, end = 0;
  };
  std::array<Range, 4> cache{};
  size_t next = 0;
};

thread_local KernelContext* current_kernel = nullptr;

/// What the model can launch: a host twin per function address. `bind` copies a launch's
/// arguments (as a launch copies a kernel's parameters) and returns the grid's work.
struct Twin {
  std::string name;
  std::function<std::function<void()>(void** args)> bind;
};

std::mutex& twins_mutex() {
  static auto* mutex = new std::mutex;  // never destroyed: launches may come from static destructors
  return *mutex;
}

std::unordered_map<const void*, Twin>& twins() {
  static auto* registry = new std::unordered_map<const void*, Twin>;  // never destroyed
  return *registry;
}

template <typename... Params, size_t... I>
std::function<void()> bind_args(void (*fn)(Params...), void** args, std::index_sequence<I...>) {
  return [fn, values = std::tuple<Params...>(*static_cast<Params*>(args[I])...)] {
    std::apply(fn, values);
  };
}

/// `fn`, launchable as the kernel `name` (registered at its first use).
template <typename... Params>
auto twin(void (*fn)(Params...), const std::string& name) {
  const auto* key = reinterpret_cast<const void*>(fn);
  std::lock_guard lock(twins_mutex());
  if (!twins().contains(key)) {
    twins().emplace(key, Twin{name, [fn](void** args) {
                                return bind_args(fn, args, std::index_sequence_for<Params...>{});
                              }});
  }
  return fn;
}

std::string describe(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

void check_access(KernelContext& k, const void* p, size_t bytes, size_t align, bool write) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (align > 1 && a % align != 0) {
    throw Fault{cudaErrorMisalignedAddress,
                "kernel " + k.name + ": misaligned " + std::to_string(bytes) + "-byte " +
                    (write ? "store" : "load") + " at " + describe(p) + " (needs " +
                    std::to_string(align) + "-byte alignment)"};
  }
  for (const KernelContext::Range& r : k.cache) {
    if (a >= r.begin && a + bytes <= r.end) return;
  }
  std::shared_lock read(memory_mutex());
  const Allocation* alloc = find_allocation(p, bytes);
  std::string why;
  if (alloc == nullptr) {
    why = allocation_at(p) != nullptr ? "runs past the end of its allocation"
                                      : "is not memory the device can reach (pageable host "
                                        "memory, freed, or never allocated)";
  } else if (alloc->kind == MemKind::kDevice && alloc->device != k.device &&
             !peer_access_enabled(k.device, alloc->device)) {
    why = "is device memory of device " + std::to_string(alloc->device) +
          " (no peer access enabled from device " + std::to_string(k.device) + ")";
  } else if (alloc->kind == MemKind::kPinned && !alloc->device_mapped()) {
    why = "is page-locked host memory not mapped into the device (no cudaHostAllocMapped)";
  }
  if (!why.empty()) {
    throw Fault{cudaErrorIllegalAddress, "kernel " + k.name + ": " + std::to_string(bytes) +
                                             "-byte " + (write ? "store" : "load") + " at " +
                                             describe(p) + " " + why};
  }
  k.cache[k.next++ % k.cache.size()] = {alloc->base, alloc->base + alloc->bytes};
}

/// A kernel's read of element i of a device-resident table.
template <typename T>
T read_table(const T* table, int64_t i) {
  const T* p = table + i;
  check_access(*current_kernel, p, sizeof(T), alignof(T), false);
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

bool valid_config(const cudaLaunchConfig_t& c) {
  const uint64_t threads = uint64_t{c.blockDim.x} * c.blockDim.y * c.blockDim.z;
  return c.gridDim.x >= 1 && c.gridDim.x <= kernels::kMaxGridBlocks && c.gridDim.y >= 1 &&
         c.gridDim.y <= 65535 && c.gridDim.z >= 1 && c.gridDim.z <= 65535 && threads >= 1 &&
         threads <= 1024 && c.blockDim.z <= 64;
}

/// cudaLaunchKernelExC's work (the calling thread's error slot is written by the caller).
cudaError_t launch(const cudaLaunchConfig_t* config, const void* func, void** args) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return e;
  if (config == nullptr || (config->numAttrs > 0 && config->attrs == nullptr)) {
    return cudaErrorInvalidValue;
  }
  std::string name;
  std::function<std::function<void()>(void**)> bind;
  {
    std::lock_guard lock(twins_mutex());
    const auto it = twins().find(func);
    if (it == twins().end()) return cudaErrorInvalidDeviceFunction;
    name = it->second.name;
    bind = it->second.bind;
  }
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const StreamRef s = stream_of(m, config->stream, lock);
  if (!s) return cudaErrorInvalidResourceHandle;
  DeviceState& d = current_device(lock);
  init_context(d);
  // A launch runs on the current device, in one of its streams.
  if (s->device != d.index) return cudaErrorInvalidResourceHandle;
  if (d.sticky != cudaSuccess) return d.sticky;
  if (!valid_config(*config)) return cudaErrorInvalidConfiguration;
  if (m.faults.launch >= 0 && m.faults.launch-- == 0) return m.faults.launch_error;
  ++m.counters.kernel_launches;
  if (d.loaded.insert(name).second) ++m.counters.module_loads;  // lazy loading: first launch
  const int device = d.index;
  const int64_t grid = config->gridDim.x;
  const int block = static_cast<int>(config->blockDim.x);
  Op op;
  op.kind = OpKind::kKernel;
  op.what = "kernel " + name + " <<<" + std::to_string(grid) + ", " + std::to_string(block) + ">>>";
  op.body = [device, name, grid, block, body = bind(args)]() -> cudaError_t {
    DeviceAccess access;
    KernelContext context;
    context.device = device;
    context.name = name;
    context.grid = grid;
    context.block = block;
    current_kernel = &context;
    try {
      body();
    } catch (...) {
      current_kernel = nullptr;
      throw;
    }
    current_kernel = nullptr;
    return cudaSuccess;
  };
  return m.enqueue(s, std::move(op));
}

/// The twin's stand-in for cub's temporary storage: a fixed header plus a word per buffer.
size_t cub_temp_bytes_for(int64_t num_buffers) {
  return 512 + static_cast<size_t>(num_buffers > 0 ? num_buffers : 0) * 8;
}

void noop_twin() {}

}  // namespace
}  // namespace hss::cuda_model::detail

using hss::cuda_model::detail::result;

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  return result(hss::cuda_model::detail::launch(config, func, args));
}

cudaError_t cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                             size_t sharedMem, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = gridDim;
  config.blockDim = blockDim;
  config.dynamicSmemBytes = sharedMem;
  config.stream = stream;
  return cudaLaunchKernelExC(&config, func, args);
}

namespace hss::cuda_model {

const void* noop_kernel() {
  return reinterpret_cast<const void*>(detail::twin(detail::noop_twin, "noop"));
}

}  // namespace hss::cuda_model

namespace hss::kernels {
namespace {

using cuda_model::detail::check_access;
using cuda_model::detail::current_kernel;
using cuda_model::detail::read_table;
using cuda_model::detail::twin;

// The twins of kernels/*.cu's __global__ functions: the same parameters, the whole grid.

template <ElemType S, ElemType D>
void gather_cast_twin(SourceView src, const WriteSegment* tiles) {
  const int64_t grid = current_kernel->grid;
  const int block = current_kernel->block;
  for (int64_t b = 0; b < grid; ++b) {
    const WriteSegment tile = read_table(tiles, b);
    for (int lane = 0; lane < block; ++lane) store_tile<S, D>(src, tile, lane, block);
  }
}

// FP8: the block's lanes one after another, with the kernel's reduction between the amax and the
// codes (quantise_tile_lanes, fp8_tiling.hpp).
template <ElemType S, ElemType T>
void gather_quantise_twin(SourceView src, const WriteSegment* tiles) {
  const int64_t grid = current_kernel->grid;
  const int block = current_kernel->block;
  for (int64_t b = 0; b < grid; ++b) quantise_tile_lanes<S, T>(src, read_table(tiles, b), block);
}

void store_batch_twin(const BatchStoreTile* tiles) {
  const int64_t grid = current_kernel->grid;
  const int block = current_kernel->block;
  for (int64_t b = 0; b < grid; ++b) {
    const BatchStoreTile tile = read_table(tiles, b);
    if (is_scaled(tile.seg.dst_type)) {
      quantise_tile_lanes_any(tile.src, tile.seg, block);
      continue;
    }
    for (int lane = 0; lane < block; ++lane) store_tile_any(tile.src, tile.seg, lane, block);
  }
}

template <ElemType D>
void restore_gather_twin(const GatherSegment* tiles, OutputView out) {
  const int64_t grid = current_kernel->grid;
  const int block = current_kernel->block;
  for (int64_t b = 0; b < grid; ++b) {
    const GatherSegment tile = read_table(tiles, b);
    for (int lane = 0; lane < block; ++lane) restore_tile_to<D>(tile, out, lane, block);
  }
}

void restore_batch_twin(const BatchRestoreTile* tiles) {
  const int64_t grid = current_kernel->grid;
  const int block = current_kernel->block;
  for (int64_t b = 0; b < grid; ++b) {
    const BatchRestoreTile tile = read_table(tiles, b);
    for (int lane = 0; lane < block; ++lane) restore_tile_any(tile.seg, tile.out, lane, block);
  }
}

void cub_memcpy_twin(void* temp, size_t temp_bytes, const void* const* srcs, void* const* dsts,
                     const uint64_t* sizes, int64_t num_buffers) {
  check_access(*current_kernel, temp, temp_bytes, 16, true);
  for (int64_t i = 0; i < num_buffers; ++i) {
    const void* src = read_table(srcs, i);
    void* dst = read_table(dsts, i);
    const uint64_t n = read_table(sizes, i);
    if (n == 0) continue;
    check_access(*current_kernel, src, n, 1, false);
    check_access(*current_kernel, dst, n, 1, true);
    std::memmove(dst, src, n);
  }
}

/// Stands in for cub::DeviceMemcpy::Batched's copy (CCCL 3.0): too little temporary storage is
/// cudaErrorInvalidValue, returned before any launch and never written to the thread's last
/// error; otherwise it launches with <<<>>> (a failed launch lands in the last-error slot only)
/// and returns cudaPeekAtLastError() as the launch's status (thrust's triple_chevron::doit_host),
/// so an error already pending on the thread reads as cub's own.
cudaError_t cub_batched(void* temp, size_t temp_bytes, const void* const* srcs, void* const* dsts,
                        const uint64_t* sizes, int64_t num_buffers, cudaStream_t stream) {
  const size_t needed = cuda_model::detail::cub_temp_bytes_for(num_buffers);
  if (temp == nullptr || temp_bytes < needed) return cudaErrorInvalidValue;
  const cudaLaunchConfig_t config = tile_launch((num_buffers + 255) / 256, stream);
  (void)cudaLaunchKernelEx(&config, twin(cub_memcpy_twin, "cub_batched_memcpy"), temp, needed,
                           srcs, dsts, sizes, num_buffers);
  return cudaPeekAtLastError();
}

}  // namespace

void twin_access(const void* p, unsigned bytes, bool write) {
  if (current_kernel != nullptr) check_access(*current_kernel, p, bytes, bytes, write);
}

// The launchers: as kernels/*.cu, with twins for kernels.

void launch_gather_cast(const SourceView& src, ElemType dst_type, const WriteSegment* tiles,
                        int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "gather_cast")) return;
  dispatch_store_pair(src.type, dst_type, [&]<ElemType S, ElemType D>() {
    const auto kernel = twin(gather_cast_twin<S, D>, std::string("gather_cast<") + short_name(S) +
                                                         "," + short_name(D) + ">");
    const cudaLaunchConfig_t config = tile_launch(num_tiles, stream);
    HSS_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, src, tiles));
  });
}

void launch_gather_quantise(const SourceView& src, ElemType dst_type, const WriteSegment* tiles,
                            int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "gather_quantise")) return;
  dispatch_quantise_pair(src.type, dst_type, [&]<ElemType S, ElemType T>() {
    const auto kernel = twin(gather_quantise_twin<S, T>, std::string("gather_quantise<") +
                                                            short_name(S) + "," + short_name(T) +
                                                            ">");
    const cudaLaunchConfig_t config = tile_launch(num_tiles, stream);
    HSS_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, src, tiles));
  });
}

void launch_store_batch(const BatchStoreTile* tiles, int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "store_batch")) return;
  const cudaLaunchConfig_t config = tile_launch(num_tiles, stream);
  HSS_CUDA_CHECK(cudaLaunchKernelEx(&config, twin(store_batch_twin, "store_batch"), tiles));
}

void launch_restore_gather(const GatherSegment* tiles, int64_t num_tiles, const OutputView& out,
                           cudaStream_t stream) {
  if (!grid_needed(num_tiles, "restore_gather")) return;
  const cudaLaunchConfig_t config = tile_launch(num_tiles, stream);
  dispatch_output(out.type, [&]<ElemType D>() {
    const auto kernel =
        twin(restore_gather_twin<D>, std::string("restore_gather<") + short_name(D) + ">");
    HSS_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, tiles, out));
  });
}

void launch_restore_batch(const BatchRestoreTile* tiles, int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "restore_batch")) return;
  const cudaLaunchConfig_t config = tile_launch(num_tiles, stream);
  HSS_CUDA_CHECK(cudaLaunchKernelEx(&config, twin(restore_batch_twin, "restore_batch"), tiles));
}

size_t cub_batched_memcpy_temp_bytes(int64_t num_buffers) {
  return cuda_model::detail::cub_temp_bytes_for(num_buffers);
}

void launch_cub_batched_memcpy(void* temp, size_t temp_bytes, const void* const* srcs,
                               void* const* dsts, const uint64_t* sizes, int64_t num_buffers,
                               cudaStream_t stream) {
  if (num_buffers <= 0) return;
  // As kernels/restore_gather.cu: cub would report an error pending on the thread as its own.
  if (detail::last_error_pending()) {
    throw Error("cub_batched_memcpy: the calling thread has a CUDA error pending, which cub would "
                "report as its own launch's; nothing was launched");
  }
  HSS_CUDA_CHECK(cub_batched(temp, temp_bytes, srcs, dsts, sizes, num_buffers, stream));
}

}  // namespace hss::kernels
