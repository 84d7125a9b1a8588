// The model's core: the process-wide state, the per-stream executors, stream-ordered waits and
// the rules every entry point shares (contexts, sticky errors, capture prohibitions).

#include "model/state.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/names.hpp"

namespace hss::cuda_model::detail {
namespace {

using Clock = std::chrono::steady_clock;

/// A host wait that outlives this is a deadlock in a test (a gate nobody opens): fail loudly.
/// HSS_CUDA_MODEL_WATCHDOG_S sets it (ctest: 30 s).
std::chrono::seconds watchdog() {
  static const std::chrono::seconds limit{[] {
    const char* v = std::getenv("HSS_CUDA_MODEL_WATCHDOG_S");
    const long s = v != nullptr ? std::strtol(v, nullptr, 10) : 0;
    return s > 0 ? s : 120L;
  }()};
  return limit;
}
/// History kept per stream (cuda_model::history).
constexpr size_t kHistory = 4096;

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi) {
    std::fprintf(stderr, "cuda model: %s=%s is not an integer in [%d, %d]\n", name, v, lo, hi);
    std::abort();
  }
  return static_cast<int>(n);
}

void executor(Model& m, StreamRef s) {
  std::unique_lock lock(m.mutex);
  for (;;) {
    m.changed.wait(lock, [&] {
      return (s->destroyed && s->pending.empty() && !s->running) || (!m.manual && m.runnable(*s));
    });
    if (s->pending.empty()) return;  // destroyed and drained
    m.run_front(*s, lock);
  }
}

}  // namespace

Model& Model::get() {
  // Never destroyed: executor threads and the library's static destructors may still use it at
  // process exit.
  static Model* model = [] {
    auto* m = new Model;
    for (DeviceState& d : m->devices) m->start_executor(d.legacy);
    return m;
  }();
  return *model;
}

Model::Model() {
  device_count = env_int("HSS_CUDA_MODEL_DEVICES", 1, 0, 8);
  device_memory =
      static_cast<size_t>(env_int("HSS_CUDA_MODEL_DEVICE_MEMORY_MIB", 16384, 1, 1 << 20)) << 20;
  manual = env_int("HSS_CUDA_MODEL_MANUAL", 0, 0, 1) == 1;
  devices.resize(static_cast<size_t>(device_count));
  for (int i = 0; i < device_count; ++i) {
    DeviceState& d = devices[static_cast<size_t>(i)];
    d.index = i;
    d.legacy = std::make_shared<StreamState>();
    d.legacy->id = next_id++;
    d.legacy->device = i;
    d.legacy->legacy = true;
  }
}

void Model::start_executor(const StreamRef& s) {
  std::thread([this, s] { executor(*this, s); }).detach();
}

bool Model::runnable(const StreamState& s) const {
  if (s.running || s.pending.empty()) return false;
  const Op& op = s.pending.front();
  if (op.gate && !op.gate->open) return false;
  for (const Point& p : op.after) {
    if (!reached(p)) return false;
  }
  return true;
}

void Model::run_front(StreamState& s, std::unique_lock<std::mutex>& lock) {
  Op op = std::move(s.pending.front());
  s.pending.pop_front();
  s.running = true;
  const bool skip = devices[static_cast<size_t>(s.device)].sticky != cudaSuccess;
  lock.unlock();
  cudaError_t error = cudaSuccess;
  std::string fault;
  if (!skip && op.body) {
    try {
      error = op.body();
    } catch (const Fault& f) {
      error = f.error;
      fault = f.what;
    }
  }
  lock.lock();
  if (error != cudaSuccess) set_sticky(s.device, error, fault.empty() ? op.what : fault);
  if (s.history.size() == kHistory) s.history.erase(s.history.begin());
  s.history.push_back(skip ? op.what + " (skipped: sticky error)" : op.what);
  s.running = false;
  ++s.completed;
  changed.notify_all();
}

