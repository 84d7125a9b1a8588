#include "sim_data_path.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "batch_tiles.hpp"
#include "hss/error.hpp"

namespace hss::detail {
namespace {

using Clock = std::chrono::steady_clock;

/// Fires once; guarded by the core's mutex.
struct SimEvent {
  bool fired = false;
};

struct Op {
  std::function<void()> work;          // may be empty (a pure wait or signal)
  std::shared_ptr<SimEvent> wait_for;  // runnable once fired
  std::shared_ptr<SimEvent> signal;    // fired after work
  std::function<void()> after_signal;  // bookkeeping under the lock (staging budget)
  Clock::time_point not_before;
};

struct Queue {
  std::deque<Op> ops;
  bool held = false;
};

// Copy streams live beside their caller stream: id + kCopyStreamBit.
constexpr uint64_t kCopyStreamBit = uint64_t{1} << 62;

uint64_t id_of(Stream stream) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(stream)); }

}  // namespace

class SimDataPath::Core {
 public:
  explicit Core(Options o) : options(o) {}

  // Everything below is guarded by mutex.
  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  const Options options;
  std::map<uint64_t, Queue> queues;
  uint64_t next_stream = 1;
  uint64_t staging_in_flight = 0;
  uint64_t staging_waits = 0;
  uint64_t host_waits = 0;
  uint64_t launches = 0;          // counted as the CUDA path enqueues them (DevicePath::launches)
  size_t launches_in_flight = 0;  // launch slots held by queued restores and batch launches
  uint64_t launch_waits = 0;
  std::optional<size_t> store_calls_until_failure;  // fail_store_call()
  size_t host_waiters = 0;
  bool stopping = false;
  struct PendingRestore {
    std::shared_ptr<SimEvent> done;
    std::shared_ptr<const void> keep_alive;
  };
  std::vector<PendingRestore> restores;
  struct Allocation {
    std::unique_ptr<std::byte[]> bytes;
    size_t size;
    int device;
  };
  std::map<uintptr_t, Allocation> allocations;
  std::vector<std::weak_ptr<CopyFence>> fences;  // outstanding, for poll()

  void enqueue(uint64_t queue, Op op) {
    op.not_before = Clock::now() + options.delay;
    queues[queue].ops.push_back(std::move(op));
  }

  /// Runs every runnable operation (lock held); wakes waiters when anything ran.
  void pump() {
    const auto now = Clock::now();
    bool any = false;
    for (bool progress = true; progress;) {
      progress = false;
      for (auto& [id, q] : queues) {
        while (!q.held && !q.ops.empty()) {
          Op& op = q.ops.front();
          if (op.wait_for && !op.wait_for->fired) break;
          if (op.not_before > now) break;
          if (op.work) op.work();
          if (op.signal) op.signal->fired = true;
          if (op.after_signal) op.after_signal();
          q.ops.pop_front();
          progress = any = true;
        }
      }
    }
    if (any) changed.notify_all();
  }

  [[nodiscard]] bool idle() const {
    return std::all_of(queues.begin(), queues.end(),
                       [](const auto& entry) { return entry.second.ops.empty(); });
  }

  /// The earliest time a queued front operation becomes due (worker sleep bound).
  [[nodiscard]] std::optional<Clock::time_point> next_due() const {
    std::optional<Clock::time_point> due;
    for (const auto& [id, q] : queues) {
      if (q.held || q.ops.empty()) continue;
      const auto t = q.ops.front().not_before;
      if (!due || t < *due) due = t;
    }
    return due;
  }

  /// Throws when the failure fail_store_call() planted is due.
  void maybe_fail_store() {
    if (!store_calls_until_failure) return;
    if ((*store_calls_until_failure)-- > 0) return;
    store_calls_until_failure.reset();
    throw Error("simulated launch failure (fail_store_call)");
  }

  /// Takes `n` launch slots for operations about to be enqueued (each gives its slot back once it
  /// ran: release_launch_slot). Waits on the host, counted, while every slot is in flight.
  void take_launch_slots(std::unique_lock<std::mutex>& lock, size_t n) {
    const auto fits = [&] {
      return launches_in_flight == 0 || launches_in_flight + n <= options.launch_slots;
    };
    if (!fits()) {
      ++launch_waits;
      ++host_waits;
      ++host_waiters;
      changed.notify_all();
      const bool ok = changed.wait_for(lock, kHostWaitLimit, fits);
      --host_waiters;
      if (!ok) throw Error("simulated launch: launch slots never drained (a held stream)");
    }
    launches_in_flight += n;
  }
  std::function<void()> release_launch_slot() {
    return [this] { --launches_in_flight; };
  }

