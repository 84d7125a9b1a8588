// Copies and memsets of the model. Each operand is classified (device memory, page-locked host
// memory, or pageable memory, which the model does not track) and must fit inside one live
// allocation of its kind and match the cudaMemcpyKind; anything else is cudaErrorInvalidValue,
// as a strict runtime would say. The copy itself runs in stream order and checks again that its
// allocations are still alive (a copy into freed memory is an illegal address).
//
// Pageable host memory behaves as in CUDA: a source is consumed before the call returns (staged),
// a destination is written before the call returns (the call waits for the stream).

#include <cstring>
#include <string>
#include <vector>

#include "model/state.hpp"

using namespace hss::cuda_model::detail;

namespace {

enum class Where : uint8_t { kDevice, kPinned, kPageable };

struct Operand {
  void* p = nullptr;
  size_t span = 0;
  Where where = Where::kPageable;
  uint64_t id = 0;  // allocation id (device or pinned)
  int device = -1;
};

const char* where_name(Where w) {
  switch (w) {
    case Where::kDevice:
      return "device memory";
    case Where::kPinned:
      return "page-locked host memory";
    default:
      return "pageable host memory";
  }
}

/// Classifies [p, p + span): false when it starts inside an allocation but does not fit it.
bool classify(const void* p, size_t span, Operand* out) {
  std::shared_lock read(memory_mutex());
  out->p = const_cast<void*>(p);
  out->span = span;
  const Allocation* a = allocation_at(p);
  if (a == nullptr) {
    out->where = Where::kPageable;
    return true;
  }
  if (!a->contains(reinterpret_cast<uintptr_t>(p), span)) return false;
  out->where = a->kind == MemKind::kDevice ? Where::kDevice : Where::kPinned;
  out->id = a->id;
  out->device = a->device;
  return true;
}

bool host_side(Where w) { return w != Where::kDevice; }

/// The direction check of cudaMemcpyKind (cudaMemcpyDefault infers it).
cudaError_t check_kind(cudaMemcpyKind kind, const Operand& dst, const Operand& src) {
  switch (kind) {
    case cudaMemcpyHostToHost:
      return host_side(src.where) && host_side(dst.where) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToDevice:
      return host_side(src.where) && dst.where == Where::kDevice ? cudaSuccess
                                                                 : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost:
      return src.where == Where::kDevice && host_side(dst.where) ? cudaSuccess
                                                                 : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
      return src.where == Where::kDevice && dst.where == Where::kDevice ? cudaSuccess
                                                                        : cudaErrorInvalidValue;
    case cudaMemcpyDefault:
      return cudaSuccess;
    default:
      return cudaErrorInvalidMemcpyDirection;
  }
}

/// At run time: the allocation the operand named at enqueue time is still alive.
void require_alive(const Operand& o, const std::string& what) {
  if (o.where == Where::kPageable) return;
  const Allocation* a = find_allocation(o.p, o.span);
  if (a == nullptr || a->id != o.id) {
    throw Fault{cudaErrorIllegalAddress,
                what + ": its " + where_name(o.where) + " was freed before the copy ran"};
  }
}

struct Shape {
  size_t width = 0;  // bytes per row
  size_t height = 1;
  size_t dpitch = 0;
  size_t spitch = 0;
};

size_t span_of(size_t pitch, const Shape& s) { return (s.height - 1) * pitch + s.width; }

/// Validates and enqueues one copy on `handle` (nullptr: the legacy stream). `sync`: the call
/// waits for it (cudaMemcpy).
cudaError_t copy(void* dst, const void* src, const Shape& shape, cudaMemcpyKind kind,
                 cudaStream_t handle, bool sync, const char* api) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (shape.width == 0 || shape.height == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr || shape.dpitch < shape.width ||
      shape.spitch < shape.width) {
    return result(cudaErrorInvalidValue);
  }
  Operand d, s;
  if (!classify(dst, span_of(shape.dpitch, shape), &d) ||
      !classify(src, span_of(shape.spitch, shape), &s)) {
    return result(cudaErrorInvalidValue);
  }
  if (const cudaError_t e = check_kind(kind, d, s); e != cudaSuccess) return result(e);

  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const StreamRef stream = stream_of(m, handle, lock);
  if (!stream) return result(cudaErrorInvalidResourceHandle);
  init_context(m.devices[static_cast<size_t>(stream->device)]);
  if (sync) {
    if (const cudaError_t e = unsafe_call_check(m); e != cudaSuccess) return result(e);
  }
  if (const cudaError_t e = m.devices[static_cast<size_t>(stream->device)].sticky;
      e != cudaSuccess) {
    return result(e);
  }
  const bool pageable_dst = d.where == Where::kPageable;
  const bool pageable_src = s.where == Where::kPageable;
  if (stream->capture && (pageable_dst || pageable_src)) {
    invalidate(*stream->capture, cudaErrorStreamCaptureUnsupported);
    return result(cudaErrorStreamCaptureUnsupported);
  }
  ++m.counters.copies;
  const bool fail = m.faults.copy >= 0 && m.faults.copy-- == 0;
  const cudaError_t fail_with = m.faults.copy_error;

