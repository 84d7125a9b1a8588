#pragma once
// The CUDA data path (data_path.hpp's DevicePath for CUDA builds).
//
// Store, per call, in staging rounds (at most kMaxRoundBytes of staging each), cast or not:
//     caller's stream: gather_cast kernel (rows -> staging, cast to the storage type or copied;
//                      tiles read from the round's range of the pinned descriptor table) -> event
//                      `gathered`; for FP8 storage the gather_quantise kernel instead (codes and
//                      each started row's float32 scale -> staging, the scales after the codes,
//                      the same rule as the host path: hss/kernels/fp8_tiling.hpp)
//     copy stream of (device, caller stream): wait `gathered` -> D2H copies -> round `done`;
//                      after the last round the call's fence event.
//   The caller's stream carries the gather and the event only, never the transfer over PCIe (the
//   engine's next kernels would wait for it: about 2.5 ms per 128 MiB); it may then overwrite its
//   tensor. Copy streams are per caller stream, so work from stream B never queues behind stream
//   A's copies; cudaStreamPerThread, one handle for a stream per host thread, gets one per thread
//   (copy_streams.hpp).
// * Staging is counted in bytes (staging_arena.hpp): a round leases the bytes it needs of the
//   device's hidden_state_staging_bytes (Config::tuning.staging_bytes, default 1 GiB). The host
//   waits only when they do not fit beside the rounds in flight; a store that waited counts once
//   (staging_waits).
//
// Batches (store_batch, restore_batch): one launch per stream for every job of the batch (per
// table of kBatchTilesPerTable tiles): the batch kernels read per-tile views, so items of
// different tensors and types share the launch. Stores write straight into the device-mapped pool
// (no staging); the fence is an event on the caller's stream after the launch.
//
// Restore (device output): the caller's stream first waits (cudaStreamWaitEvent) for the fences
// of the entries read, then one launch reads the pool through its device mapping
// (cudaHostAllocMapped + UVA: a pool address is a device address) and writes out.type. Three
// implementations (Config::tuning.restore_impl; HSS_RESTORE_IMPL overrides it
// through Config::with_env_overrides, config_env.hpp):
// kernel, copy_engine (cudaMemcpy*Async: leaves the SMs free; needs matching types), cub.
//
// Allocation: staging slots, restore slots, their pinned descriptor tables and the copy stream of
// a new caller stream are created on first use (warm-up), bounded in number; store and restore
// never allocate or free on the CUDA runtime afterwards.
//
// Capture: a device call on a capturing stream is refused (check_stream); every CUDA call the path
// makes runs in relaxed capture mode (capture_mode.hpp), so its work on other streams and threads
// never invalidates a graph an engine captures meanwhile.
//
// Thread-safe: every method may be called from many threads at once.

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "datapath/batch_tiles.hpp"
#include "datapath/cuda/copy_streams.hpp"
#include "datapath/cuda/cuda_raii.hpp"
#include "datapath/cuda/slot_pool.hpp"
#include "datapath/cuda/staging_arena.hpp"
#include "datapath/data_path.hpp"
#include "hss/kernels/tiling.hpp"

namespace hss::detail::cuda {

/// Staging one store round takes at most; a larger store runs in rounds.
inline constexpr size_t kMaxRoundBytes = size_t{64} << 20;
/// Tiles of one round at most: a round ends when they are used up (strided rows cut tiles short).
inline constexpr size_t kStoreTilesPerRound = kMaxRoundBytes / kernels::kTileBytes + 1024;
/// Store rounds in flight per device, and their descriptors (2.6 MiB of page-locked memory): a
/// store waits for the oldest round when either is used up, as when staging bytes are.
inline constexpr size_t kStagingRounds = 256;
inline constexpr size_t kStagingTiles = 65536;
/// Descriptors per launch slot table. A restore launch ends when its table is full.
inline constexpr size_t kRestoreTilesPerSlot = 16384;

/// True when the device can read and write `p` at the same address: page-locked memory mapped
/// into the device's address space (cudaHostAllocMapped + UVA), or device memory.
[[nodiscard]] bool device_mapped(const void* p);

/// A launch slot: restores and batched stores (kBatchTilesPerTable batch tiles) fill its table.
struct RestoreSlot {
  PinnedTable table;  // kRestoreTilesPerSlot GatherSegments, 3 x that many uint64 for cub, or
                      // kBatchTilesPerTable batch tiles
  DeviceBuffer cub_temp;
  std::shared_ptr<const void> keep_alive;  // pool entries the enqueued restore still reads
};

/// Resources of one device, created on its first use.
struct DeviceState {
  DeviceState(int index, size_t staging_bytes, size_t launch_slots);

