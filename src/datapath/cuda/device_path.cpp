#include "datapath/cuda/device_path.hpp"

#include "datapath/batch_tiles.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "base/log.hpp"
#include "base/nvtx.hpp"
#include "datapath/cuda/capture_mode.hpp"
#include "datapath/cuda_runtime.hpp"
#include "hss/error.hpp"
#include "hss/kernels/cuda_check.hpp"
#include "hss/kernels/launch.hpp"

namespace hss::detail {

std::unique_ptr<DevicePath> create_platform_device_path(const Config& config) {
  if (!cuda_device_available()) return nullptr;
  return std::make_unique<cuda::CudaDevicePath>(config);
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

/// A launch slot's table holds any of: restore tiles, cub's three arrays, batch tiles, warm-up.
size_t launch_table_bytes() {
  return std::max({kRestoreTilesPerSlot * sizeof(kernels::GatherSegment),
                   3 * kRestoreTilesPerSlot * sizeof(uint64_t),
                   kBatchTilesPerTable * sizeof(kernels::BatchStoreTile),
                   kBatchTilesPerTable * sizeof(kernels::BatchRestoreTile),
                   kernels::warm_up_table_bytes()});
}

/// The device's staging: the budget, at least what one element of one round needs.
size_t staging_bytes_for(const Config& config) {
  constexpr auto kLeast = static_cast<int64_t>(2 * StagingArena::kAlign);
  return static_cast<size_t>(std::max(config.tuning.staging_bytes, kLeast));
}

}  // namespace

DeviceState::DeviceState(int index_, size_t staging_bytes, size_t launch_slots)
    : index(index_),
      staging(staging_bytes, kStagingTiles, kStagingRounds),
      restores(launch_slots, [] {
        return RestoreSlot{PinnedTable::allocate(launch_table_bytes()),
                           DeviceBuffer::allocate(std::max<size_t>(
                               kernels::cub_batched_memcpy_temp_bytes(kRestoreTilesPerSlot), 16)),
                           nullptr};
      }),
      copy_streams(index_) {
  // Load every kernel's module now (CUDA loads one at its first launch: milliseconds, on an
  // engine's hot path otherwise), through the first launch slot's table, on a stream of its own.
  OwnedStream warm = OwnedStream::create_non_blocking();
  RestoreSlot& slot = restores.unleased(0);
  kernels::warm_up(slot.table.host(), slot.table.device(), slot.cub_temp.get(),
                   slot.cub_temp.bytes(), warm.get());
  HSS_CUDA_CHECK(cudaStreamSynchronize(warm.get()));
}

// ---------------------------------------------------------------------------------------------

bool EventFence::wait() noexcept {
  if (const State s = state(); s != State::kPending) return s == State::kLanded;
  const RelaxedCaptureMode relaxed;
  const cudaError_t status = cudaEventSynchronize(event_.get());
  if (status == cudaSuccess) {
    state_.store(State::kLanded, std::memory_order_release);
    return true;
  }
  clear_own_error(status);
  fail(status);
  return false;
}

bool EventFence::ready() noexcept {
  if (state() != State::kPending) return true;
  const RelaxedCaptureMode relaxed;
  cudaError_t status = cudaSuccess;
  const EventStatus now = query_event(event_.get(), &status);
  if (now == EventStatus::kPending) return false;
  if (now == EventStatus::kDone) {
    state_.store(State::kLanded, std::memory_order_release);
  } else {
    fail(status);  // nothing will land any more: the entries must never be served
  }
  return true;
}

void EventFence::fail(cudaError_t status) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (error_.empty()) {
      try {
        error_ = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
      } catch (...) {  // no memory for the message: the state below still says failed
      }
    }
  }
  state_.store(State::kFailed, std::memory_order_release);
}

std::string EventFence::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

// ---------------------------------------------------------------------------------------------

