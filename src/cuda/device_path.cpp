#include "cuda/device_path.hpp"

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "cuda/cuda_check.hpp"
#include "cuda_runtime.hpp"
#include "hss/error.hpp"
#include "hss/kernels/launch.hpp"
#include "hss/kernels/tiling.hpp"
#include "log.hpp"
#include "nvtx.hpp"

#if HSS_HAVE_NVTX
#include <nvtx3/nvToolsExtCudaRt.h>
#endif

namespace hss::detail {

std::unique_ptr<DevicePath> DevicePath::create() {
  if (!cuda_device_available()) return nullptr;
  return std::make_unique<cuda::CudaDevicePath>(cuda::restore_impl_from_env());
}

namespace cuda {

using kernels::ElemType;
using kernels::WriteSegment;

namespace {

uint64_t address(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

/// One D2H copy: a run of segments contiguous both in staging and in the pool.
struct CopyRun {
  void* dst;
  int64_t staging_offset;
  int64_t bytes;
};

}  // namespace

RestoreImpl restore_impl_from_env() {
  const char* value = std::getenv("HSS_RESTORE_IMPL");
  if (value == nullptr || *value == '\0') return RestoreImpl::kKernel;
  const std::string_view v(value);
  if (v == "kernel") return RestoreImpl::kKernel;
  if (v == "cub") return RestoreImpl::kCub;
  if (v == "memcpy") return RestoreImpl::kMemcpy;
  log(LogLevel::kWarn,
      "HSS_RESTORE_IMPL=" + std::string(v) + " is not one of kernel, cub, memcpy; using kernel");
  return RestoreImpl::kKernel;
}

const char* to_string(RestoreImpl impl) {
  switch (impl) {
    case RestoreImpl::kCub:
      return "cub";
    case RestoreImpl::kMemcpy:
      return "memcpy";
    default:
      return "kernel";
  }
}

DeviceState::DeviceState(int index_)
    : index(index_),
      copy_stream(Stream::create_non_blocking()),
      staging(kMaxStagingSlots,
              [] {
                return StagingSlot{DeviceBuffer::allocate(kStagingSlotBytes), MirroredTable{},
                                   Event::create()};
              }),
      restores(kMaxRestoreSlots, [] { return RestoreSlot{}; }) {
#if HSS_HAVE_NVTX
  const std::string name = "hss/copy/" + std::to_string(index);
  nvtxNameCudaStreamA(copy_stream.get(), name.c_str());
#endif
}

// ---------------------------------------------------------------------------------------------

bool EventFence::wait() noexcept {
  const cudaError_t status = cudaEventSynchronize(event_.get());
  if (status == cudaSuccess) return true;
  (void)cudaGetLastError();
  std::lock_guard lock(mutex_);
  error_ = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
  return false;
}

bool EventFence::ready() noexcept {
  // An error also counts as ready: nothing will land any more, and wait() reports it.
  return event_done(event_.get());
}

std::string EventFence::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

// ---------------------------------------------------------------------------------------------

CudaDevicePath::CudaDevicePath(RestoreImpl restore_impl) : restore_impl_(restore_impl) {
  int count = 0;
  HSS_CUDA_CHECK(cudaGetDeviceCount(&count));
  devices_.resize(static_cast<size_t>(count));
  if (log_enabled(LogLevel::kDebug)) {
    log(LogLevel::kDebug, std::string("CUDA data path: restore implementation ") +
                              to_string(restore_impl_) + ", " + std::to_string(count) +
                              " device(s)");
  }
}

CudaDevicePath::~CudaDevicePath() {
  // Pending copies read staging buffers and write pool blocks: let them land before either goes.
  for (auto& dev : devices_) {
    if (dev) (void)cudaStreamSynchronize(dev->copy_stream.get());
  }
}

DeviceState& CudaDevicePath::device(int index) {
  std::lock_guard lock(mutex_);
  if (index < 0 || static_cast<size_t>(index) >= devices_.size()) {
    throw InvalidArgument("device_index = " + std::to_string(index) + " but the process sees " +
                          std::to_string(devices_.size()) + " CUDA device(s)");
  }
  auto& dev = devices_[static_cast<size_t>(index)];
  if (!dev) {
    DeviceGuard guard(index);  // the copy stream belongs to this device
    dev = std::make_unique<DeviceState>(index);
  }
  return *dev;
}

std::shared_ptr<CopyFence> CudaDevicePath::store(const kernels::SourceView& src, int device_index,
                                                 std::span<const WriteSegment> segments,
                                                 void* stream_handle) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  DeviceState& dev = device(device_index);  // validates the index
  DeviceGuard guard(device_index);
  auto fence = std::make_shared<EventFence>();
  for (const WriteSegment& seg : segments) {
    if (seg.dst_type != segments.front().dst_type) {
      throw Error("device store: one call must use one storage type");
    }
  }
  try {
    size_t next = 0;
    int64_t consumed = 0;
    while (next < segments.size()) store_round(dev, src, segments, next, consumed, stream);
    HSS_CUDA_CHECK(cudaEventRecord(fence->event(), dev.copy_stream.get()));
  } catch (...) {
    // Copies of earlier rounds may still be landing in blocks the store is about to free.
    (void)cudaStreamSynchronize(dev.copy_stream.get());
    (void)cudaGetLastError();
    throw;
  }
  return fence;
}

void CudaDevicePath::store_round(DeviceState& dev, const kernels::SourceView& src,
                                 std::span<const WriteSegment> segments, size_t& next,
                                 int64_t& consumed, cudaStream_t stream) {
  const ElemType dst_type = segments.front().dst_type;
  const auto src_esize = static_cast<int64_t>(kernels::elem_bytes(src.type));
  const auto dst_esize = static_cast<int64_t>(kernels::elem_bytes(dst_type));
  const bool contiguous = src.row_stride == src.cols;
  const auto capacity = static_cast<int64_t>(kStagingSlotBytes);

  auto lease = dev.staging.acquire();
  StagingSlot& slot = **lease;
  auto* staging = static_cast<unsigned char*>(slot.staging.get());

  std::vector<WriteSegment> tiles;
  std::vector<CopyRun> copies;
  int64_t cursor = 0;
  while (next < segments.size()) {
    const WriteSegment& seg = segments[next];
    const int64_t first = seg.src_elem + consumed;
    const int64_t left = seg.count - consumed;
    const int64_t offset = kernels::staging_offset(
        cursor, address(kernels::source_address(src, seg.src_row0, first)), src_esize, dst_esize);
    // A segment that does not fit is split; whole vectors per piece keep the phases intact.
    int64_t n = std::min(left, (capacity - offset) / dst_esize);
    if (n < left) n -= n % 16;
    if (n <= 0) break;
    kernels::for_each_tile(
        first, n, src.cols, contiguous, kernels::tile_elems(src.type), [&](int64_t o, int64_t m) {
          tiles.push_back({staging + offset + o * dst_esize, seg.src_row0, first + o, m, dst_type});
        });
    void* dst = static_cast<unsigned char*>(seg.dst) + consumed * dst_esize;
    if (!copies.empty() &&
        static_cast<unsigned char*>(copies.back().dst) + copies.back().bytes == dst &&
        copies.back().staging_offset + copies.back().bytes == offset) {
      copies.back().bytes += n * dst_esize;
    } else {
      copies.push_back({dst, offset, n * dst_esize});
    }
    cursor = offset + n * dst_esize;
    consumed += n;
    if (consumed == seg.count) {
      ++next;
      consumed = 0;
    }
  }
  if (tiles.empty()) throw Error("device store: a segment does not fit one staging buffer");

  lease->touch(stream);
  const auto* device_tiles = static_cast<const WriteSegment*>(
      slot.tiles.upload(tiles.data(), tiles.size() * sizeof(WriteSegment), stream));
  {
    HSS_RANGE("store/gather_cast");
    kernels::launch_gather_cast(src, dst_type, device_tiles, static_cast<int64_t>(tiles.size()),
                                stream);
  }
  HSS_CUDA_CHECK(cudaEventRecord(slot.gathered.get(), stream));
  const cudaStream_t copy_stream = dev.copy_stream.get();
  lease->touch(copy_stream);
  HSS_CUDA_CHECK(cudaStreamWaitEvent(copy_stream, slot.gathered.get(), 0));
  {
    HSS_RANGE("store/d2h");
    for (const CopyRun& c : copies) {
      HSS_CUDA_CHECK(cudaMemcpyAsync(c.dst, staging + c.staging_offset,
                                     static_cast<size_t>(c.bytes), cudaMemcpyDeviceToHost,
                                     copy_stream));
    }
  }
  lease->record(copy_stream);
}

void CudaDevicePath::flush() {
  release_finished_restores();
  std::vector<DeviceState*> devices;
  {
    std::lock_guard lock(mutex_);
    for (auto& dev : devices_) {
      if (dev) devices.push_back(dev.get());
    }
  }
  for (DeviceState* dev : devices) {
    DeviceGuard guard(dev->index);
    HSS_CUDA_CHECK(cudaStreamSynchronize(dev->copy_stream.get()));
    dev->restores.synchronize();
  }
  release_finished_restores();
}

void CudaDevicePath::release_finished_restores() {
  std::vector<std::shared_ptr<const void>> finished;  // destroyed outside the pool's lock
  std::vector<DeviceState*> devices;
  {
    std::lock_guard lock(mutex_);
    for (auto& dev : devices_) {
      if (dev) devices.push_back(dev.get());
    }
  }
  for (DeviceState* dev : devices) {
    dev->restores.sweep([&](RestoreSlot& slot) {
      if (slot.keep_alive) finished.push_back(std::move(slot.keep_alive));
    });
  }
}

}  // namespace cuda
}  // namespace hss::detail