  // A pageable source is staged now, as the driver does: the caller may reuse it on return.
  std::shared_ptr<std::vector<unsigned char>> staged;
  if (pageable_src) {
    const size_t n = span_of(shape.spitch, shape);
    staged = std::make_shared<std::vector<unsigned char>>(n);
    std::memcpy(staged->data(), src, n);
  }
  const std::string what = std::string(api) + " " + where_name(s.where) + " -> " +
                           where_name(d.where) + " (" + std::to_string(shape.width * shape.height) +
                           " bytes)";
  Op op;
  op.kind = OpKind::kCopy;
  op.what = what;
  op.body = [d, s, shape, staged, fail, fail_with, what]() -> cudaError_t {
    if (fail) throw Fault{fail_with, what + ": failed (planted by cuda_model::fail_copy)"};
    DeviceAccess access;
    std::shared_lock read(memory_mutex());
    require_alive(d, what);
    require_alive(s, what);
    const auto* from = staged ? staged->data() : static_cast<const unsigned char*>(s.p);
    auto* to = static_cast<unsigned char*>(d.p);
    for (size_t row = 0; row < shape.height; ++row) {
      std::memmove(to + row * shape.dpitch, from + row * shape.spitch, shape.width);
    }
    return cudaSuccess;
  };
  if (const cudaError_t e = m.enqueue(stream, std::move(op)); e != cudaSuccess) return result(e);
  if (sync || pageable_dst) {
    m.wait_until(lock, {{stream, stream->enqueued}}, api);
    return result(m.devices[static_cast<size_t>(stream->device)].sticky);
  }
  return cudaSuccess;
}

cudaError_t memset(void* p, int value, size_t count, cudaStream_t handle, const char* api) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (count == 0) return cudaSuccess;
  Operand d;
  if (p == nullptr || !classify(p, count, &d) || d.where != Where::kDevice) {
    return result(cudaErrorInvalidValue);
  }
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  const StreamRef stream = stream_of(m, handle, lock);
  if (!stream) return result(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = m.devices[static_cast<size_t>(stream->device)].sticky;
      e != cudaSuccess) {
    return result(e);
  }
  const std::string what = std::string(api) + " (" + std::to_string(count) + " bytes)";
  Op op;
  op.kind = OpKind::kMemset;
  op.what = what;
  op.body = [d, value, count, what]() -> cudaError_t {
    DeviceAccess access;
    std::shared_lock read(memory_mutex());
    require_alive(d, what);
    std::memset(d.p, value, count);
    return cudaSuccess;
  };
  // Asynchronous with respect to the host, on the legacy stream for cudaMemset: later work on a
  // non-blocking stream is not ordered after it.
  return result(m.enqueue(stream, std::move(op)));
}

}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return copy(dst, src, {count, 1, count, count}, kind, nullptr, /*sync=*/true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return copy(dst, src, {count, 1, count, count}, kind, stream, /*sync=*/false, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  return copy(dst, src, {width, height, dpitch, spitch}, kind, stream, /*sync=*/false,
              "cudaMemcpy2DAsync");
}

cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height, cudaMemcpyKind kind) {
  return copy(dst, src, {width, height, dpitch, spitch}, kind, nullptr, /*sync=*/true,
              "cudaMemcpy2D");
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return memset(devPtr, value, count, nullptr, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return memset(devPtr, value, count, stream, "cudaMemsetAsync");
}