CudaDevicePath::CudaDevicePath(const Config& config)
    : restore_impl_(config.tuning.restore_impl),
      staging_bytes_(staging_bytes_for(config)),
      launch_slots_(static_cast<size_t>(std::max<int64_t>(config.tuning.launch_slots, 1))) {
  int count = 0;
  HSS_CUDA_CHECK(cudaGetDeviceCount(&count));
  devices_.resize(static_cast<size_t>(count));
  // The store's device's state (staging, launch slots, loaded kernels) now, before an engine
  // sizes its KV cache from the memory left, and off its first calls' path; made by a thread
  // bound to that device, so the caller's current device gets no context.
  (void)device(store_device(config));
  if (log_enabled(LogLevel::kDebug)) {
    log(LogLevel::kDebug, std::string("CUDA data path: restore implementation ") +
                              std::string(to_string(restore_impl_)) + ", " +
                              std::to_string(staging_bytes_) + " B staging per device, " +
                              std::to_string(count) + " device(s)");
  }
}

CudaDevicePath::~CudaDevicePath() {
  const RelaxedCaptureMode relaxed;
  // Pending copies read staging and write pool blocks; restores read the pool. Let them finish
  // before either goes, then drop what restores kept alive (the owner destroys the pool after us).
  for (auto& dev : devices_) {
    if (!dev) continue;
    dev->copy_streams.synchronize();
    dev->staging.synchronize();
    dev->restores.synchronize();
  }
  for (auto& weak : outstanding_) {
    if (auto fence = weak.lock()) (void)fence->wait();
  }
  (void)release_finished();
  // Each device's resources go on a thread bound to it: freeing them from this thread would
  // initialise this thread's current device's context (cudaFree needs one).
  for (auto& dev : devices_) {
    if (!dev) continue;
    try {
      run_on_device(dev->index, [&] { dev.reset(); });
    } catch (...) {  // no thread, or the device is lost: free them here
      dev.reset();
    }
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
    // Made by a thread bound to the device (its streams, buffers and kernels belong to it): the
    // caller's current device is left alone and gets no context.
    run_on_device(
        index, [&] { dev = std::make_unique<DeviceState>(index, staging_bytes_, launch_slots_); });
  }
  return *dev;
}

std::vector<DeviceState*> CudaDevicePath::devices_in_use() {
  std::vector<DeviceState*> devices;
  std::lock_guard lock(mutex_);
  for (auto& dev : devices_) {
    if (dev) devices.push_back(dev.get());
  }
  return devices;
}

void CudaDevicePath::check_stream(Stream stream_handle) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t query = cudaStreamIsCapturing(stream, &status);
  if (query == cudaSuccess && status == cudaStreamCaptureStatusNone) return;
  clear_own_error(query);
  const bool legacy = stream == nullptr || stream == cudaStreamLegacy;
  const std::string which = legacy ? "the legacy default stream (which would synchronise with a "
                                     "capturing stream)"
                                   : "a stream that is capturing a CUDA graph";
  throw Error(
      "hsstore device calls cannot be captured: options.stream is " + which +
      "; a replay would not repeat what the call does on the host (pool addresses, "
      "pins, fences). Call it outside the capture." +
      (query != cudaSuccess ? std::string(" (") + cudaGetErrorName(query) + ")" : std::string()));
}

void CudaDevicePath::check_pointer(const void* data, bool on_device, int device_index,
                                   std::string_view what) {
  const RelaxedCaptureMode relaxed;
  const cudaPointerAttributes attributes = pointer_attributes(data);
  const bool device_memory =
      attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  if (on_device && (!device_memory || attributes.device != device_index)) {
    throw InvalidArgument(
        std::string(what) + ".data is not memory of CUDA device " + std::to_string(device_index) +
        (device_memory ? " (it is on device " + std::to_string(attributes.device) + ")"
                       : std::string(" (it is host memory)")));
  }
  if (!on_device && attributes.type == cudaMemoryTypeDevice) {
    throw InvalidArgument(std::string(what) + ".data is memory of CUDA device " +
                          std::to_string(attributes.device) + " but " + std::string(what) +
                          ".device = host");
  }
}

void CudaDevicePath::track(const std::shared_ptr<EventFence>& fence) {
  std::lock_guard lock(mutex_);
  if (outstanding_.size() >= prune_at_) {
    std::erase_if(outstanding_, [](const std::weak_ptr<EventFence>& weak) {
      const auto f = weak.lock();
      return !f || f->settled();
    });
    prune_at_ = std::max<size_t>(64, 2 * outstanding_.size());
  }
  outstanding_.push_back(fence);
}