bool Model::drive(const Point& p, std::unique_lock<std::mutex>& lock, int depth) {
  StreamState& s = *p.stream;
  if (reached(p) || s.running || s.pending.empty() || depth > 64) return false;
  const Op& front = s.pending.front();
  if (front.gate && !front.gate->open) return false;
  for (const Point& dep : front.after) {
    if (!reached(dep)) return drive(dep, lock, depth + 1);
  }
  run_front(s, lock);
  return true;
}

void Model::wait_until(std::unique_lock<std::mutex>& lock, const std::vector<Point>& points,
                       const char* what) {
  const auto all_reached = [&] {
    for (const Point& p : points) {
      if (!reached(p)) return false;
    }
    return true;
  };
  if (all_reached()) return;
  ++counters.host_waits;
  ++host_waiters;
  changed.notify_all();
  const auto start = Clock::now();
  while (!all_reached()) {
    if (manual) {
      bool ran = false;
      for (const Point& p : points) {
        if (!reached(p) && drive(p, lock, 0)) {
          ran = true;
          break;
        }
      }
      if (ran) continue;
    }
    changed.wait_for(lock, std::chrono::milliseconds(50));
    if (Clock::now() - start > watchdog()) {
      std::fprintf(stderr,
                   "cuda model: %s has waited on the host for %lld s: a deadlock (a gate "
                   "nobody opens?). Waiting for:\n",
                   what, static_cast<long long>(watchdog().count()));
      for (const Point& p : points) {
        if (reached(p)) continue;
        const StreamState& s = *p.stream;
        std::fprintf(stderr, "  stream %llu (device %d%s): %llu of %llu ops done, front: %s%s\n",
                     static_cast<unsigned long long>(s.id), s.device, s.legacy ? ", legacy" : "",
                     static_cast<unsigned long long>(s.completed),
                     static_cast<unsigned long long>(p.position),
                     s.pending.empty() ? "(running)" : s.pending.front().what.c_str(),
                     !s.pending.empty() && s.pending.front().gate && !s.pending.front().gate->open
                         ? " [gate closed]"
                         : "");
      }
      std::abort();
    }
  }
  --host_waiters;
  changed.notify_all();
}

cudaError_t Model::enqueue(const StreamRef& s, Op op) {
  if (s->capture) {
    CaptureState& c = *s->capture;
    if (c.invalidated) return cudaErrorStreamCaptureInvalidated;
    ++c.captured[s.get()];
    c.ops.push_back(std::move(op));
    return cudaSuccess;
  }
  if (s->legacy) {
    if (const cudaError_t e = legacy_capture_check(*this, *s); e != cudaSuccess) return e;
    for (const auto& weak : devices[static_cast<size_t>(s->device)].streams) {
      const StreamRef b = weak.lock();
      if (b && b->blocking() && b->enqueued > b->completed) op.after.push_back({b, b->enqueued});
    }
  } else if (s->blocking()) {
    const StreamRef& l = devices[static_cast<size_t>(s->device)].legacy;
    if (l->enqueued > l->completed) op.after.push_back({l, l->enqueued});
  }
  s->pending.push_back(std::move(op));
  ++s->enqueued;
  changed.notify_all();
  return cudaSuccess;
}

std::vector<Point> Model::tail_of(const StreamRef& s) const {
  std::vector<Point> points{{s, s->enqueued}};
  if (s->legacy) {
    for (const auto& weak : devices[static_cast<size_t>(s->device)].streams) {
      if (const StreamRef b = weak.lock(); b && b->blocking()) points.push_back({b, b->enqueued});
    }
  }
  return points;
}

void Model::set_sticky(int device, cudaError_t error, const std::string& what) {
  DeviceState& d = devices[static_cast<size_t>(device)];
  if (d.sticky != cudaSuccess) return;
  d.sticky = error;
  d.sticky_what = what;
  last_fault = what;
  std::fprintf(stderr, "cuda model: device %d: %s (sticky, the context is lost): %s\n", device,
               error_name(error), what.c_str());
}

ThreadState& this_thread() {
  thread_local ThreadState state;
  return state;
}

