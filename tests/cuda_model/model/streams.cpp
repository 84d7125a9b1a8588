// Streams, events, host functions, synchronisation, stream capture and graphs of the model.
//
// Capture: work enqueued on a capturing stream (or on a stream forked into the capture by waiting
// on an event recorded in it) is recorded, not run. The calls CUDA forbids return their errors and
// invalidate the capture: synchronising or querying a capturing stream, querying or
// synchronising an event last recorded in a capture, potentially unsafe calls (allocation,
// synchronisation, event and stream queries) in a thread the capture mode restricts, the legacy
// stream while a blocking stream captures, waiting inside a capture on uncaptured work. A graph
// replays its recorded ops in capture order, with the arguments they were captured with.

#include <string>

#include "model/state.hpp"

using namespace hss::cuda_model::detail;

namespace {

/// The stream and its device's sticky error check shared by stream-ordered calls (lock held).
StreamRef checked_stream(Model& m, cudaStream_t handle, std::unique_lock<std::mutex>& lock,
                         cudaError_t* error) {
  StreamRef s = stream_of(m, handle, lock);
  if (!s) {
    *error = cudaErrorInvalidResourceHandle;
    return nullptr;
  }
  const DeviceState& d = m.devices[static_cast<size_t>(s->device)];
  *error = d.sticky;
  return s;
}

/// Ends capture membership of every stream of `c` and forgets it (lock held).
void end_capture(Model& m, const std::shared_ptr<CaptureState>& c) {
  for (const StreamRef& s : c->members) s->capture.reset();
  std::erase(m.captures, c);
}

}  // namespace

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (pStream == nullptr || (flags & ~static_cast<unsigned>(cudaStreamNonBlocking)) != 0) {
    return result(cudaErrorInvalidValue);
  }
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  DeviceState& d = current_device(lock);
  init_context(d);
  if (d.sticky != cudaSuccess) return result(d.sticky);
  auto s = std::make_shared<StreamState>();
  s->id = m.next_id++;
  s->device = d.index;
  s->flags = flags;
  m.streams.emplace(s->id, s);
  std::erase_if(d.streams, [](const std::weak_ptr<StreamState>& w) { return w.expired(); });
  d.streams.push_back(s);
  ++m.counters.streams_created;
  m.start_executor(s);
  *pStream = handle_of<cudaStream_t>(s->id);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const auto it = m.streams.find(handle_id(stream));
  if (it == m.streams.end()) return result(cudaErrorInvalidResourceHandle);
  // Work still queued runs to completion (the executor drains it, then ends).
  it->second->destroyed = true;
  if (it->second->capture) invalidate(*it->second->capture, cudaErrorStreamCaptureInvalidated);
  m.streams.erase(it);
  ++m.counters.streams_destroyed;
  m.changed.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  cudaError_t error = cudaSuccess;
  const StreamRef s = checked_stream(m, stream, lock, &error);
  if (!s) return result(error);
  if (s->capture) {
    invalidate(*s->capture, cudaErrorStreamCaptureUnsupported);
    return result(cudaErrorStreamCaptureUnsupported);
  }
  if (const cudaError_t e = unsafe_call_check(m); e != cudaSuccess) return result(e);
  if (const cudaError_t e = legacy_capture_check(m, *s); e != cudaSuccess) return result(e);
  m.wait_until(lock, m.tail_of(s), "cudaStreamSynchronize");
  return result(m.devices[static_cast<size_t>(s->device)].sticky);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  cudaError_t error = cudaSuccess;
  const StreamRef s = checked_stream(m, stream, lock, &error);
  if (!s) return result(error);
  if (s->capture) {
    invalidate(*s->capture, cudaErrorStreamCaptureUnsupported);
    return result(cudaErrorStreamCaptureUnsupported);
  }
  if (const cudaError_t e = unsafe_call_check(m); e != cudaSuccess) return result(e);
  if (error != cudaSuccess) return result(error);
  for (const Point& p : m.tail_of(s)) {
    if (!Model::reached(p)) return result(cudaErrorNotReady);
  }
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (fn == nullptr) return result(cudaErrorInvalidValue);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  cudaError_t error = cudaSuccess;
  const StreamRef s = checked_stream(m, stream, lock, &error);
  if (!s || error != cudaSuccess) return result(error);
  Op op;
  op.kind = OpKind::kHostFunc;
  op.what = "host function";
  op.body = [fn, userData]() -> cudaError_t {
    // A host function runs on a CPU thread: no device memory, no CUDA calls (CUDA forbids them).
    HostOnly host_only;
    ThreadState& t = this_thread();
    const bool was = t.in_host_func;
    t.in_host_func = true;
    fn(userData);
    t.in_host_func = was;
    return cudaSuccess;
  };
  ++m.counters.host_funcs;
  return result(m.enqueue(s, std::move(op)));
}