  /// Host wait for an event (lock held through `lock`). False when it could never fire.
  bool wait_fired(std::unique_lock<std::mutex>& lock, const SimEvent& event) {
    if (event.fired) return true;
    ++host_waits;
    ++host_waiters;
    changed.notify_all();
    const bool fired = changed.wait_for(lock, kHostWaitLimit, [&] { return event.fired; });
    --host_waiters;
    return fired;
  }
};

namespace {

class SimFence final : public CopyFence {
 public:
  SimFence(std::shared_ptr<SimDataPath::Core> core, std::shared_ptr<SimEvent> event)
      : core_(std::move(core)), event_(std::move(event)) {}

  bool wait() noexcept override {
    if (landed_.load(std::memory_order_acquire)) return true;
    std::unique_lock lock(core_->mutex);
    if (!core_->wait_fired(lock, *event_)) {
      error_ = "simulated stream held while the host waits for it (a real device never finishes)";
      return false;
    }
    landed_.store(true, std::memory_order_release);
    return true;
  }
  bool ready() noexcept override {
    if (landed_.load(std::memory_order_acquire)) return true;
    std::lock_guard lock(core_->mutex);
    if (event_->fired) landed_.store(true, std::memory_order_release);
    return event_->fired;
  }
  std::string error() const override {
    std::lock_guard lock(core_->mutex);
    return error_;
  }
  bool landed() const noexcept override { return landed_.load(std::memory_order_acquire); }
  [[nodiscard]] const std::shared_ptr<SimEvent>& event() const { return event_; }

 private:
  std::shared_ptr<SimDataPath::Core> core_;
  std::shared_ptr<SimEvent> event_;
  std::atomic<bool> landed_{false};  // cached: a fence that landed costs nothing afterwards
  std::string error_;                // guarded by core_->mutex
};

/// Restores take fences of this path only (before anything is enqueued).
void check_sim_fences(std::span<const FenceRef> after) {
  for (const FenceRef& fence : after) {
    if (dynamic_cast<const SimFence*>(fence.get()) == nullptr) {
      throw Error("simulated restore: a fence from another data path");
    }
  }
}

/// The caller's queue waits (a device-side barrier) for every fence not seen landed. Lock held.
void enqueue_fence_waits(SimDataPath::Core& core, uint64_t caller,
                         std::span<const FenceRef> after) {
  for (const FenceRef& fence : after) {
    const auto* sim = static_cast<const SimFence*>(fence.get());
    if (!sim->landed()) core.enqueue(caller, Op{nullptr, sim->event(), nullptr, nullptr, {}});
  }
}

}  // namespace

SimDataPath::SimDataPath(Options options) : core_(std::make_shared<Core>(options)) {
  if (options.delay.count() > 0) {
    // Ends when the destructor sets `stopping` and everything queued has run.
    worker_ = std::thread([core = core_] {
      std::unique_lock lock(core->mutex);
      while (!core->stopping || !core->idle()) {
        core->pump();
        if (core->stopping && core->idle()) break;
        if (const auto due = core->next_due()) {
          core->changed.wait_until(lock, *due);
        } else {
          core->changed.wait(lock);
        }
      }
      core->changed.notify_all();
    });
  }
}

SimDataPath::~SimDataPath() {
  std::vector<Core::PendingRestore> restores;
  {
    std::unique_lock lock(core_->mutex);
    for (auto& [id, q] : core_->queues) q.held = false;
    core_->stopping = true;
    core_->pump();
    core_->changed.notify_all();
    // With a delay the worker drains the rest; every operation can run now (nothing is held).
    core_->changed.wait(lock, [&] {
      core_->pump();
      return core_->idle();
    });
    restores = std::move(core_->restores);
  }
  if (worker_.joinable()) worker_.join();
  // keep-alives (pool entries) are released here, outside the lock.
}