FenceRef CudaDevicePath::store(const kernels::SourceView& src, int device_index,
                               std::span<const WriteSegment> segments, Stream stream_handle) {
  const RelaxedCaptureMode relaxed;
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  DeviceState& dev = device(device_index);  // validates the index
  DeviceGuard guard(device_index);
  for (const WriteSegment& seg : segments) {
    if (seg.dst_type != segments.front().dst_type) {
      throw Error("device store: one call must use one storage type");
    }
  }
  // Cast or not, the caller's stream carries only the gather into staging (device memory at
  // device bandwidth) and an event; the transfer to the pool runs on the copy stream, so the
  // engine's next kernels never wait for PCIe.
  const cudaStream_t copy_stream = dev.copy_streams.for_caller(stream);
  return fenced(copy_stream, [&] {
    size_t next = 0;
    int64_t consumed = 0;
    bool waited = false;
    while (next < segments.size()) {
      store_round(dev, src, segments, next, consumed, stream, copy_stream, &waited);
    }
    if (waited) staging_waits_.fetch_add(1, std::memory_order_relaxed);
  });
}

template <typename Enqueue>
FenceRef CudaDevicePath::fenced(cudaStream_t stream, Enqueue&& enqueue) {
  auto fence = std::make_shared<EventFence>();
  try {
    enqueue();
    HSS_CUDA_CHECK(cudaEventRecord(fence->event(), stream));
    track(fence);  // may throw std::bad_alloc: the wait below then covers what was enqueued
  } catch (...) {
    // Work this call already enqueued may still write blocks the store is about to withdraw
    // and free: let it land first (error path only).
    clear_own_error(cudaStreamSynchronize(stream));
    throw;
  }
  return fence;
}