// ---- events

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  constexpr unsigned kKnown =
      cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (event == nullptr || (flags & ~kKnown) != 0) return result(cudaErrorInvalidValue);
  if ((flags & cudaEventInterprocess) != 0 && (flags & cudaEventDisableTiming) == 0) {
    return result(cudaErrorInvalidValue);
  }
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  DeviceState& d = current_device(lock);
  init_context(d);
  if (d.sticky != cudaSuccess) return result(d.sticky);
  auto ev = std::make_shared<EventState>();
  ev->id = m.next_id++;
  ev->device = d.index;
  ev->flags = flags;
  m.events.emplace(ev->id, ev);
  ++m.counters.events_created;
  *event = handle_of<cudaEvent_t>(ev->id);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  if (m.events.erase(handle_id(event)) == 0) return result(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const auto it = m.events.find(handle_id(event));
  if (it == m.events.end()) return result(cudaErrorInvalidResourceHandle);
  cudaError_t error = cudaSuccess;
  const StreamRef s = checked_stream(m, stream, lock, &error);
  if (!s) return result(error);
  EventState& ev = *it->second;
  if (ev.device != s->device) return result(cudaErrorInvalidResourceHandle);
  if (error != cudaSuccess) return result(error);
  if (s->capture) {
    CaptureState& c = *s->capture;
    if (c.invalidated) return result(cudaErrorStreamCaptureInvalidated);
    ev.captured_in = s->capture;
    ev.captured_on = s.get();
    ev.captured_ops = c.captured[s.get()];
    ev.recorded = false;
    return cudaSuccess;
  }
  Op op;
  op.kind = OpKind::kRecord;
  op.what = "event record";
  if (const cudaError_t e = m.enqueue(s, std::move(op)); e != cudaSuccess) return result(e);
  ev.recorded = true;
  ev.at = {s, s->enqueued};
  ev.captured_in.reset();
  ev.captured_on = nullptr;
  return cudaSuccess;
}

namespace {

/// cudaErrorCapturedEvent (invalidating a capture still running) for an event last recorded in
/// a capture; cudaSuccess otherwise.
cudaError_t captured_event_check(EventState& ev) {
  if (!ev.captured_in) return cudaSuccess;
  invalidate(*ev.captured_in, cudaErrorCapturedEvent);
  return cudaErrorCapturedEvent;
}

}  // namespace

namespace {

/// An event query's status, the runtime's (cudaEventQuery) and the driver's (cuEventQuery) alike.
cudaError_t query_event_status(cudaEvent_t event) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return e;
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const auto it = m.events.find(handle_id(event));
  if (it == m.events.end()) return cudaErrorInvalidResourceHandle;
  EventState& ev = *it->second;
  if (const cudaError_t e = captured_event_check(ev); e != cudaSuccess) return e;
  if (const cudaError_t e = unsafe_call_check(m); e != cudaSuccess) return e;
  if (const cudaError_t sticky = m.devices[static_cast<size_t>(ev.device)].sticky;
      sticky != cudaSuccess) {
    return sticky;
  }
  if (!ev.recorded || Model::reached(ev.at)) return cudaSuccess;
  return cudaErrorNotReady;
}

}  // namespace

