#pragma once
// How bytes move between callers' tensors and the pool. The store plans the work as segments
// (kernels/hss/kernels/layout.hpp); the host path (host_data_path.cpp) and the CUDA path
// (cuda/device_path.cpp + kernels/*.cu) carry them out with the same per-element functions. CI
// runs the CUDA path against the CUDA runtime model (tests/cuda_model): there is one device path.
//
// Ordering contract of the DevicePath:
// * Work a call enqueues for a caller stream runs after the caller's earlier work on that stream
//   and before its later work reads anything the call wrote (the restore output) or overwrites
//   anything the call reads (the store source). Work for stream B never waits for stream A's
//   queued work.
// * store() and restore() return once enqueued. When a call waits on the host instead (staging
//   budget, launch slots, a pool that is not page-locked, the error path) is one table:
//   docs/design.md, "What may run concurrently and what may block the host".
// * A restore's keep_alive (the pinned pool entries it reads) is held until the restore has read
//   the pool; release_finished() drops the finished ones without waiting.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "hss/config.hpp"
#include "hss/kernels/layout.hpp"
#include "hss/tensor.hpp"

namespace hss::detail {

class CopyWorkers;
struct HostCopy;  // datapath/host/host_copy.hpp

/// How a host copy runs: the store's strategy (host_copy.hpp; nullptr = default_host_copy()) and
/// the threads it may split a large call over (copy_workers.hpp; nullptr = the caller alone),
/// each taking at least `min_split_bytes` (tests lower it to split small calls).
struct HostCopyContext {
  const HostCopy* strategy = nullptr;
  CopyWorkers* workers = nullptr;
  uint64_t min_split_bytes = uint64_t{16} << 20;  // kMinBytesPerCopyThread
};

/// Host path: converts and copies synchronously, on the calling thread (and the context's
/// workers for calls of at least 2 x min_split_bytes). Calls writing at least the strategy's
/// threshold use its stores for that size. Every strategy and thread count writes the same bytes.
void host_store(const kernels::SourceView& src, std::span<const kernels::WriteSegment> segments,
                const HostCopyContext& context = {});
/// Writes out.type (float32, float16 or bfloat16): bit copies when the storage type matches,
/// exact widening, nearest-even narrowing.
void host_restore(std::span<const kernels::GatherSegment> segments, const kernels::OutputView& out,
                  const HostCopyContext& context = {});

/// Completion of the device-to-host copies of one store call, shared by the entries it wrote.
/// Three states: pending, landed (the rows are in the pool), failed (they never will be: the
/// entries must be dropped, never served). Once seen, landed and failed are cached flags.
/// Thread-safe.
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  /// Blocks the host until the copies have landed or failed. True when they landed; false when
  /// the device work failed (error() says why). No device call once the outcome is known.
  [[nodiscard]] virtual bool wait() noexcept = 0;
  /// Never blocks. True once the copies have landed or failed (cached once seen).
  [[nodiscard]] virtual bool ready() noexcept = 0;
  /// The cached flags alone: no device call, safe under any lock. DevicePath::poll() refreshes
  /// them.
  [[nodiscard]] virtual bool landed() const noexcept = 0;
  [[nodiscard]] virtual bool failed() const noexcept = 0;
  /// Landed or failed: nothing will write the pool blocks any more.
  [[nodiscard]] bool settled() const noexcept { return landed() || failed(); }
  [[nodiscard]] virtual std::string error() const = 0;
};
using FenceRef = std::shared_ptr<CopyFence>;

/// One item of a batched device store: its source and the pool segments it fills.
struct StoreJob {
  kernels::SourceView src;
  std::span<const kernels::WriteSegment> segments;
};

/// One item of a batched device restore: the pool segments it reads and its output.
struct RestoreJob {
  std::span<const kernels::GatherSegment> segments;
  kernels::OutputView out;
};

/// The device data path of one store. Thread-safe: every method may be called from many threads.
class DevicePath {
 public:
  virtual ~DevicePath() = default;

  /// The CUDA path for `config`, or nullptr when the build has no CUDA or the process found no
  /// device.
  [[nodiscard]] static std::unique_ptr<DevicePath> create(const Config& config);

