// Memory of the model: device allocations (cudaMalloc) and page-locked host allocations
// (cudaHostAlloc), each its own mapping, tracked in a registry every copy and kernel access is
// checked against. Device mappings carry a memory protection key that host threads may not use,
// so host code dereferencing device memory faults at once (SIGSEGV, SEGV_PKUERR); the model's
// copies and kernel twins lift the restriction for their own accesses (DeviceAccess).

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "model/state.hpp"

namespace hss::cuda_model::detail {
namespace {

struct Registry {
  std::shared_mutex mutex;
  std::map<uintptr_t, Allocation> by_base;
  uint64_t next_id = 1;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed (see Model::get)
  return *r;
}

// ---- memory protection keys

struct sigaction previous_segv;
int protection_key = -1;

/// Async-signal-safe: writes "<text>0x<hex>\n" to stderr.
void write_address(const char* text, uintptr_t p) {
  char buf[128];
  size_t n = 0;
  for (const char* c = text; *c != '\0' && n < 96; ++c) buf[n++] = *c;
  buf[n++] = '0';
  buf[n++] = 'x';
  for (int shift = 60; shift >= 0; shift -= 4) {
    buf[n++] = "0123456789abcdef"[(p >> shift) & 0xF];
  }
  buf[n++] = '\n';
  (void)!::write(2, buf, n);
}

void on_segv(int sig, siginfo_t* info, void* context) {
#ifdef SEGV_PKUERR
  if (info->si_code == SEGV_PKUERR) {
    write_address(
        "cuda model: host code dereferenced device memory (cudaMalloc'd, readable only by copies "
        "and kernels) at ",
        reinterpret_cast<uintptr_t>(info->si_addr));
  }
#endif
  // Hand the fault to whoever handled it before (a sanitizer prints the stack; the default
  // action ends the process): restore it and let the access fault again.
  (void)sig;
  (void)context;
  sigaction(SIGSEGV, &previous_segv, nullptr);
}

int protection() {
  static const int key = [] {
    if (const char* v = std::getenv("HSS_CUDA_MODEL_PKEYS"); v != nullptr && *v == '0') return -1;
    const int k = pkey_alloc(0, PKEY_DISABLE_ACCESS);
    if (k < 0) return -1;  // no PKU on this CPU or kernel: no host-access detection
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
    protection_key = k;
    return k;
  }();
  return key;
}

size_t mapping_bytes(size_t bytes) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return bytes == 0 ? page : (bytes + page - 1) / page * page;
}

void* map_memory(size_t mapping, bool device) {
  void* p = mmap(nullptr, mapping, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (device && protection() >= 0) {
    if (pkey_mprotect(p, mapping, PROT_READ | PROT_WRITE, protection()) != 0) {
      std::perror("cuda model: pkey_mprotect");
      std::abort();
    }
  }
  return p;
}

const Allocation* insert(void* p, size_t bytes, size_t mapping, MemKind kind, int device,
                         unsigned flags) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(p);
  a.bytes = bytes;
  a.mapping = mapping;
  a.kind = kind;
  a.device = device;
  a.flags = flags;
  a.id = r.next_id++;
  return &r.by_base.insert_or_assign(a.base, a).first->second;
}

/// Removes the allocation based at p of `kind`; false when there is none.
bool erase(const void* p, MemKind kind, Allocation* out) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  const auto it = r.by_base.find(reinterpret_cast<uintptr_t>(p));
  if (it == r.by_base.end() || it->second.kind != kind) return false;
  *out = it->second;
  r.by_base.erase(it);
  return true;
}

/// The common prologue of an allocating call: context, sticky error, capture rules, faults.
cudaError_t allocation_prologue(Model& m, std::unique_lock<std::mutex>& lock, bool counted) {
  DeviceState& d = current_device(lock);
  if (const cudaError_t e = unsafe_call_check(m); e != cudaSuccess) return e;
  init_context(d);
  if (d.sticky != cudaSuccess) return d.sticky;
  if (counted && m.faults.allocation >= 0 && m.faults.allocation-- == 0) {
    return cudaErrorMemoryAllocation;
  }
  return cudaSuccess;
}

}  // namespace

std::shared_mutex& memory_mutex() { return registry().mutex; }

const Allocation* allocation_at(const void* p) {
  const auto& by_base = registry().by_base;
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = by_base.upper_bound(a);
  if (it == by_base.begin()) return nullptr;
  --it;
  return a < it->second.base + std::max<size_t>(it->second.bytes, 1) ? &it->second : nullptr;
}

const Allocation* find_allocation(const void* p, size_t n) {
  const Allocation* a = allocation_at(p);
  return a != nullptr && a->contains(reinterpret_cast<uintptr_t>(p), n) ? a : nullptr;
}

DeviceAccess::DeviceAccess() {
  if (protection() < 0) return;
  saved_ = pkey_get(protection());
  (void)pkey_set(protection(), 0);
}

DeviceAccess::~DeviceAccess() {
  if (saved_ >= 0) (void)pkey_set(protection(), static_cast<unsigned>(saved_));
}

