// Restore into device memory: the caller's stream waits on the device for the entries' fences,
// then the implementation chosen by hidden_state_restore_impl (kernel, copy_engine, cub;
// Config::tuning.restore_impl) reads the device-mapped pool; a fallback for a pool that is not
// device-mapped.

#include <algorithm>
#include <vector>

#include "base/nvtx.hpp"
#include "datapath/batch_tiles.hpp"
#include "datapath/cuda/capture_mode.hpp"
#include "datapath/cuda/device_path.hpp"
#include "hss/kernels/cuda_check.hpp"
#include "hss/kernels/launch.hpp"
#include "hss/kernels/tiling.hpp"

namespace hss::detail::cuda {

using kernels::ElemType;
using kernels::GatherSegment;

bool device_mapped(const void* p) {
  const RelaxedCaptureMode relaxed;
  const cudaPointerAttributes attributes = pointer_attributes(p);
  return (attributes.type == cudaMemoryTypeHost && attributes.devicePointer == p) ||
         attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

namespace {

/// A segment's source is the mapped pool or the device-resident tier's device memory (UVA tells
/// which): the copy engines infer the direction.
constexpr cudaMemcpyKind kSegmentCopy = cudaMemcpyDefault;

/// Copy engines and cub move bytes: only when no element needs converting.
bool same_types(std::span<const GatherSegment> segments, ElemType out_type) {
  return std::all_of(segments.begin(), segments.end(),
                     [&](const GatherSegment& s) { return s.src_type == out_type; });
}

/// One segment into the output with the copy engines: a head piece, whole rows as one strided
/// copy, a tail piece (one copy when the output is contiguous). Returns the copies enqueued.
uint64_t copy_segment(const GatherSegment& seg, const kernels::OutputView& out,
                      cudaStream_t stream) {
  uint64_t copies = 0;
  const auto esize = static_cast<int64_t>(kernels::elem_bytes(out.type));
  const auto* src = static_cast<const unsigned char*>(seg.src);
  int64_t flat = seg.dst_elem;
  int64_t left = seg.count;
  const auto copy_1d = [&](int64_t n) {
    ++copies;
    HSS_CUDA_CHECK(cudaMemcpyAsync(kernels::output_address(out, flat), src,
                                   static_cast<size_t>(n * esize), kSegmentCopy, stream));
    src += n * esize;
    flat += n;
    left -= n;
  };
  if (out.row_stride == out.cols) {
    copy_1d(left);
    return copies;
  }
  if (flat % out.cols != 0) copy_1d(std::min(left, out.cols - flat % out.cols));
  if (const int64_t rows = left / out.cols; rows > 0) {
    ++copies;
    HSS_CUDA_CHECK(cudaMemcpy2DAsync(
        kernels::output_address(out, flat), static_cast<size_t>(out.row_stride * esize), src,
        static_cast<size_t>(out.cols * esize), static_cast<size_t>(out.cols * esize),
        static_cast<size_t>(rows), kSegmentCopy, stream));
    src += rows * out.cols * esize;
    flat += rows * out.cols;
    left -= rows * out.cols;
  }
  if (left > 0) copy_1d(left);
  return copies;
}

}  // namespace

void CudaDevicePath::restore(std::span<const GatherSegment> segments,
                             const kernels::OutputView& out, int device_index, Stream stream_handle,
                             std::span<const FenceRef> after,
                             std::shared_ptr<const void> keep_alive) {
  (void)release_finished();
  if (segments.empty()) return;
  const RelaxedCaptureMode relaxed;
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  DeviceState& dev = device(device_index);  // validates the index
  DeviceGuard guard(device_index);

  // The entries' copies may still be landing: order the read after them on the device.
  wait_on_device(stream, after);

  // Every segment lies in the one pool allocation: its ends tell whether it is mapped.
  if (!device_mapped(segments.front().src) || !device_mapped(segments.back().src)) {
    // Pageable pool: the copy below has consumed its host staging when it returns, and the
    // fences were waited for on the host (the only host wait on a device path; docs/design.md).
    for (const FenceRef& fence : after) (void)fence->wait();
    restore_from_pageable(segments, out, stream);
    return;
  }
  if (restore_impl_ == RestoreImpl::kCopyEngine && same_types(segments, out.type)) {
    HSS_RANGE("restore/copy_engine");
    restore_copy_engine(segments, out, stream);
    if (keep_alive) {  // the copies read the pool: keep the entries until they are done
      auto lease = acquire_launch_slot(dev);
      lease->touch(stream);
      lease->record(stream);
      hold_until_done(**lease, std::move(keep_alive));
    }
    return;
  }
  size_t first = 0;
  int64_t consumed = 0;  // elements of segments[first] already launched
  while (first < segments.size()) {
    auto lease = acquire_launch_slot(dev);
    lease->touch(stream);
    restore_launch(**lease, segments, first, consumed, out, stream);
    lease->record(stream);
    hold_until_done(**lease, keep_alive);
  }
}

void CudaDevicePath::restore_batch(std::span<const RestoreJob> jobs, int device_index,
                                   Stream stream_handle, std::span<const FenceRef> after,
                                   std::shared_ptr<const void> keep_alive) {
  (void)release_finished();
  const auto first = std::find_if(jobs.begin(), jobs.end(),
                                  [](const RestoreJob& job) { return !job.segments.empty(); });
  if (first == jobs.end()) return;
  const RelaxedCaptureMode relaxed;
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  DeviceState& dev = device(device_index);  // validates the index
  DeviceGuard guard(device_index);
  wait_on_device(stream, after);
  if (!device_mapped(first->segments.front().src)) {
    for (const FenceRef& fence : after) (void)fence->wait();  // as restore(): the pageable case
    for (const RestoreJob& job : jobs) {
      if (!job.segments.empty()) restore_from_pageable(job.segments, job.out, stream);
    }
    return;
  }
  HSS_RANGE("restore/batch");
  launch_tile_tables<kernels::BatchRestoreTile>(dev, jobs, stream, fill_restore_tiles,
                                                kernels::launch_restore_batch, keep_alive);
}

void CudaDevicePath::restore_launch(RestoreSlot& slot, std::span<const GatherSegment> segments,
                                    size_t& first, int64_t& consumed,
                                    const kernels::OutputView& out, cudaStream_t stream) {
  const bool contiguous = out.row_stride == out.cols;
  // cub takes the thread's last error as its launches' status (launch.hpp): with an error the
  // engine left pending there, the custom kernel (which checks its own launch's status) instead.
  if (restore_impl_ == RestoreImpl::kCub && contiguous && same_types(segments, out.type) &&
      !last_error_pending()) {
    HSS_RANGE("restore/cub");
    // Three arrays in the slot's pinned table: sources, destinations, byte sizes.
    const size_t n = std::min(segments.size() - first, kRestoreTilesPerSlot);
    auto* table = static_cast<uint64_t*>(slot.table.host());
    const auto esize = static_cast<int64_t>(kernels::elem_bytes(out.type));
    for (size_t i = 0; i < n; ++i) {
      const GatherSegment& seg = segments[first + i];
      const int64_t skip = i == 0 ? consumed : 0;
      table[i] = static_cast<uint64_t>(
          reinterpret_cast<uintptr_t>(static_cast<const unsigned char*>(seg.src) + skip * esize));
      table[kRestoreTilesPerSlot + i] = static_cast<uint64_t>(
          reinterpret_cast<uintptr_t>(kernels::output_address(out, seg.dst_elem + skip)));
      table[2 * kRestoreTilesPerSlot + i] = static_cast<uint64_t>((seg.count - skip) * esize);
    }
    const auto* device_table = static_cast<const uint64_t*>(slot.table.device());
    kernels::launch_cub_batched_memcpy(
        slot.cub_temp.get(), slot.cub_temp.bytes(),
        reinterpret_cast<const void* const*>(device_table),
        reinterpret_cast<void* const*>(device_table + kRestoreTilesPerSlot),
        device_table + 2 * kRestoreTilesPerSlot, static_cast<int64_t>(n), stream);
    count_launches();
    first += n;
    consumed = 0;
    return;
  }
  HSS_RANGE("restore/kernel");
  // Tiles straight into the slot's pinned table (the kernel reads it through its device
  // address); a launch ends when the table is full, mid-segment if need be.
  auto* tiles = static_cast<GatherSegment*>(slot.table.host());
  size_t num_tiles = 0;
  while (first < segments.size() && num_tiles < kRestoreTilesPerSlot) {
    const GatherSegment& seg = segments[first];
    const auto esize = static_cast<int64_t>(kernels::elem_bytes(seg.src_type));
    const int64_t max_elems = kernels::tile_elems(seg.src_type);
    while (consumed < seg.count && num_tiles < kRestoreTilesPerSlot) {
      const int64_t flat = seg.dst_elem + consumed;
      int64_t n = std::min(seg.count - consumed, max_elems);
      if (!contiguous) n = std::min(n, out.cols - flat % out.cols);
      tiles[num_tiles++] = {static_cast<const unsigned char*>(seg.src) + consumed * esize, flat, n,
                            seg.src_type, seg.scale};
      consumed += n;
    }
    if (consumed == seg.count) {
      ++first;
      consumed = 0;
    }
  }
  kernels::launch_restore_gather(static_cast<const GatherSegment*>(slot.table.device()),
                                 static_cast<int64_t>(num_tiles), out, stream);
  count_launches();
}

void CudaDevicePath::restore_copy_engine(std::span<const GatherSegment> segments,
                                         const kernels::OutputView& out, cudaStream_t stream) {
  for (const GatherSegment& seg : segments) count_launches(copy_segment(seg, out, stream));
}

void CudaDevicePath::restore_from_pageable(std::span<const GatherSegment> segments,
                                           const kernels::OutputView& out, cudaStream_t stream) {
  int64_t elems = 0;
  for (const GatherSegment& seg : segments) elems = std::max(elems, seg.dst_elem + seg.count);
  const int64_t rows = (elems + out.cols - 1) / out.cols;
  const auto esize = static_cast<int64_t>(kernels::elem_bytes(out.type));
  std::vector<unsigned char> dense(static_cast<size_t>(rows * out.cols * esize));
  host_restore(segments, {dense.data(), out.cols, out.cols, out.type});
  // From pageable memory the copy has consumed `dense` when the call returns.
  count_launches();
  HSS_CUDA_CHECK(cudaMemcpy2DAsync(out.data, static_cast<size_t>(out.row_stride * esize),
                                   dense.data(), static_cast<size_t>(out.cols * esize),
                                   static_cast<size_t>(out.cols * esize), static_cast<size_t>(rows),
                                   cudaMemcpyHostToDevice, stream));
}

}  // namespace hss::detail::cuda