  /// Throws InvalidArgument naming `what` unless `data` is device memory of device `device_index`
  /// (on_device) or is not device memory (!on_device). Changes nothing.
  virtual void check_pointer(const void* data, bool on_device, int device_index,
                             std::string_view what) = 0;

  /// Throws hss::Error when device work on `stream` would be captured into a CUDA graph (the
  /// stream captures, or it is the legacy default stream while a blocking stream captures).
  /// hsstore's device calls read and write host-side state when they are enqueued (pool
  /// addresses, pins, fences, descriptor tables), which a replay would not repeat. Changes
  /// nothing.
  virtual void check_stream(Stream stream) = 0;

  /// Reads every segment's rows from the device tensor `src` (ordered on `stream`) into the pool
  /// blocks the segments name. Returns once enqueued, with the fence the entries carry; the caller
  /// may reuse `src` in its later work on `stream`. Host waits: the table named at the top of
  /// this file. Throws hss::Error when enqueueing fails.
  [[nodiscard]] virtual FenceRef store(const kernels::SourceView& src, int device_index,
                                       std::span<const kernels::WriteSegment> segments,
                                       Stream stream) = 0;

  /// Makes `stream` wait (on the device) for every fence in `after`, then gathers
  /// the segments from the pool into `out` (device memory of `device_index`, out.type). Returns
  /// once enqueued; `keep_alive` is held until the restore has read the pool.
  virtual void restore(std::span<const kernels::GatherSegment> segments,
                       const kernels::OutputView& out, int device_index, Stream stream,
                       std::span<const FenceRef> after, std::shared_ptr<const void> keep_alive) = 0;

  /// A batch of stores from device tensors of `device_index`, ordered on `stream`: one launch
  /// (per table of kernels' tiles; one for an engine step) writes every job's rows, cast where
  /// needed, straight into the device-mapped pool: no staging, no copy stream, no staging budget.
  /// One fence for the batch. Returns once enqueued. A pool that is not device-mapped takes
  /// store() per job instead. Host waits: the table named at the top of this file.
  [[nodiscard]] virtual FenceRef store_batch(std::span<const StoreJob> jobs, int device_index,
                                             Stream stream) = 0;

  /// A batch of restores into device outputs of `device_index`: `stream` waits (on the device)
  /// for every fence in `after`, then one launch (per table) gathers every job into its output.
  /// `keep_alive` is held until the launches have read the pool. Returns once enqueued.
  virtual void restore_batch(std::span<const RestoreJob> jobs, int device_index, Stream stream,
                             std::span<const FenceRef> after,
                             std::shared_ptr<const void> keep_alive) = 0;

  /// Kernel launches and copy calls enqueued so far, over every stream (what a batch saves).
  [[nodiscard]] virtual uint64_t launches() const = 0;
  /// Restores and batch launches that waited on the host because every launch slot of their
  /// device (hidden_state_launch_slots, Config::tuning.launch_slots) was in flight.
  [[nodiscard]] virtual uint64_t launch_waits() const = 0;

  /// Drops the keep-alives of the restores that have finished; never waits. Returns how many.
  virtual size_t release_finished() = 0;
  /// Refreshes the landed flag of every outstanding fence and releases finished restores; never
  /// waits. The store calls it outside its lock before eviction decisions, so that decisions
  /// under the lock read cached flags only.
  virtual void poll() = 0;
  /// Restores enqueued and not yet released by release_finished() or flush().
  [[nodiscard]] virtual size_t restores_in_flight() const = 0;

  /// Waits for every copy and restore issued so far and releases every keep-alive.
  virtual void flush() = 0;

  /// Stores that waited on the host because the staging budget was exhausted.
  [[nodiscard]] virtual uint64_t staging_waits() const = 0;

  /// True when kernels on `device` may read device memory of `peer` (the same device, or peer
  /// access that cudaDeviceCanAccessPeer allows and that this call enabled once, from a thread
  /// bound to `device`: the device-resident tier's restores onto another device). The answer is
  /// kept per pair. May throw hss::Error when CUDA fails.
  [[nodiscard]] virtual bool peer_access(int device, int peer) = 0;
};

/// The platform's path (cuda/device_path.cpp or nocuda/device_path.cpp).
[[nodiscard]] std::unique_ptr<DevicePath> create_platform_device_path(const Config& config);

}  // namespace hss::detail
