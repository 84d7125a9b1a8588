// Restore into device memory: the three implementations selected by HSS_RESTORE_IMPL and the
// fallback for a pool that is not device-mapped.

#include <algorithm>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/device_path.hpp"
#include "hss/kernels/launch.hpp"
#include "hss/kernels/tiling.hpp"

namespace hss::detail::cuda {

using kernels::ElemType;
using kernels::GatherSegment;

namespace {

/// True when the kernel can read `p` directly: page-locked memory mapped into the device's
/// address space at the same address (UVA).
bool device_mapped(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return (attributes.type == cudaMemoryTypeHost && attributes.devicePointer == p) ||
         attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

bool all_float32(std::span<const GatherSegment> segments) {
  return std::all_of(segments.begin(), segments.end(),
                     [](const GatherSegment& s) { return s.src_type == ElemType::kFloat32; });
}

}  // namespace

void CudaDevicePath::restore(std::span<const GatherSegment> segments,
                             const kernels::OutputView& out, int device_index, void* stream_handle,
                             std::shared_ptr<const void> keep_alive) {
  release_finished_restores();
  if (segments.empty()) return;
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  DeviceState& dev = device(device_index);  // validates the index
  DeviceGuard guard(device_index);

  // Every segment lies in the one pool allocation: its ends tell whether it is mapped.
  if (!device_mapped(segments.front().src) || !device_mapped(segments.back().src)) {
    restore_from_pageable(segments, out, stream);
    return;
  }
  const bool bulk_ok = all_float32(segments) && out.row_stride == out.cols;
  auto lease = dev.restores.acquire();
  lease->touch(stream);
  if (restore_impl_ == RestoreImpl::kCub && bulk_ok) {
    restore_cub(**lease, segments, out, stream);
  } else if (restore_impl_ == RestoreImpl::kMemcpy && bulk_ok) {
    restore_memcpy(segments, out, stream);
  } else {
    restore_kernel(**lease, segments, out, stream);
  }
  lease->record(stream);
  if (keep_alive) {
    (*lease)->keep_alive = std::move(keep_alive);
  } else {
    lease->wait();  // the caller unpins the entries when we return
  }
}

void CudaDevicePath::restore_kernel(RestoreSlot& slot, std::span<const GatherSegment> segments,
                                    const kernels::OutputView& out, cudaStream_t stream) {
  const bool contiguous = out.row_stride == out.cols;
  std::vector<GatherSegment> tiles;
  for (const GatherSegment& seg : segments) {
    const auto esize = static_cast<int64_t>(kernels::elem_bytes(seg.src_type));
    kernels::for_each_tile(
        seg.dst_elem, seg.count, out.cols, contiguous, kernels::tile_elems(seg.src_type),
        [&](int64_t o, int64_t n) {
          tiles.push_back({static_cast<const unsigned char*>(seg.src) + o * esize, seg.dst_elem + o,
                           n, seg.src_type});
        });
  }
  const auto* device_tiles = static_cast<const GatherSegment*>(
      slot.table.upload(tiles.data(), tiles.size() * sizeof(GatherSegment), stream));
  kernels::launch_restore_gather(device_tiles, static_cast<int64_t>(tiles.size()), out, stream);
}

void CudaDevicePath::restore_cub(RestoreSlot& slot, std::span<const GatherSegment> segments,
                                 const kernels::OutputView& out, cudaStream_t stream) {
  // One table, three arrays: sources, destinations, byte sizes.
  const size_t n = segments.size();
  std::vector<uint64_t> table(3 * n);
  for (size_t i = 0; i < n; ++i) {
    table[i] = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(segments[i].src));
    table[n + i] =
        static_cast<uint64_t>(reinterpret_cast<uintptr_t>(out.data + segments[i].dst_elem));
    table[2 * n + i] = static_cast<uint64_t>(segments[i].count) * sizeof(float);
  }
  auto* device_table = static_cast<uint64_t*>(
      slot.table.upload(table.data(), table.size() * sizeof(uint64_t), stream));
  const size_t temp_bytes = kernels::cub_batched_memcpy_temp_bytes(static_cast<int64_t>(n));
  if (slot.cub_temp.bytes() < temp_bytes) {
    const size_t grown = std::max(temp_bytes, 2 * slot.cub_temp.bytes());
    slot.cub_temp = DeviceBuffer();
    slot.cub_temp = DeviceBuffer::allocate(grown);
  }
  kernels::launch_cub_batched_memcpy(slot.cub_temp.get(), slot.cub_temp.bytes(),
                                     reinterpret_cast<const void* const*>(device_table),
                                     reinterpret_cast<void* const*>(device_table + n),
                                     device_table + 2 * n, static_cast<int64_t>(n), stream);
}

void CudaDevicePath::restore_memcpy(std::span<const GatherSegment> segments,
                                    const kernels::OutputView& out, cudaStream_t stream) {
  for (const GatherSegment& seg : segments) {
    HSS_CUDA_CHECK(cudaMemcpyAsync(out.data + seg.dst_elem, seg.src,
                                   static_cast<size_t>(seg.count) * sizeof(float),
                                   cudaMemcpyHostToDevice, stream));
  }
}

void CudaDevicePath::restore_from_pageable(std::span<const GatherSegment> segments,
                                           const kernels::OutputView& out, cudaStream_t stream) {
  int64_t elems = 0;
  for (const GatherSegment& seg : segments) elems = std::max(elems, seg.dst_elem + seg.count);
  const int64_t rows = (elems + out.cols - 1) / out.cols;
  std::vector<float> dense(static_cast<size_t>(rows * out.cols));
  host_restore(segments, {dense.data(), out.cols, out.cols});
  // From pageable memory the copy has consumed `dense` when the call returns.
  HSS_CUDA_CHECK(cudaMemcpy2DAsync(out.data, static_cast<size_t>(out.row_stride) * sizeof(float),
                                   dense.data(), static_cast<size_t>(out.cols) * sizeof(float),
                                   static_cast<size_t>(out.cols) * sizeof(float),
                                   static_cast<size_t>(rows), cudaMemcpyHostToDevice, stream));
}

}  // namespace hss::detail::cuda