namespace {

/// What a round's plan takes of staging: the codes or elements from offset 0, then (FP8) one
/// float32 scale per row the round starts, from the first 16-byte boundary after them.
struct RoundSize {
  int64_t elem_bytes = 0;
  int64_t scales = 0;
  [[nodiscard]] int64_t scale_base() const {
    return (elem_bytes + kernels::kVectorBytes - 1) / kernels::kVectorBytes * kernels::kVectorBytes;
  }
  [[nodiscard]] int64_t bytes() const { return scale_base() + 4 * scales; }
};

/// How far one round goes: plans tiles (at most one tile's elements, inside one row when
/// strided) and copy runs into staging offsets from 0 (a round's range starts kAlign-aligned, so
/// the phases staging_offset() picks hold there), up to kMaxRoundBytes of staging and
/// kStoreTilesPerRound tiles. `tile(offset, seg, first, n, scale_slot)` and `run(copy)` see each
/// piece; an FP8 segment that starts its row gets scale slot `scale_slot` (its first tile carries
/// it, every other tile -1) and `scale(slot, pool_address)` sees it. Advances next/consumed.
template <typename TileFn, typename RunFn, typename ScaleFn>
RoundSize plan_round(const kernels::SourceView& src, std::span<const WriteSegment> segments,
                     size_t& next, int64_t& consumed, int64_t capacity, TileFn&& tile, RunFn&& run,
                     ScaleFn&& scale) {
  const ElemType dst_type = segments.front().dst_type;
  const auto src_esize = static_cast<int64_t>(kernels::elem_bytes(src.type));
  const auto dst_esize = static_cast<int64_t>(kernels::elem_bytes(dst_type));
  const bool contiguous = src.row_stride == src.cols;
  size_t num_tiles = 0;
  int64_t cursor = 0;
  int64_t scales = 0;
  CopyRun last{nullptr, 0, 0};
  while (next < segments.size() && num_tiles < kStoreTilesPerRound) {
    const WriteSegment& seg = segments[next];
    const int64_t first = seg.src_elem + consumed;
    const int64_t left = seg.count - consumed;
    const bool starts_row = seg.scale != nullptr && consumed == 0 && first % src.cols == 0;
    // The scales' block after the elements: its alignment padding and a slot per row started.
    const int64_t scale_room =
        seg.scale != nullptr ? kernels::kVectorBytes - 1 + 4 * (scales + (starts_row ? 1 : 0)) : 0;
    const int64_t offset = kernels::staging_offset(
        cursor, address(kernels::source_address(src, seg.src_row0, first)), src_esize, dst_esize);
    const int64_t room = std::min(left, (capacity - scale_room - offset) / dst_esize);
    if (room <= 0) break;
    const int64_t slot = starts_row ? scales++ : -1;
    if (starts_row) scale(slot, seg.scale);
    int64_t covered = 0;
    while (covered < room && num_tiles < kStoreTilesPerRound) {
      int64_t m = std::min(room - covered, kernels::tile_elems(src.type));
      if (!contiguous) m = std::min(m, src.cols - (first + covered) % src.cols);
      tile(offset + covered * dst_esize, seg, first + covered, m, covered == 0 ? slot : -1);
      ++num_tiles;
      covered += m;
    }
    void* dst = static_cast<unsigned char*>(seg.dst) + consumed * dst_esize;
    if (last.bytes > 0 && static_cast<unsigned char*>(last.dst) + last.bytes == dst &&
        last.staging_offset + last.bytes == offset) {
      last.bytes += covered * dst_esize;
    } else {
      if (last.bytes > 0) run(last);
      last = {dst, offset, covered * dst_esize};
    }
    cursor = offset + covered * dst_esize;
    consumed += covered;
    if (consumed == seg.count) {
      ++next;
      consumed = 0;
    }
  }
  if (last.bytes > 0) run(last);
  return {cursor, scales};
}

/// Appends the D2H copy of staged scale `slot` to `pool_address`, merged with the previous one
/// where both are adjacent (consecutive rows of an entry, in one granule).
void add_scale_copy(std::vector<CopyRun>& copies, int64_t staging_offset, float* pool_address) {
  if (!copies.empty()) {
    CopyRun& last = copies.back();
    if (static_cast<unsigned char*>(last.dst) + last.bytes ==
            reinterpret_cast<unsigned char*>(pool_address) &&
        last.staging_offset + last.bytes == staging_offset) {
      last.bytes += 4;
      return;
    }
  }
  copies.push_back({pool_address, staging_offset, 4});
}

}  // namespace

