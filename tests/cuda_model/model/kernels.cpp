// The kernels of the model: the launchers of hss/kernels/launch.hpp, dispatched with the same
// rules as kernels/*.cu (hss/kernels/dispatch.hpp) to host twins that run every block and every
// thread of the grid in stream order, plus a twin of cub::DeviceMemcpy::Batched. Each twin reads
// its descriptor tables through checked accesses, and every typed load and store of the shared
// per-thread code goes through twin_access (HSS_DEVICE_ACCESS): alignment to the access width
// (cudaErrorMisalignedAddress) and a live allocation this device may touch, device memory of the
// launching device or device-mapped page-locked memory (cudaErrorIllegalAddress). Both errors are
// sticky, as on the hardware: the context is lost.

#include <array>
#include <cstdio>
#include <cstring>
#include <string>

#include "hss/kernels/cuda_check.hpp"
#include "hss/kernels/dispatch.hpp"
#include "hss/kernels/launch.hpp"
#include "hss/kernels/tiling.hpp"
#include "model/state.hpp"

namespace hss::cuda_model::detail {
namespace {

/// The kernel a thread is running as a twin, with a small cache of the allocations it touched.
struct KernelContext {
  int device = 0;
  std::string name;
  struct Range {
    uintptr_t begin = 0, end = 0;
  };
  std::array<Range, 4> cache{};
  size_t next = 0;
};

thread_local KernelContext* current_kernel = nullptr;

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
  } else if (alloc->kind == MemKind::kDevice && alloc->device != k.device) {
    why = "is device memory of device " + std::to_string(alloc->device);
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

/// Enqueues a kernel twin: `grid` blocks of `block` threads; `body` runs them all. Launch errors
/// land in the thread's last-error slot, as a <<<>>> launch's do.
void launch_kernel(cudaStream_t handle, std::string name, int64_t grid, int block,
                   std::function<void()> body) {
  HSS_CUDA_CLEAR_STALE_ERROR();  // as the .cu launchers do before <<<>>>
  if (const cudaError_t e = enter(); e != cudaSuccess) {
    (void)result(e);
    return;
  }
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const StreamRef s = stream_of(m, handle, lock);
  if (!s) {
    (void)result(cudaErrorInvalidResourceHandle);
    return;
  }
  DeviceState& d = current_device(lock);
  init_context(d);
  if (s->device != d.index) {  // a launch runs on the current device, in one of its streams
    (void)result(cudaErrorInvalidResourceHandle);
    return;
  }
  if (d.sticky != cudaSuccess) {
    (void)result(d.sticky);
    return;
  }
  if (grid <= 0 || grid > kernels::kMaxGridBlocks || block <= 0 || block > 1024) {
    (void)result(cudaErrorInvalidConfiguration);
    return;
  }
  if (m.faults.launch >= 0 && m.faults.launch-- == 0) {
    (void)result(m.faults.launch_error);
    return;
  }
  ++m.counters.kernel_launches;
  if (d.loaded.insert(name).second) ++m.counters.module_loads;  // lazy loading: first launch
  const int device = d.index;
  Op op;
  op.kind = OpKind::kKernel;
  op.what = "kernel " + name + " <<<" + std::to_string(grid) + ", " + std::to_string(block) + ">>>";
  op.body = [device, name = std::move(name), body = std::move(body)]() -> cudaError_t {
    DeviceAccess access;
    KernelContext context;
    context.device = device;
    context.name = name;
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
  (void)result(m.enqueue(s, std::move(op)));
}

/// The twin's stand-in for cub's temporary storage: a fixed header plus a word per buffer.
size_t cub_temp_bytes_for(int64_t num_buffers) {
  return 512 + static_cast<size_t>(num_buffers > 0 ? num_buffers : 0) * 8;
}

}  // namespace
}  // namespace hss::cuda_model::detail

namespace hss::kernels {

using cuda_model::detail::check_access;
using cuda_model::detail::current_kernel;
using cuda_model::detail::launch_kernel;
using cuda_model::detail::read_table;

void twin_access(const void* p, unsigned bytes, bool write) {
  if (current_kernel != nullptr) check_access(*current_kernel, p, bytes, bytes, write);
}

void launch_gather_cast(const SourceView& src, ElemType dst_type, const WriteSegment* tiles,
                        int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "gather_cast")) return;
  dispatch_store_pair(src.type, dst_type, [&]<ElemType S, ElemType D>() {
    launch_kernel(stream, std::string("gather_cast<") + short_name(S) + "," + short_name(D) + ">",
                  num_tiles, kBlockThreads, [src, tiles, num_tiles] {
                    for (int64_t b = 0; b < num_tiles; ++b) {
                      const WriteSegment tile = read_table(tiles, b);
                      for (int lane = 0; lane < kBlockThreads; ++lane) {
                        store_tile<S, D>(src, tile, lane, kBlockThreads);
                      }
                    }
                  });
    HSS_CUDA_CHECK_LAUNCH();
  });
}

