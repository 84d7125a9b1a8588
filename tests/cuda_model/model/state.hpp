#pragma once
// The CUDA runtime model's state (internal to tests/cuda_model/model/). One process-wide Model,
// guarded by one mutex, holds devices, streams, events, captures, counters and planted faults; the
// memory registry has its own shared mutex so kernel twins can check accesses without the model
// lock. cuda_model.hpp is the test-facing view of it.
//
// Execution: every stream is a FIFO of Ops. An Op runs once the ops before it on its stream have
// completed, the points it waits for (other streams' positions: events, the legacy default
// stream's implicit synchronisation) are reached and its gate, if any, is open. In the default
// (eager) mode each stream has an executor thread; in manual mode nothing runs until a test calls
// step() or a host wait needs it (then the waiting thread runs exactly what it waits for).

#include <cuda.h>  // CUresult, CUevent: the one driver function the model offers
#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace hss::cuda_model::detail {

struct StreamState;
using StreamRef = std::shared_ptr<StreamState>;

/// Reached once `stream` has completed `position` operations.
struct Point {
  StreamRef stream;
  uint64_t position = 0;
};

struct GateState {
  bool open = false;
};

enum class OpKind : uint8_t { kCopy, kMemset, kKernel, kHostFunc, kWait, kRecord, kGate };

struct Op {
  OpKind kind = OpKind::kWait;
  std::string what;                   // for diagnostics and history
  std::vector<Point> after;           // cross-stream dependencies
  std::shared_ptr<GateState> gate;    // runnable once open
  std::function<cudaError_t()> body;  // the work (null: nothing to do); an error is sticky
};

struct CaptureState {
  uint64_t id = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;  // the thread that began it
  int device = 0;
  StreamRef origin;
  bool invalidated = false;
  cudaError_t why = cudaSuccess;   // what invalidated it
  std::vector<Op> ops;             // captured in capture order (a valid serialisation)
  std::vector<StreamRef> members;  // the origin and the streams forked into the capture
  /// Ops captured per member, and per forked member how many of them the origin side has
  /// joined back (waited for through an event recorded after them).
  std::map<StreamState*, size_t> captured;
  std::map<StreamState*, size_t> joined;
};

struct StreamState {
  uint64_t id = 0;
  int device = 0;
  unsigned flags = 0;
  bool legacy = false;
  std::deque<Op> pending;
  uint64_t enqueued = 0;
  uint64_t completed = 0;
  bool running = false;  // the front op was taken and runs now
  bool destroyed = false;
  std::shared_ptr<CaptureState> capture;  // set while capturing (origin or forked in)
  std::vector<std::string> history;       // what ran, in order (cuda_model::history)
  /// Synchronises with the legacy default stream (not created with cudaStreamNonBlocking).
  [[nodiscard]] bool blocking() const { return !legacy && (flags & cudaStreamNonBlocking) == 0; }
};

struct EventState {
  uint64_t id = 0;
  int device = 0;
  unsigned flags = 0;
  bool recorded = false;
  Point at;                                   // reached when the recorded work is done
  std::shared_ptr<CaptureState> captured_in;  // last recorded inside this capture
  StreamState* captured_on = nullptr;
  size_t captured_ops = 0;  // ops of captured_on captured before the record
};

struct GraphState {
  std::vector<Op> ops;
};

enum class MemKind : uint8_t { kDevice, kPinned };

struct Allocation {
  uintptr_t base = 0;
  size_t bytes = 0;
  size_t mapping = 0;  // bytes mmapped (page-rounded, at least one page)
  MemKind kind = MemKind::kDevice;
  int device = 0;
  unsigned flags = 0;  // cudaHostAlloc flags
  uint64_t id = 0;
  [[nodiscard]] bool contains(uintptr_t p, size_t n) const {
    return p >= base && n <= bytes && p - base <= bytes - n;
  }
  [[nodiscard]] bool device_mapped() const {
    return kind == MemKind::kDevice || (flags & cudaHostAllocMapped) != 0;
  }
};

struct DeviceState {
  int index = 0;
  bool context = false;
  cudaError_t sticky = cudaSuccess;
  std::string sticky_what;
  StreamRef legacy;
  std::vector<std::weak_ptr<StreamState>> streams;  // created on this device
  size_t device_bytes = 0;                          // live cudaMalloc bytes
  std::set<std::string> loaded;                     // kernels whose module was loaded
};

struct Counters {
  uint64_t kernel_launches = 0;
  uint64_t copies = 0;
  uint64_t host_funcs = 0;
  uint64_t device_allocations = 0;  // cudaMalloc
  uint64_t pinned_allocations = 0;  // cudaHostAlloc / cudaMallocHost
  uint64_t frees = 0;
  uint64_t streams_created = 0;
  uint64_t streams_destroyed = 0;
  uint64_t events_created = 0;
  uint64_t module_loads = 0;
  uint64_t host_waits = 0;
  uint64_t contexts_created = 0;
};

struct Faults {
  int64_t allocation = -1;  // calls until the failing one; -1: none
  int64_t launch = -1;
  cudaError_t launch_error = cudaErrorLaunchOutOfResources;
  int64_t copy = -1;
  cudaError_t copy_error = cudaErrorIllegalAddress;
};

class Model {
 public:
  static Model& get();

  std::mutex mutex;
  std::condition_variable changed;

  // Fixed at first use (HSS_CUDA_MODEL_DEVICES, HSS_CUDA_MODEL_DEVICE_MEMORY_MIB).
  int device_count = 1;
  size_t device_memory = size_t{16} << 30;
  std::vector<DeviceState> devices;