void CudaDevicePath::store_round(DeviceState& dev, const kernels::SourceView& src,
                                 std::span<const WriteSegment> segments, size_t& next,
                                 int64_t& consumed, cudaStream_t stream, cudaStream_t copy_stream,
                                 bool* waited) {
  const ElemType dst_type = segments.front().dst_type;
  const auto capacity = static_cast<int64_t>(std::min(kMaxRoundBytes, dev.staging.bytes()) /
                                             StagingArena::kAlign * StagingArena::kAlign);
  // First the round's size, then its staging and descriptors, then the same plan for real.
  size_t plan_next = next;
  int64_t plan_consumed = consumed;
  size_t num_tiles = 0;
  size_t num_copies = 0;
  const auto count_tile = [&](int64_t, const WriteSegment&, int64_t, int64_t, int64_t) {
    ++num_tiles;
  };
  const auto count_copy = [&](const CopyRun&) { ++num_copies; };
  const auto count_scale = [&](int64_t, float*) { ++num_copies; };
  const RoundSize size = plan_round(src, segments, plan_next, plan_consumed, capacity, count_tile,
                                    count_copy, count_scale);
  if (num_tiles == 0) throw Error("device store: a segment does not fit the staging");

  auto lease = dev.staging.acquire(static_cast<size_t>(size.bytes()), num_tiles, waited);
  unsigned char* staging = lease->staging();
  // The kernel reads the tiles straight from the round's range of the pinned table (no upload);
  // the range's previous round has finished (the arena freed it once its event did).
  WriteSegment* tiles = lease->tiles_host();
  size_t t = 0;
  std::vector<CopyRun> copies;
  copies.reserve(num_copies);
  std::vector<CopyRun> scale_copies;  // FP8: the staged row scales, after the codes
  const int64_t scale_base = size.scale_base();
  const auto write_tile = [&](int64_t offset, const WriteSegment& seg, int64_t first, int64_t n,
                              int64_t scale_slot) {
    float* scale = scale_slot >= 0 ? reinterpret_cast<float*>(staging + scale_base + 4 * scale_slot)
                                   : nullptr;
    tiles[t++] = {staging + offset, seg.src_row0, first, n, dst_type, scale};
  };
  const auto add_copy = [&](const CopyRun& c) { copies.push_back(c); };
  const auto add_scale = [&](int64_t slot, float* pool_address) {
    add_scale_copy(scale_copies, scale_base + 4 * slot, pool_address);
  };
  (void)plan_round(src, segments, next, consumed, capacity, write_tile, add_copy, add_scale);
  copies.insert(copies.end(), scale_copies.begin(), scale_copies.end());

  lease->touch(stream);
  if (kernels::is_scaled(dst_type)) {
    launch_quantise_round(src, dst_type, lease->tiles_device(), static_cast<int64_t>(num_tiles),
                          stream);
  } else {
    HSS_RANGE("store/gather_cast");
    kernels::launch_gather_cast(src, dst_type, lease->tiles_device(),
                                static_cast<int64_t>(num_tiles), stream);
  }
  count_launches(1 + copies.size());
  HSS_CUDA_CHECK(cudaEventRecord(lease->gathered(), stream));
  lease->touch(copy_stream);
  HSS_CUDA_CHECK(cudaStreamWaitEvent(copy_stream, lease->gathered(), 0));
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

void CudaDevicePath::launch_quantise_round(const kernels::SourceView& src, ElemType dst_type,
                                           const WriteSegment* tiles, int64_t num_tiles,
                                           cudaStream_t stream) {
  HSS_RANGE("store/gather_quantise");
  kernels::launch_gather_quantise(src, dst_type, tiles, num_tiles, stream);
}

FenceRef CudaDevicePath::store_batch(std::span<const StoreJob> jobs, int device_index,
                                     Stream stream_handle) {
  const auto first = std::find_if(jobs.begin(), jobs.end(),
                                  [](const StoreJob& job) { return !job.segments.empty(); });
  if (first == jobs.end()) return nullptr;
  const RelaxedCaptureMode relaxed;
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  DeviceState& dev = device(device_index);  // validates the index
  DeviceGuard guard(device_index);
  // Every segment lies in the one pool allocation: one address tells whether it is mapped.
  if (!device_mapped(first->segments.front().dst)) {
    return store_batch_unmapped(jobs, device_index, stream_handle);
  }
  return fenced(stream, [&] {
    HSS_RANGE("store/batch");
    launch_tile_tables<kernels::BatchStoreTile>(dev, jobs, stream, fill_store_tiles,
                                                kernels::launch_store_batch, nullptr);
  });
}

FenceRef CudaDevicePath::store_batch_unmapped(std::span<const StoreJob> jobs, int device_index,
                                              Stream stream_handle) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  std::vector<FenceRef> fences;
  auto fence = std::make_shared<EventFence>();
  try {
    for (const StoreJob& job : jobs) {
      if (!job.segments.empty()) {
        fences.push_back(store(job.src, device_index, job.segments, stream));
      }
    }
    wait_on_device(stream, fences);
    HSS_CUDA_CHECK(cudaEventRecord(fence->event(), stream));
    track(fence);  // may throw std::bad_alloc: the waits below then cover every job's copies
  } catch (...) {
    // The earlier jobs' copies write blocks the store is about to withdraw: let them land.
    for (const FenceRef& f : fences) (void)f->wait();
    throw;
  }
  return fence;
}

void CudaDevicePath::wait_on_device(cudaStream_t stream, std::span<const FenceRef> after) {
  // Fences seen landed cost nothing; many entries share one fence.
  const EventFence* last = nullptr;
  for (const FenceRef& fence : after) {
    const auto* event_fence = dynamic_cast<const EventFence*>(fence.get());
    if (event_fence == nullptr || event_fence == last || event_fence->settled()) continue;
    HSS_CUDA_CHECK(cudaStreamWaitEvent(stream, event_fence->event(), 0));
    last = event_fence;
  }
}