  const int index;
  StagingArena staging;
  SlotPool<RestoreSlot> restores;
  CopyStreams copy_streams;  // one per caller stream (per host thread for cudaStreamPerThread)
};

/// The call's fence: an event recorded after its last copy (blocking-sync: a host wait sleeps).
/// An error from the event (a failed copy or kernel, a lost context) makes it failed, never
/// landed: the store drops the entries and counts them (stats().copy_failures).
class EventFence final : public CopyFence {
 public:
  EventFence() : event_(Event::create(/*blocking_sync=*/true)) {}
  [[nodiscard]] bool wait() noexcept override;
  [[nodiscard]] bool ready() noexcept override;
  [[nodiscard]] std::string error() const override;
  [[nodiscard]] bool landed() const noexcept override { return state() == State::kLanded; }
  [[nodiscard]] bool failed() const noexcept override { return state() == State::kFailed; }
  [[nodiscard]] cudaEvent_t event() const { return event_.get(); }

 private:
  enum class State : uint8_t { kPending, kLanded, kFailed };
  [[nodiscard]] State state() const noexcept { return state_.load(std::memory_order_acquire); }
  void fail(cudaError_t status) noexcept;

  Event event_;
  std::atomic<State> state_{State::kPending};  // cached: later checks make no CUDA call
  mutable std::mutex mutex_;
  std::string error_;
};

class CudaDevicePath final : public DevicePath {
 public:
  explicit CudaDevicePath(const Config& config);
  /// Waits for every copy and restore (they write the pool and read staging).
  ~CudaDevicePath() override;

  void check_pointer(const void* data, bool on_device, int device_index,
                     std::string_view what) override;
  void check_stream(Stream stream) override;
  [[nodiscard]] FenceRef store(const kernels::SourceView& src, int device_index,
                               std::span<const kernels::WriteSegment> segments,
                               Stream stream) override;
  void restore(std::span<const kernels::GatherSegment> segments, const kernels::OutputView& out,
               int device_index, Stream stream, std::span<const FenceRef> after,
               std::shared_ptr<const void> keep_alive) override;
  [[nodiscard]] FenceRef store_batch(std::span<const StoreJob> jobs, int device_index,
                                     Stream stream) override;
  void restore_batch(std::span<const RestoreJob> jobs, int device_index, Stream stream,
                     std::span<const FenceRef> after,
                     std::shared_ptr<const void> keep_alive) override;
  [[nodiscard]] uint64_t launches() const override;
  [[nodiscard]] uint64_t launch_waits() const override;
  size_t release_finished() override;
  void poll() override;
  [[nodiscard]] size_t restores_in_flight() const override;
  void flush() override;
  [[nodiscard]] uint64_t staging_waits() const override;
  [[nodiscard]] bool peer_access(int device, int peer) override;

  [[nodiscard]] RestoreImpl restore_impl() const { return restore_impl_; }