cudaError_t cudaEventQuery(cudaEvent_t event) { return result(query_event_status(event)); }

namespace hss::cuda_model::detail {

CUresult driver_event_query(CUevent event) {
  // The driver API has no last-error slot: the status is returned, never recorded. The codes the
  // model returns here have the same values in both APIs (cudaErrorNotReady and
  // CUDA_ERROR_NOT_READY are 600, cudaErrorIllegalAddress and CUDA_ERROR_ILLEGAL_ADDRESS 700...).
  return static_cast<CUresult>(query_event_status(event));
}

}  // namespace hss::cuda_model::detail

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const auto it = m.events.find(handle_id(event));
  if (it == m.events.end()) return result(cudaErrorInvalidResourceHandle);
  const std::shared_ptr<EventState> ev = it->second;
  if (const cudaError_t e = captured_event_check(*ev); e != cudaSuccess) return result(e);
  if (const cudaError_t e = unsafe_call_check(m); e != cudaSuccess) return result(e);
  if (ev->recorded) m.wait_until(lock, {ev->at}, "cudaEventSynchronize");
  return result(m.devices[static_cast<size_t>(ev->device)].sticky);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (flags != 0 && flags != cudaEventWaitDefault) return result(cudaErrorInvalidValue);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const auto it = m.events.find(handle_id(event));
  if (it == m.events.end()) return result(cudaErrorInvalidResourceHandle);
  cudaError_t error = cudaSuccess;
  const StreamRef s = checked_stream(m, stream, lock, &error);
  if (!s) return result(error);
  if (error != cudaSuccess) return result(error);
  EventState& ev = *it->second;
  if (ev.captured_in) {
    const std::shared_ptr<CaptureState> c = ev.captured_in;
    if (s->capture && s->capture != c) {
      invalidate(*s->capture, cudaErrorStreamCaptureIsolation);
      invalidate(*c, cudaErrorStreamCaptureIsolation);
      return result(cudaErrorStreamCaptureIsolation);
    }
    if (std::find(m.captures.begin(), m.captures.end(), c) == m.captures.end()) {
      return result(cudaErrorStreamCaptureIsolation);  // that capture has ended
    }
    if (!s->capture) {  // a fork: the stream joins the capture
      s->capture = c;
      c->members.push_back(s);
    }
    if (ev.captured_on != s.get()) {
      size_t& joined = c->joined[ev.captured_on];
      joined = std::max(joined, ev.captured_ops);
    }
    return cudaSuccess;
  }
  if (s->capture) {
    // Inside a capture only captured work may be waited for.
    invalidate(*s->capture, cudaErrorStreamCaptureIsolation);
    return result(cudaErrorStreamCaptureIsolation);
  }
  if (!ev.recorded) return cudaSuccess;  // waiting for an event never recorded: nothing to do
  Op op;
  op.kind = OpKind::kWait;
  op.what = "wait for event";
  op.after.push_back(ev.at);
  return result(m.enqueue(s, std::move(op)));
}

// ---- device-wide synchronisation

cudaError_t cudaDeviceSynchronize() {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  DeviceState& d = current_device(lock);
  init_context(d);
  if (const cudaError_t e = unsafe_call_check(m); e != cudaSuccess) return result(e);
  for (const auto& c : m.captures) {
    if (c->device == d.index && !c->invalidated) {
      invalidate(*c, cudaErrorStreamCaptureUnsupported);
      return result(cudaErrorStreamCaptureUnsupported);
    }
  }
  std::vector<Point> tails = m.tail_of(d.legacy);
  for (const auto& weak : d.streams) {
    if (const StreamRef s = weak.lock()) tails.push_back({s, s->enqueued});
  }
  m.wait_until(lock, tails, "cudaDeviceSynchronize");
  return result(d.sticky);
}