void launch_store_batch(const BatchStoreTile* tiles, int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "store_batch")) return;
  launch_kernel(stream, "store_batch", num_tiles, kBlockThreads, [tiles, num_tiles] {
    for (int64_t b = 0; b < num_tiles; ++b) {
      const BatchStoreTile tile = read_table(tiles, b);
      for (int lane = 0; lane < kBlockThreads; ++lane) {
        store_tile_any(tile.src, tile.seg, lane, kBlockThreads);
      }
    }
  });
  HSS_CUDA_CHECK_LAUNCH();
}

void launch_restore_gather(const GatherSegment* tiles, int64_t num_tiles, const OutputView& out,
                           cudaStream_t stream) {
  if (!grid_needed(num_tiles, "restore_gather")) return;
  dispatch_output(out.type, [&]<ElemType D>() {
    launch_kernel(stream, std::string("restore_gather<") + short_name(D) + ">", num_tiles,
                  kBlockThreads, [tiles, num_tiles, out] {
                    for (int64_t b = 0; b < num_tiles; ++b) {
                      const GatherSegment tile = read_table(tiles, b);
                      for (int lane = 0; lane < kBlockThreads; ++lane) {
                        restore_tile_to<D>(tile, out, lane, kBlockThreads);
                      }
                    }
                  });
    HSS_CUDA_CHECK_LAUNCH();
  });
}

void launch_restore_batch(const BatchRestoreTile* tiles, int64_t num_tiles, cudaStream_t stream) {
  if (!grid_needed(num_tiles, "restore_batch")) return;
  launch_kernel(stream, "restore_batch", num_tiles, kBlockThreads, [tiles, num_tiles] {
    for (int64_t b = 0; b < num_tiles; ++b) {
      const BatchRestoreTile tile = read_table(tiles, b);
      for (int lane = 0; lane < kBlockThreads; ++lane) {
        restore_tile_any(tile.seg, tile.out, lane, kBlockThreads);
      }
    }
  });
  HSS_CUDA_CHECK_LAUNCH();
}

size_t cub_batched_memcpy_temp_bytes(int64_t num_buffers) {
  return cuda_model::detail::cub_temp_bytes_for(num_buffers);
}

void launch_cub_batched_memcpy(void* temp, size_t temp_bytes, const void* const* srcs,
                               void* const* dsts, const uint64_t* sizes, int64_t num_buffers,
                               cudaStream_t stream) {
  if (num_buffers <= 0) return;
  // cub reports too little temporary storage as cudaErrorInvalidValue, before launching.
  const size_t needed = cuda_model::detail::cub_temp_bytes_for(num_buffers);
  HSS_CUDA_CLEAR_STALE_ERROR();
  HSS_CUDA_CHECK(temp != nullptr && temp_bytes >= needed ? cudaSuccess : cudaErrorInvalidValue);
  launch_kernel(stream, "cub_batched_memcpy", (num_buffers + 255) / 256, kBlockThreads,
                [temp, needed, srcs, dsts, sizes, num_buffers] {
                  check_access(*current_kernel, temp, needed, 16, true);
                  for (int64_t i = 0; i < num_buffers; ++i) {
                    const void* src = read_table(srcs, i);
                    void* dst = read_table(dsts, i);
                    const uint64_t n = read_table(sizes, i);
                    if (n == 0) continue;
                    check_access(*current_kernel, src, n, 1, false);
                    check_access(*current_kernel, dst, n, 1, true);
                    std::memmove(dst, src, n);
                  }
                });
  HSS_CUDA_CHECK_LAUNCH();
}

}  // namespace hss::kernels
