#pragma once
// A simulated asynchronous device path for CI without a GPU: the DevicePath contract
// (data_path.hpp) carried out on host memory, with the ordering of the CUDA path made observable.
//
// Model: every caller stream (a handle from create_stream(), or nullptr for the default stream) is
// a FIFO of operations, and so is the private copy stream the path keeps per caller stream (as
// the CUDA path does). A batch (store_batch, restore_batch) is one operation per launch table on
// the caller's stream, running the host twins of the batch kernels (batch_tiles.hpp) over the
// tiles the CUDA path would launch. An operation runs once everything before it on its queue has
// run, the events it waits for have fired, its queue is not held, and (with a delay configured) its
// time has come. A store that needs no cast is one operation on the caller's stream (the direct
// copy); one that casts is a gather into staging on the caller's stream, then the copy into the
// pool on the copy stream. A restore waits for the fences it was given, then gathers, on the
// caller's stream. The staging budget is accounted like the CUDA path's: a store waits on the host
// (and counts staging_waits) only when its staging would push the bytes in flight past the budget;
// restores and batch launches likewise hold one launch slot each until they ran, and wait (and
// count launch_waits) only when every slot is in flight.
//
// Tests drive it: hold(stream) keeps a stream's queued work from running (a GPU stream stuck
// behind a long kernel), release(stream) lets it run, launch(stream, fn) enqueues the caller's
// own later work (like cudaLaunchHostFunc), allocate() hands out "device memory" that
// check_pointer() knows. With delay == 0 runnable work runs at once on the enqueuing thread; with
// a delay a worker thread runs each operation `delay` after it was enqueued.
//
// Thread-safe. One internal mutex orders everything; copies run under it (it is a simulation).
// A host wait that could never end (a held stream nobody releases) gives up after
// kHostWaitLimit and reports a failed copy instead of hanging CI; host_waits() counts every
// wait that had to block.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "data_path.hpp"

namespace hss::detail {

class SimDataPath final : public DevicePath {
 public:
  struct Options {
    uint64_t staging_bytes = uint64_t{1} << 30;  ///< Config::hidden_state_staging_bytes
    std::chrono::microseconds delay{0};  ///< 0: run at once; else a worker runs each op late
    int devices = 1;
    size_t launch_slots = 64;  ///< Config::hidden_state_launch_slots
  };
  static constexpr std::chrono::seconds kHostWaitLimit{60};

  explicit SimDataPath(Options options);
  /// Lets every held stream run and waits until all queued work has run.
  ~SimDataPath() override;
  SimDataPath(const SimDataPath&) = delete;
  SimDataPath& operator=(const SimDataPath&) = delete;

  // DevicePath
  void check_pointer(const void* data, bool on_device, int device_index,
                     std::string_view what) override;
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

  // Test controls
  [[nodiscard]] Stream create_stream();
  void hold(Stream stream);
  void release(Stream stream);
  /// Enqueues the caller's own work on `stream` (runs in stream order, like cudaLaunchHostFunc).
  void launch(Stream stream, std::function<void()> work);
  /// Operations queued on the stream (and on its copy stream) that have not run.
  [[nodiscard]] size_t queued(Stream stream) const;
  /// Simulated device memory of `device` (zeroed; lives as long as the path).
  [[nodiscard]] void* allocate(size_t bytes, int device = 0);
  /// Blocks until `count` host threads are waiting inside the path (staging or a fence).
  void wait_for_host_waiters(size_t count) const;
  [[nodiscard]] uint64_t host_waits() const;
  /// Makes store call number `index` from now (0: the next store() or store_batch()) throw
  /// hss::Error before it enqueues anything, as a failed launch would.
  void fail_store_call(size_t index);
  [[nodiscard]] uint64_t staging_in_flight() const;

  class Core;

 private:
  void check_device(int device_index) const;
  std::shared_ptr<Core> core_;
  std::thread worker_;  // only with a delay
};

}  // namespace hss::detail