HostOnly::HostOnly() {
  if (protection() < 0) return;
  saved_ = pkey_get(protection());
  (void)pkey_set(protection(), PKEY_DISABLE_ACCESS);
}

HostOnly::~HostOnly() {
  if (saved_ >= 0) (void)pkey_set(protection(), static_cast<unsigned>(saved_));
}

bool host_access_detection() { return protection() >= 0; }

void free_device_allocations(int device) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  for (auto it = r.by_base.begin(); it != r.by_base.end();) {
    if (it->second.kind == MemKind::kDevice && it->second.device == device) {
      munmap(reinterpret_cast<void*>(it->second.base), it->second.mapping);
      it = r.by_base.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace hss::cuda_model::detail

using namespace hss::cuda_model::detail;

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (devPtr == nullptr) return result(cudaErrorInvalidValue);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  if (const cudaError_t e = allocation_prologue(m, lock, true); e != cudaSuccess) {
    return result(e);
  }
  DeviceState& d = current_device(lock);
  ++m.counters.device_allocations;
  if (size == 0) {
    *devPtr = nullptr;
    return cudaSuccess;
  }
  if (size > m.device_memory - std::min(m.device_memory, d.device_bytes)) {
    return result(cudaErrorMemoryAllocation);
  }
  const size_t mapping = mapping_bytes(size);
  void* p = map_memory(mapping, /*device=*/true);
  if (p == nullptr) return result(cudaErrorMemoryAllocation);
  (void)insert(p, size, mapping, MemKind::kDevice, d.index, 0);
  d.device_bytes += size;
  *devPtr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  DeviceState& current = current_device(lock);
  if (const cudaError_t e = unsafe_call_check(m); e != cudaSuccess) return result(e);
  init_context(current);
  if (devPtr == nullptr) return cudaSuccess;
  int device = -1;
  {
    std::shared_lock read(memory_mutex());
    const Allocation* a = allocation_at(devPtr);
    if (a == nullptr || a->base != reinterpret_cast<uintptr_t>(devPtr) ||
        a->kind != MemKind::kDevice) {
      return result(cudaErrorInvalidValue);
    }
    device = a->device;
  }
  // cudaFree synchronises the device: nothing queued may still use the memory.
  DeviceState& d = m.devices[static_cast<size_t>(device)];
  std::vector<Point> tails = m.tail_of(d.legacy);
  for (const auto& weak : d.streams) {
    if (const StreamRef s = weak.lock()) tails.push_back({s, s->enqueued});
  }
  m.wait_until(lock, tails, "cudaFree");
  Allocation a;
  if (!erase(devPtr, MemKind::kDevice, &a)) return result(cudaErrorInvalidValue);
  munmap(reinterpret_cast<void*>(a.base), a.mapping);
  d.device_bytes -= std::min(d.device_bytes, a.bytes);
  ++m.counters.frees;
  return result(d.sticky);
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  constexpr unsigned kKnown =
      cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
  if (pHost == nullptr || (flags & ~kKnown) != 0) return result(cudaErrorInvalidValue);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  if (const cudaError_t e = allocation_prologue(m, lock, true); e != cudaSuccess) {
    return result(e);
  }
  ++m.counters.pinned_allocations;
  const size_t mapping = mapping_bytes(size);
  void* p = map_memory(mapping, /*device=*/false);
  if (p == nullptr) return result(cudaErrorMemoryAllocation);
  (void)insert(p, size, mapping, MemKind::kPinned, current_device(lock).index, flags);
  *pHost = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* ptr) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  if (const cudaError_t e = unsafe_call_check(m); e != cudaSuccess) return result(e);
  if (ptr == nullptr) return cudaSuccess;
  // No implicit synchronisation here: a copy still queued into freed pinned memory is reported
  // when it runs (an illegal address), as a use after free should be.
  Allocation a;
  if (!erase(ptr, MemKind::kPinned, &a)) return result(cudaErrorInvalidValue);
  munmap(reinterpret_cast<void*>(a.base), a.mapping);
  ++m.counters.frees;
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (pDevice == nullptr || flags != 0) return result(cudaErrorInvalidValue);
  Model& m = Model::get();
  std::unique_lock lock(m.mutex);
  init_context(current_device(lock));
  std::shared_lock read(memory_mutex());
  const Allocation* a = find_allocation(pHost, 1);
  if (a == nullptr || a->kind != MemKind::kPinned || !a->device_mapped()) {
    return result(cudaErrorInvalidValue);
  }
  *pDevice = pHost;  // unified addressing: the host address is the device address
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (const cudaError_t e = enter(); e != cudaSuccess) return result(e);
  if (attributes == nullptr) return result(cudaErrorInvalidValue);
  (void)Model::get();
  std::shared_lock read(memory_mutex());
  const Allocation* a = find_allocation(ptr, 1);
  *attributes = cudaPointerAttributes{};
  if (a == nullptr) {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    return cudaSuccess;
  }
  attributes->device = a->device;
  if (a->kind == MemKind::kDevice) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeHost;
    attributes->hostPointer = const_cast<void*>(ptr);
    attributes->devicePointer = a->device_mapped() ? const_cast<void*>(ptr) : nullptr;
  }
  return cudaSuccess;
}