void SimDataPath::check_device(int device_index) const {
  if (device_index < 0 || device_index >= core_->options.devices) {
    throw InvalidArgument("device_index = " + std::to_string(device_index) +
                          " but the process sees " + std::to_string(core_->options.devices) +
                          " CUDA device(s)");
  }
}

void SimDataPath::check_pointer(const void* data, bool on_device, int device_index,
                                std::string_view what) {
  if (on_device) check_device(device_index);
  const auto address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard lock(core_->mutex);
  const Core::Allocation* owner = nullptr;
  if (auto it = core_->allocations.upper_bound(address); it != core_->allocations.begin()) {
    --it;
    if (address < it->first + it->second.size) owner = &it->second;
  }
  if (on_device && (owner == nullptr || owner->device != device_index)) {
    throw InvalidArgument(std::string(what) + ".data is not memory of CUDA device " +
                          std::to_string(device_index) +
                          (owner ? " (it is on device " + std::to_string(owner->device) + ")"
                                 : std::string(" (it is host memory)")));
  }
  if (!on_device && owner != nullptr) {
    throw InvalidArgument(std::string(what) + ".data is memory of CUDA device " +
                          std::to_string(owner->device) + " but " + std::string(what) +
                          ".device = host");
  }
}

FenceRef SimDataPath::store(const kernels::SourceView& src, int device_index,
                            std::span<const kernels::WriteSegment> segments, Stream stream) {
  check_device(device_index);
  const bool cast = std::any_of(segments.begin(), segments.end(),
                                [&](const auto& seg) { return seg.dst_type != src.type; });
  uint64_t staging = 0;
  if (cast) {
    for (const auto& seg : segments) staging += seg.count * kernels::elem_bytes(seg.dst_type);
  }
  // One call larger than the budget runs in rounds on the CUDA path; here it takes it all.
  const uint64_t charge = std::min(staging, core_->options.staging_bytes);
  auto planned =
      std::make_shared<std::vector<kernels::WriteSegment>>(segments.begin(), segments.end());
  auto fence_event = std::make_shared<SimEvent>();
  const uint64_t caller = id_of(stream);

  std::unique_lock lock(core_->mutex);
  core_->maybe_fail_store();
  if (charge > 0 && core_->staging_in_flight > 0 &&
      core_->staging_in_flight + charge > core_->options.staging_bytes) {
    ++core_->staging_waits;
    ++core_->host_waiters;
    core_->changed.notify_all();
    const bool fits = core_->changed.wait_for(lock, kHostWaitLimit, [&] {
      return core_->staging_in_flight == 0 ||
             core_->staging_in_flight + charge <= core_->options.staging_bytes;
    });
    --core_->host_waiters;
    if (!fits) throw Error("simulated device store: staging never drained (a held stream)");
  }
  // The CUDA path: a copy per segment, or a gather launch and a copy per segment (at most).
  core_->launches += segments.size() + (cast ? 1 : 0);
  if (!cast) {  // direct copy, ordered on the caller's stream
    core_->enqueue(
        caller,
        Op{[src, planned] { host_store(src, *planned); }, nullptr, fence_event, nullptr, {}});
  } else {  // gather + cast into staging on the caller's stream, copy on its copy stream
    auto staging_buffer = std::make_shared<std::vector<std::byte>>(staging);
    auto gathered = std::make_shared<SimEvent>();
    core_->enqueue(caller, Op{[src, planned, staging_buffer] {
                                std::vector<kernels::WriteSegment> to_staging = *planned;
                                std::byte* cursor = staging_buffer->data();
                                for (auto& seg : to_staging) {
                                  seg.dst = cursor;
                                  cursor += seg.count * kernels::elem_bytes(seg.dst_type);
                                }
                                host_store(src, to_staging);
                              },
                              nullptr,
                              gathered,
                              nullptr,
                              {}});
    Core* core = core_.get();
    core_->enqueue(caller | kCopyStreamBit,
                   Op{[planned, staging_buffer] {
                        const std::byte* cursor = staging_buffer->data();
                        for (const auto& seg : *planned) {
                          const size_t bytes = seg.count * kernels::elem_bytes(seg.dst_type);
                          std::memcpy(seg.dst, cursor, bytes);
                          cursor += bytes;
                        }
                      },
                      gathered,
                      fence_event,
                      [core, charge] { core->staging_in_flight -= charge; },
                      {}});
    core_->staging_in_flight += charge;
  }
  core_->pump();
  auto fence = std::make_shared<SimFence>(core_, fence_event);
  std::erase_if(core_->fences, [](const std::weak_ptr<CopyFence>& f) { return f.expired(); });
  core_->fences.push_back(fence);
  return fence;
}