  std::unordered_map<uint64_t, StreamRef> streams;  // live handles
  std::unordered_map<uint64_t, std::shared_ptr<EventState>> events;
  std::unordered_map<uint64_t, std::shared_ptr<GraphState>> graphs;
  std::unordered_map<uint64_t, std::shared_ptr<GraphState>> graph_execs;
  std::vector<std::shared_ptr<CaptureState>> captures;  // active (not ended)
  uint64_t next_id = 0x1000;

  Counters counters;
  Faults faults;
  bool manual = false;
  size_t host_waiters = 0;
  std::string last_fault;

  /// Runs the front op of `s` on this thread (lock held on entry and exit, released meanwhile).
  void run_front(StreamState& s, std::unique_lock<std::mutex>& lock);
  [[nodiscard]] bool runnable(const StreamState& s) const;
  [[nodiscard]] static bool reached(const Point& p) { return p.stream->completed >= p.position; }
  /// Blocks the calling thread until every point is reached (counted as a host wait when one is
  /// not reached yet). In manual mode the thread runs what the points need.
  void wait_until(std::unique_lock<std::mutex>& lock, const std::vector<Point>& points,
                  const char* what);
  /// Appends `op` to `s` (or to its capture), adding the legacy stream's implicit dependencies.
  cudaError_t enqueue(const StreamRef& s, Op op);
  void start_executor(const StreamRef& s);
  /// A point after everything enqueued so far on `s` (the legacy stream: and every blocking one).
  [[nodiscard]] std::vector<Point> tail_of(const StreamRef& s) const;
  void set_sticky(int device, cudaError_t error, const std::string& what);

 private:
  Model();
  bool drive(const Point& p, std::unique_lock<std::mutex>& lock, int depth);
};

/// Per host thread: the runtime's view of the calling thread.
struct ThreadState {
  ThreadState() = default;
  ThreadState(const ThreadState&) = delete;
  ThreadState& operator=(const ThreadState&) = delete;
  /// The thread's per-thread default streams go with it (work queued on them still runs).
  ~ThreadState();

  int device = 0;
  bool device_set = false;
  cudaError_t last = cudaSuccess;  // the last-error slot (cudaGetLastError), one per thread
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  bool in_host_func = false;
  /// cudaStreamPerThread on each device, made at the thread's first use of it there (index:
  /// device; empty: not made yet).
  std::vector<StreamRef> per_thread;
};
ThreadState& this_thread();

// ---- memory (memory.cpp)

/// Read lock on the registry for the lookups of one kernel or copy.
std::shared_mutex& memory_mutex();
/// The live allocation holding [p, p + n), or null (caller holds memory_mutex()).
const Allocation* find_allocation(const void* p, size_t n);
/// The allocation whose range holds p (any size), or null (caller holds memory_mutex()).
const Allocation* allocation_at(const void* p);
/// Lets the calling thread touch device memory for the scope (memory protection keys).
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  int saved_ = -1;
};
/// The opposite, for host functions run on an executor.
class HostOnly {
 public:
  HostOnly();
  ~HostOnly();
  HostOnly(const HostOnly&) = delete;
  HostOnly& operator=(const HostOnly&) = delete;

 private:
  int saved_ = -1;
};
[[nodiscard]] bool host_access_detection();
/// Frees every allocation of `device` (cudaDeviceReset).
void free_device_allocations(int device);

// ---- peer access (devices.cpp)

/// True when kernels of `device` may access device memory of `peer` (cudaDeviceEnablePeerAccess
/// from `device`'s context; dropped by its cudaDeviceReset). Lock-free: kernel twins ask it.
[[nodiscard]] bool peer_access_enabled(int device, int peer);
/// cuda_model::set_peer_access_supported; cudaDeviceReset's part.
void set_peer_supported(bool supported);
void clear_peer_access(int device);

// ---- API plumbing (state.cpp)

/// Called at the top of every runtime entry point: first-use initialisation, and
/// cudaErrorNotPermitted from inside a host function.
cudaError_t enter();
/// Records a non-success result in the thread's last-error slot and returns it.
cudaError_t result(cudaError_t e);
/// The current device's index, its state, and its primary context (created on first need).
DeviceState& current_device(std::unique_lock<std::mutex>& lock);
void init_context(DeviceState& d);
/// cudaErrorStreamCaptureUnsupported (invalidating the captures concerned) when the calling
/// thread may not make a potentially unsafe call now; cudaSuccess otherwise. Lock held.
cudaError_t unsafe_call_check(Model& m);
/// Invalidates `c` with `why`.
void invalidate(CaptureState& c, cudaError_t why);
/// The stream a handle names (nullptr / cudaStreamLegacy: the current device's legacy stream;
/// cudaStreamPerThread: the calling thread's per-thread default stream on the current device,
/// made at its first use), or null for an unknown handle. Lock held.
StreamRef stream_of(Model& m, cudaStream_t handle, std::unique_lock<std::mutex>& lock);
/// cudaErrorStreamCaptureImplicit when `s` is a legacy stream while a blocking stream of its
/// device captures (invalidating those captures). Lock held.
cudaError_t legacy_capture_check(Model& m, const StreamState& s);
[[nodiscard]] uint64_t handle_id(const void* handle);
template <typename Handle>
Handle handle_of(uint64_t id) {
  return reinterpret_cast<Handle>(static_cast<uintptr_t>(id));
}

/// cuEventQuery, as cudaGetDriverEntryPointByVersion hands it out (streams.cpp): cudaEventQuery's
/// answer, without touching the calling thread's last-error slot.
CUresult driver_event_query(CUevent event);

/// A failure of a kernel twin or copy while it runs (becomes the device's sticky error).
struct Fault {
  cudaError_t error;
  std::string what;
};

}  // namespace hss::cuda_model::detail