 private:
  DeviceState& device(int index);
  std::vector<DeviceState*> devices_in_use();
  /// One staging round starting at segments[next] (element `consumed` of it). Advances both;
  /// sets *waited when it waited on the host for staging.
  void store_round(DeviceState& dev, const kernels::SourceView& src,
                   std::span<const kernels::WriteSegment> segments, size_t& next, int64_t& consumed,
                   cudaStream_t stream, cudaStream_t copy_stream, bool* waited);
  /// FP8 storage: the round's quantising gather (its tiles carry staged scale slots).
  static void launch_quantise_round(const kernels::SourceView& src, kernels::ElemType dst_type,
                                    const kernels::WriteSegment* tiles, int64_t num_tiles,
                                    cudaStream_t stream);
  /// Enqueues one launch of the chosen implementation from element `consumed` of
  /// segments[first] on, as much as the slot's table holds. Advances both.
  void restore_launch(RestoreSlot& slot, std::span<const kernels::GatherSegment> segments,
                      size_t& first, int64_t& consumed, const kernels::OutputView& out,
                      cudaStream_t stream);
  void restore_copy_engine(std::span<const kernels::GatherSegment> segments,
                           const kernels::OutputView& out, cudaStream_t stream);
  /// The pool is not device-mapped (pinned allocation failed): convert on the host, copy H2D.
  void restore_from_pageable(std::span<const kernels::GatherSegment> segments,
                             const kernels::OutputView& out, cudaStream_t stream);
  void track(const std::shared_ptr<EventFence>& fence);
  /// Runs `enqueue`, then records and tracks the call's fence on `stream`. On a throw, `stream`
  /// (where the call's work landing in pool blocks was queued) is drained before rethrowing.
  template <typename Enqueue>
  FenceRef fenced(cudaStream_t stream, Enqueue&& enqueue);
  /// `stream` waits on the device for every fence of `after` not yet seen landed.
  static void wait_on_device(cudaStream_t stream, std::span<const FenceRef> after);
  /// store_batch for a pool the device cannot write: store() per job, then one fence recorded on
  /// the caller's stream after it waited (on the device) for every job's copies.
  FenceRef store_batch_unmapped(std::span<const StoreJob> jobs, int device_index, Stream stream);
  void count_launches(uint64_t n = 1) { launches_.fetch_add(n, std::memory_order_relaxed); }
  /// A launch slot of `dev`; counts a host wait when every slot was in flight.
  std::unique_ptr<SlotPool<RestoreSlot>::Lease> acquire_launch_slot(DeviceState& dev);
  /// Keeps `keep_alive` in the slot until its launch finished (release_finished drops it).
  void hold_until_done(RestoreSlot& slot, std::shared_ptr<const void> keep_alive);
  /// The batched launch loop of store_batch and restore_batch, once: while `jobs` have tiles
  /// left, leases a launch slot (its previous launch finished: the table is free), fills the
  /// slot's pinned table with `fill(jobs, cursor, table)`, launches `launch(device_table, n,
  /// stream)` on `stream`, records the slot there and keeps `keep_alive` (may be null) until
  /// that launch finished.
  template <typename Tile, typename Job, typename Fill, typename Launch>
  void launch_tile_tables(DeviceState& dev, std::span<const Job> jobs, cudaStream_t stream,
                          Fill&& fill, Launch&& launch,
                          const std::shared_ptr<const void>& keep_alive);

  const RestoreImpl restore_impl_;
  const size_t staging_bytes_;
  const size_t launch_slots_;
  std::atomic<uint64_t> launch_waits_{0};
  std::atomic<uint64_t> staging_waits_{0};
  std::atomic<size_t> restores_in_flight_{0};
  std::atomic<uint64_t> launches_{0};
  std::mutex mutex_;  // guards devices_ (the vector; each state is thread-safe) and outstanding_
  std::vector<std::unique_ptr<DeviceState>> devices_;
  std::vector<std::weak_ptr<EventFence>> outstanding_;  // fences flush() must wait for
  size_t prune_at_ = 64;
  std::mutex peer_mutex_;  // guards peers_: (device, peer) -> peer access enabled
  std::map<std::pair<int, int>, bool> peers_;
};

template <typename Tile, typename Job, typename Fill, typename Launch>
void CudaDevicePath::launch_tile_tables(DeviceState& dev, std::span<const Job> jobs,
                                        cudaStream_t stream, Fill&& fill, Launch&& launch,
                                        const std::shared_ptr<const void>& keep_alive) {
  TileCursor cursor;
  while (tiles_left(jobs, cursor)) {
    auto lease = acquire_launch_slot(dev);
    auto* table = static_cast<Tile*>((**lease).table.host());
    const size_t n = fill(jobs, cursor, std::span<Tile>(table, kBatchTilesPerTable));
    lease->touch(stream);
    launch(static_cast<const Tile*>((**lease).table.device()), static_cast<int64_t>(n), stream);
    count_launches();
    lease->record(stream);
    hold_until_done(**lease, keep_alive);
  }
}

}  // namespace hss::detail::cuda