void SimDataPath::poll() {
  std::vector<std::shared_ptr<CopyFence>> fences;
  {
    std::lock_guard lock(core_->mutex);
    for (const auto& weak : core_->fences) {
      if (auto fence = weak.lock()) fences.push_back(std::move(fence));
    }
  }
  for (const auto& fence : fences) (void)fence->ready();  // takes the core's lock itself
  (void)release_finished();
}

void SimDataPath::restore(std::span<const kernels::GatherSegment> segments,
                          const kernels::OutputView& out, int device_index, Stream stream,
                          std::span<const FenceRef> after, std::shared_ptr<const void> keep_alive) {
  check_device(device_index);
  auto planned =
      std::make_shared<std::vector<kernels::GatherSegment>>(segments.begin(), segments.end());
  const uint64_t caller = id_of(stream);
  auto done = std::make_shared<SimEvent>();
  std::unique_lock lock(core_->mutex);
  check_sim_fences(after);
  core_->take_launch_slots(lock, 1);
  enqueue_fence_waits(*core_, caller, after);
  core_->enqueue(caller, Op{[planned, out] { host_restore(*planned, out); },
                            nullptr,
                            done,
                            core_->release_launch_slot(),
                            {}});
  ++core_->launches;
  core_->restores.push_back({done, std::move(keep_alive)});
  core_->pump();
}

namespace {

/// The launch tables the CUDA path would fill for `jobs`, built now (the jobs' spans may not
/// outlive the call); one launch each.
template <typename Tile, typename Job, typename Fill>
std::vector<std::shared_ptr<const std::vector<Tile>>> tables_for(std::span<const Job> jobs,
                                                                 Fill&& fill) {
  std::vector<std::shared_ptr<const std::vector<Tile>>> tables;
  TileCursor cursor;
  for (;;) {
    auto table = std::make_shared<std::vector<Tile>>(kBatchTilesPerTable);
    const size_t n = fill(jobs, cursor, std::span<Tile>(*table));
    if (n == 0) break;
    table->resize(n);
    tables.push_back(std::move(table));
  }
  return tables;
}

}  // namespace

FenceRef SimDataPath::store_batch(std::span<const StoreJob> jobs, int device_index, Stream stream) {
  check_device(device_index);
  const auto tables = tables_for<kernels::BatchStoreTile>(jobs, fill_store_tiles);
  if (tables.empty()) return nullptr;
  auto fence_event = std::make_shared<SimEvent>();
  std::unique_lock lock(core_->mutex);
  core_->maybe_fail_store();
  core_->take_launch_slots(lock, tables.size());
  // Launches on the caller's stream writing the pool directly: no staging, no copy stream.
  for (size_t t = 0; t < tables.size(); ++t) {
    Op op{[table = tables[t]] { run_store_tiles_on_host(*table); },
          nullptr,
          nullptr,
          core_->release_launch_slot(),
          {}};
    if (t + 1 == tables.size()) op.signal = fence_event;
    core_->enqueue(id_of(stream), std::move(op));
  }
  core_->launches += tables.size();
  core_->pump();
  auto fence = std::make_shared<SimFence>(core_, fence_event);
  std::erase_if(core_->fences, [](const std::weak_ptr<CopyFence>& f) { return f.expired(); });
  core_->fences.push_back(fence);
  return fence;
}

void SimDataPath::restore_batch(std::span<const RestoreJob> jobs, int device_index, Stream stream,
                                std::span<const FenceRef> after,
                                std::shared_ptr<const void> keep_alive) {
  check_device(device_index);
  const auto tables = tables_for<kernels::BatchRestoreTile>(jobs, fill_restore_tiles);
  if (tables.empty()) return;
  const uint64_t caller = id_of(stream);
  auto done = std::make_shared<SimEvent>();
  std::unique_lock lock(core_->mutex);
  check_sim_fences(after);
  core_->take_launch_slots(lock, tables.size());
  enqueue_fence_waits(*core_, caller, after);
  for (size_t t = 0; t < tables.size(); ++t) {
    Op op{[table = tables[t]] { run_restore_tiles_on_host(*table); },
          nullptr,
          nullptr,
          core_->release_launch_slot(),
          {}};
    if (t + 1 == tables.size()) op.signal = done;
    core_->enqueue(caller, std::move(op));
  }
  core_->launches += tables.size();
  core_->restores.push_back({done, std::move(keep_alive)});
  core_->pump();
}