uint64_t CudaDevicePath::launches() const { return launches_.load(std::memory_order_relaxed); }

uint64_t CudaDevicePath::launch_waits() const {
  return launch_waits_.load(std::memory_order_relaxed);
}

std::unique_ptr<SlotPool<RestoreSlot>::Lease> CudaDevicePath::acquire_launch_slot(
    DeviceState& dev) {
  bool waited = false;
  auto lease = dev.restores.acquire(&waited);
  if (waited) launch_waits_.fetch_add(1, std::memory_order_relaxed);
  return lease;
}

void CudaDevicePath::hold_until_done(RestoreSlot& slot, std::shared_ptr<const void> keep_alive) {
  if (!keep_alive) return;
  // A slot reused without a sweep still holds its previous (finished) restore's pins.
  if (slot.keep_alive) restores_in_flight_.fetch_sub(1, std::memory_order_relaxed);
  slot.keep_alive = std::move(keep_alive);
  restores_in_flight_.fetch_add(1, std::memory_order_relaxed);
}

size_t CudaDevicePath::release_finished() {
  const RelaxedCaptureMode relaxed;
  std::vector<std::shared_ptr<const void>> finished;  // destroyed outside the slot pool's lock
  for (DeviceState* dev : devices_in_use()) {
    dev->restores.sweep([&](RestoreSlot& slot) {
      if (slot.keep_alive) finished.push_back(std::move(slot.keep_alive));
    });
  }
  restores_in_flight_.fetch_sub(finished.size(), std::memory_order_relaxed);
  return finished.size();
}

void CudaDevicePath::poll() {
  const RelaxedCaptureMode relaxed;
  std::vector<std::shared_ptr<EventFence>> fences;
  {
    std::lock_guard lock(mutex_);
    std::erase_if(outstanding_, [&](const std::weak_ptr<EventFence>& weak) {
      auto fence = weak.lock();
      if (!fence || fence->settled()) return true;
      fences.push_back(std::move(fence));
      return false;
    });
  }
  for (const auto& fence : fences) (void)fence->ready();  // event queries outside every lock
  (void)release_finished();
}

size_t CudaDevicePath::restores_in_flight() const {
  return restores_in_flight_.load(std::memory_order_relaxed);
}

void CudaDevicePath::flush() {
  const RelaxedCaptureMode relaxed;
  std::vector<std::shared_ptr<EventFence>> fences;
  {
    std::lock_guard lock(mutex_);
    for (auto& weak : outstanding_) {
      if (auto fence = weak.lock()) fences.push_back(std::move(fence));
    }
    outstanding_.clear();
  }
  for (const auto& fence : fences) (void)fence->wait();  // errors surface at the entries' reads
  for (DeviceState* dev : devices_in_use()) {  // handles carry their device: no switch needed
    dev->copy_streams.synchronize();
    dev->restores.synchronize();
  }
  (void)release_finished();
}

bool CudaDevicePath::peer_access(int device, int peer) {
  if (device == peer) return true;
  std::lock_guard lock(peer_mutex_);
  const auto key = std::pair{device, peer};
  if (const auto it = peers_.find(key); it != peers_.end()) return it->second;
  const RelaxedCaptureMode relaxed;
  int can = 0;
  HSS_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer));
  bool enabled = false;
  if (can != 0) {
    // From a thread bound to `device`: its primary context (the engine's) gets the access; the
    // caller's current device is left alone.
    cudaError_t status = cudaSuccess;
    run_on_device(device, [&] {
      status = cudaDeviceEnablePeerAccess(peer, 0);
      clear_own_error(status);
    });
    enabled = status == cudaSuccess || status == cudaErrorPeerAccessAlreadyEnabled;
  }
  peers_.emplace(key, enabled);
  return enabled;
}

uint64_t CudaDevicePath::staging_waits() const {
  return staging_waits_.load(std::memory_order_relaxed);
}

}  // namespace cuda
}  // namespace hss::detail