// ---- capture

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return result(cudaErrorInvalidValue);
  }
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  cudaError_t error = cudaSuccess;
  const StreamRef s = checked_stream(m, stream, lock, &error);
  if (!s) return result(error);
  if (error != cudaSuccess) return result(error);
  if (s->legacy) return result(cudaErrorStreamCaptureUnsupported);
  if (s->capture) return result(cudaErrorIllegalState);
  auto c = std::make_shared<CaptureState>();
  c->id = m.next_id++;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->device = s->device;
  c->origin = s;
  c->members.push_back(s);
  s->capture = c;
  m.captures.push_back(c);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (pGraph == nullptr) return result(cudaErrorInvalidValue);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const StreamRef s = stream_of(m, stream, lock);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (!s->capture) return result(cudaErrorIllegalState);
  const std::shared_ptr<CaptureState> c = s->capture;
  if (c->origin != s) {
    invalidate(*c, cudaErrorStreamCaptureUnmatched);
    return result(cudaErrorStreamCaptureUnmatched);
  }
  if (c->thread != std::this_thread::get_id() && c->mode != cudaStreamCaptureModeRelaxed) {
    return result(cudaErrorStreamCaptureWrongThread);
  }
  for (const auto& [member, count] : c->captured) {
    if (member != s.get() && count > c->joined[member]) {
      invalidate(*c, cudaErrorStreamCaptureUnjoined);
    }
  }
  end_capture(m, c);
  *pGraph = nullptr;
  if (c->invalidated) {
    return result(c->why == cudaErrorStreamCaptureUnjoined ? cudaErrorStreamCaptureUnjoined
                                                           : cudaErrorStreamCaptureInvalidated);
  }
  auto graph = std::make_shared<GraphState>();
  graph->ops = std::move(c->ops);
  const uint64_t id = m.next_id++;
  m.graphs.emplace(id, std::move(graph));
  *pGraph = handle_of<cudaGraph_t>(id);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* pCaptureStatus) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (pCaptureStatus == nullptr) return result(cudaErrorInvalidValue);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const StreamRef s = stream_of(m, stream, lock);
  if (!s) return result(cudaErrorInvalidResourceHandle);
  if (s->legacy) {
    for (const auto& c : m.captures) {
      if (c->device == s->device && c->origin->blocking() && !c->invalidated) {
        return result(cudaErrorStreamCaptureImplicit);
      }
    }
    *pCaptureStatus = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  if (!s->capture) {
    *pCaptureStatus = cudaStreamCaptureStatusNone;
  } else {
    *pCaptureStatus = s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                              : cudaStreamCaptureStatusActive;
  }
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (mode == nullptr) return result(cudaErrorInvalidValue);
  std::swap(this_thread().mode, *mode);
  return cudaSuccess;
}

// ---- graphs

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (pGraphExec == nullptr || flags != 0) return result(cudaErrorInvalidValue);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const auto it = m.graphs.find(handle_id(graph));
  if (it == m.graphs.end()) return result(cudaErrorInvalidValue);
  const uint64_t id = m.next_id++;
  m.graph_execs.emplace(id, std::make_shared<GraphState>(*it->second));
  *pGraphExec = handle_of<cudaGraphExec_t>(id);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const auto it = m.graph_execs.find(handle_id(graphExec));
  if (it == m.graph_execs.end()) return result(cudaErrorInvalidValue);
  cudaError_t error = cudaSuccess;
  const StreamRef s = checked_stream(m, stream, lock, &error);
  if (!s) return result(error);
  if (error != cudaSuccess) return result(error);
  for (const Op& captured : it->second->ops) {
    Op op = captured;
    op.what = "graph: " + captured.what;
    op.after.clear();  // inside the graph, capture order already orders the nodes
    if (const cudaError_t e = m.enqueue(s, std::move(op)); e != cudaSuccess) return result(e);
  }
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  return m.graphs.erase(handle_id(graph)) == 0 ? result(cudaErrorInvalidValue) : cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  return m.graph_execs.erase(handle_id(graphExec)) == 0 ? result(cudaErrorInvalidValue)
                                                        : cudaSuccess;
}