void SimDataPath::fail_store_call(size_t index) {
  std::lock_guard lock(core_->mutex);
  core_->store_calls_until_failure = index;
}

uint64_t SimDataPath::launch_waits() const {
  std::lock_guard lock(core_->mutex);
  return core_->launch_waits;
}

uint64_t SimDataPath::launches() const {
  std::lock_guard lock(core_->mutex);
  return core_->launches;
}

size_t SimDataPath::release_finished() {
  std::vector<Core::PendingRestore> finished;  // destroyed outside the lock
  {
    std::lock_guard lock(core_->mutex);
    auto split = std::stable_partition(core_->restores.begin(), core_->restores.end(),
                                       [](const auto& r) { return !r.done->fired; });
    finished.assign(std::make_move_iterator(split), std::make_move_iterator(core_->restores.end()));
    core_->restores.erase(split, core_->restores.end());
  }
  return finished.size();
}

size_t SimDataPath::restores_in_flight() const {
  std::lock_guard lock(core_->mutex);
  return core_->restores.size();
}

void SimDataPath::flush() {
  {
    std::unique_lock lock(core_->mutex);
    core_->pump();
    if (!core_->idle()) {
      ++core_->host_waits;
      ++core_->host_waiters;
      core_->changed.notify_all();
      const bool drained = core_->changed.wait_for(lock, kHostWaitLimit, [&] {
        core_->pump();
        return core_->idle();
      });
      --core_->host_waiters;
      if (!drained) throw Error("simulated flush: a held stream never drained");
    }
  }
  (void)release_finished();
}

uint64_t SimDataPath::staging_waits() const {
  std::lock_guard lock(core_->mutex);
  return core_->staging_waits;
}

Stream SimDataPath::create_stream() {
  std::lock_guard lock(core_->mutex);
  const uint64_t id = core_->next_stream++;
  core_->queues[id];
  return reinterpret_cast<Stream>(static_cast<uintptr_t>(id));
}

void SimDataPath::hold(Stream stream) {
  std::lock_guard lock(core_->mutex);
  core_->queues[id_of(stream)].held = true;
}

void SimDataPath::release(Stream stream) {
  std::lock_guard lock(core_->mutex);
  core_->queues[id_of(stream)].held = false;
  core_->pump();
  core_->changed.notify_all();
}

void SimDataPath::launch(Stream stream, std::function<void()> work) {
  std::lock_guard lock(core_->mutex);
  core_->enqueue(id_of(stream), Op{std::move(work), nullptr, nullptr, nullptr, {}});
  core_->pump();
  core_->changed.notify_all();
}

size_t SimDataPath::queued(Stream stream) const {
  std::lock_guard lock(core_->mutex);
  size_t n = 0;
  for (uint64_t id : {id_of(stream), id_of(stream) | kCopyStreamBit}) {
    if (auto it = core_->queues.find(id); it != core_->queues.end()) n += it->second.ops.size();
  }
  return n;
}

void* SimDataPath::allocate(size_t bytes, int device) {
  check_device(device);
  auto memory = std::make_unique<std::byte[]>(std::max<size_t>(bytes, 1));
  void* data = memory.get();
  std::lock_guard lock(core_->mutex);
  core_->allocations.emplace(reinterpret_cast<uintptr_t>(data),
                             Core::Allocation{std::move(memory), bytes, device});
  return data;
}

void SimDataPath::wait_for_host_waiters(size_t count) const {
  std::unique_lock lock(core_->mutex);
  core_->changed.wait(lock, [&] { return core_->host_waiters >= count; });
}

uint64_t SimDataPath::host_waits() const {
  std::lock_guard lock(core_->mutex);
  return core_->host_waits;
}

uint64_t SimDataPath::staging_in_flight() const {
  std::lock_guard lock(core_->mutex);
  return core_->staging_in_flight;
}

}  // namespace hss::detail
