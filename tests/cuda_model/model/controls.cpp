// cuda_model.hpp: the tests' controls over the model.

#include "cuda_model.hpp"

#include <algorithm>

#include "model/state.hpp"

namespace hss::cuda_model {

using detail::DeviceState;
using detail::GateState;
using detail::Model;
using detail::Op;
using detail::OpKind;
using detail::stream_of;
using detail::StreamRef;

Counters counters() {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  const detail::Counters& c = m.counters;
  Counters out;
  out.kernel_launches = c.kernel_launches;
  out.copies = c.copies;
  out.host_funcs = c.host_funcs;
  out.device_allocations = c.device_allocations;
  out.pinned_allocations = c.pinned_allocations;
  out.frees = c.frees;
  out.streams_created = c.streams_created;
  out.streams_destroyed = c.streams_destroyed;
  out.events_created = c.events_created;
  out.module_loads = c.module_loads;
  out.host_waits = c.host_waits;
  out.contexts_created = c.contexts_created;
  return out;
}

size_t queued(cudaStream_t stream) {
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const StreamRef s = stream_of(m, stream, lock);
  if (!s) return 0;
  return s->pending.size() + (s->running ? 1 : 0);
}

size_t queued_on_device(int device) {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  const DeviceState& d = m.devices.at(static_cast<size_t>(device));
  size_t n = d.legacy->pending.size() + (d.legacy->running ? 1 : 0);
  for (const auto& weak : d.streams) {
    if (const StreamRef s = weak.lock()) n += s->pending.size() + (s->running ? 1 : 0);
  }
  return n;
}

std::vector<std::string> history(cudaStream_t stream) {
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const StreamRef s = stream_of(m, stream, lock);
  return s ? s->history : std::vector<std::string>{};
}

size_t host_waiters() {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  return m.host_waiters;
}

void wait_for_host_waiters(size_t n) {
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  m.changed.wait(lock, [&] { return m.host_waiters >= n; });
}

Gate::Gate(cudaStream_t stream) {
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const StreamRef s = stream_of(m, stream, lock);
  auto gate = std::make_shared<GateState>();
  if (s) {
    Op op;
    op.kind = OpKind::kGate;
    op.what = "gate";
    op.gate = gate;
    (void)m.enqueue(s, std::move(op));
  }
  state_ = gate;
}

Gate::~Gate() { open(); }

void Gate::open() {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  static_cast<GateState*>(state_.get())->open = true;
  m.changed.notify_all();
}

void set_manual(bool manual) {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  m.manual = manual;
  m.changed.notify_all();
}

namespace {

/// Every stream, lowest id first (lock held).
std::vector<StreamRef> all_streams(Model& m) {
  std::vector<StreamRef> all;
  for (const DeviceState& d : m.devices) {
    all.push_back(d.legacy);
    for (const auto& weak : d.streams) {
      if (StreamRef s = weak.lock()) all.push_back(std::move(s));
    }
  }
  std::sort(all.begin(), all.end(),
            [](const StreamRef& a, const StreamRef& b) { return a->id < b->id; });
  return all;
}

}  // namespace

bool step() {
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  for (const StreamRef& s : all_streams(m)) {
    if (m.runnable(*s)) {
      m.run_front(*s, lock);
      return true;
    }
  }
  return false;
}

size_t run_until_blocked() {
  size_t n = 0;
  while (step()) ++n;
  return n;
}

void fail_allocation(uint64_t nth) {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  m.faults.allocation = static_cast<int64_t>(nth);
}

void fail_launch(uint64_t nth, cudaError_t error) {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  m.faults.launch = static_cast<int64_t>(nth);
  m.faults.launch_error = error;
}

void fail_copy(uint64_t nth, cudaError_t error) {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  m.faults.copy = static_cast<int64_t>(nth);
  m.faults.copy_error = error;
}

void set_peer_access_supported(bool supported) { detail::set_peer_supported(supported); }

void clear_faults() {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  m.faults = detail::Faults{};
}

cudaError_t sticky_error(int device) {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  return m.devices.at(static_cast<size_t>(device)).sticky;
}

std::string last_fault() {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  return m.last_fault;
}

bool context_active(int device) {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  return m.devices.at(static_cast<size_t>(device)).context;
}

int device_count() { return Model::get().device_count; }

size_t device_bytes(int device) {
  Model& m = Model::get();
  std::lock_guard lock(m.mutex);
  return m.devices.at(static_cast<size_t>(device)).device_bytes;
}

bool host_access_detection() { return detail::host_access_detection(); }

}  // namespace hss::cuda_model