ThreadState::~ThreadState() {
  if (per_thread.empty()) return;
  // The thread has exited: its per-thread streams are gone, as a destroyed stream is (the work
  // queued on them still runs; the executor drains it, then ends).
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  for (const StreamRef& s : per_thread) {
    if (s) s->destroyed = true;
  }
  m.changed.notify_all();
}

cudaError_t enter() {
  if (this_thread().in_host_func) return cudaErrorNotPermitted;
  if (Model::get().device_count == 0) return cudaErrorNoDevice;
  return cudaSuccess;
}

cudaError_t result(cudaError_t e) {
  if (e != cudaSuccess) this_thread().last = e;
  return e;
}

DeviceState& current_device(std::unique_lock<std::mutex>&) {
  Model& m = Model::get();
  return m.devices[static_cast<size_t>(this_thread().device)];
}

void init_context(DeviceState& d) {
  if (d.context) return;
  d.context = true;
  ++Model::get().counters.contexts_created;
}

void invalidate(CaptureState& c, cudaError_t why) {
  if (c.invalidated) return;
  c.invalidated = true;
  c.why = why;
}

cudaError_t unsafe_call_check(Model& m) {
  const ThreadState& t = this_thread();
  if (t.mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  const auto me = std::this_thread::get_id();
  bool prohibited = false;
  for (const auto& c : m.captures) {  // invalidated or not: the sequence runs until it ends
    const bool own = c->thread == me && c->mode != cudaStreamCaptureModeRelaxed;
    const bool other_global = t.mode == cudaStreamCaptureModeGlobal && c->thread != me &&
                              c->mode == cudaStreamCaptureModeGlobal;
    if (own || other_global) {
      invalidate(*c, cudaErrorStreamCaptureUnsupported);
      prohibited = true;
    }
  }
  return prohibited ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

cudaError_t legacy_capture_check(Model& m, const StreamState& s) {
  if (!s.legacy) return cudaSuccess;
  bool implicit = false;
  for (const auto& c : m.captures) {
    if (c->invalidated || c->device != s.device || !c->origin->blocking()) continue;
    invalidate(*c, cudaErrorStreamCaptureImplicit);
    implicit = true;
  }
  return implicit ? cudaErrorStreamCaptureImplicit : cudaSuccess;
}

namespace {

/// The calling thread's per-thread default stream on `d` (lock held). CUDA: "local to both the
/// thread and the calling context, and does not synchronize with other streams (just like
/// explicitly created streams)"; it "is not a non-blocking stream and will synchronize with the
/// legacy default stream if both are used" (Driver API, Stream synchronization behavior). So: a
/// blocking stream of its own per (host thread, device), made at first use, addressable only as
/// cudaStreamPerThread from that thread, and gone when the thread exits (~ThreadState). Not
/// counted in streams_created: no cudaStreamCreate made it.
StreamRef per_thread_stream(Model& m, DeviceState& d) {
  ThreadState& t = this_thread();
  if (t.per_thread.size() <= static_cast<size_t>(d.index)) {
    t.per_thread.resize(static_cast<size_t>(d.index) + 1);
  }
  StreamRef& s = t.per_thread[static_cast<size_t>(d.index)];
  if (!s) {
    s = std::make_shared<StreamState>();
    s->id = m.next_id++;
    s->device = d.index;
    s->flags = cudaStreamDefault;
    std::erase_if(d.streams, [](const std::weak_ptr<StreamState>& w) { return w.expired(); });
    d.streams.push_back(s);
    m.start_executor(s);
  }
  return s;
}

}  // namespace

StreamRef stream_of(Model& m, cudaStream_t handle, std::unique_lock<std::mutex>& lock) {
  if (handle == nullptr || handle == cudaStreamLegacy) {
    DeviceState& d = current_device(lock);
    init_context(d);
    return d.legacy;
  }
  if (handle == cudaStreamPerThread) {
    DeviceState& d = current_device(lock);
    init_context(d);
    return per_thread_stream(m, d);
  }
  const auto it = m.streams.find(handle_id(handle));
  return it == m.streams.end() ? nullptr : it->second;
}

uint64_t handle_id(const void* handle) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle));
}

}  // namespace hss::cuda_model::detail
