#pragma once
// The CUDA runtime model's controls, for tests linked against it (presets `model`, `model-asan`,
// `model-tsan`, `model-coverage`; HSS_CUDA_MODEL=1). The model itself is the cuda* C API of
// <cuda_runtime_api.h>: tests and library call it exactly as they call libcudart on a GPU.
//
// What it enforces (docs/design.md, "The CUDA runtime model"): memory kinds and copy directions,
// kernel accesses (alignment, reachable allocations), host dereferences of device memory (memory
// protection keys), stream order, events, the legacy default stream and the per-thread default
// streams, host functions, kernel launches (cudaLaunchKernel / cudaLaunchKernelExC: the status
// returned; a failure also written to the calling thread's last-error slot, one per host thread),
// stream capture rules, sticky errors, contexts. Configuration from the environment, read once at the
// first CUDA call: HSS_CUDA_MODEL_DEVICES (0..8, default 1), HSS_CUDA_MODEL_DEVICE_MEMORY_MIB
// (default 16384), HSS_CUDA_MODEL_MANUAL=1 (start in manual mode), HSS_CUDA_MODEL_PKEYS=0 (no
// memory protection keys).
//
// Thread-safe: every function may be called from any thread.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hss::cuda_model {

/// Totals since the process started (subtract two snapshots).
struct Counters {
  uint64_t kernel_launches = 0;
  uint64_t copies = 0;              ///< cudaMemcpy* calls
  uint64_t host_funcs = 0;          ///< cudaLaunchHostFunc calls
  uint64_t device_allocations = 0;  ///< cudaMalloc calls
  uint64_t pinned_allocations = 0;  ///< cudaHostAlloc / cudaMallocHost calls
  uint64_t frees = 0;
  uint64_t streams_created = 0;    ///< cudaStreamCreate* calls (per-thread default streams: not)
  uint64_t streams_destroyed = 0;  ///< cudaStreamDestroy calls that destroyed a stream
  uint64_t events_created = 0;
  uint64_t module_loads = 0;  ///< first launches of a kernel on a device (lazy module loading)
  uint64_t host_waits = 0;    ///< calls that blocked the host on unfinished device work
  uint64_t contexts_created = 0;
};
[[nodiscard]] Counters counters();

/// Ops queued on `stream` (nullptr: the current device's legacy stream) and not finished.
[[nodiscard]] size_t queued(cudaStream_t stream);
/// Ops queued on every stream of `device` and not finished.
[[nodiscard]] size_t queued_on_device(int device);
/// What ran on `stream`, oldest first ("kernel gather_cast<bf16,f32> <<<3, 256>>>",
/// "cudaMemcpyAsync device memory -> page-locked host memory (4096 bytes)", ...).
[[nodiscard]] std::vector<std::string> history(cudaStream_t stream);

/// Host threads blocked in the model right now (waiting for device work).
[[nodiscard]] size_t host_waiters();
/// Blocks until at least `n` host threads are blocked in the model.
void wait_for_host_waiters(size_t n);

/// A closed gate on a stream: the stream's later work waits until open() (or destruction),
/// standing in for a long kernel. Thread-safe.
class Gate {
 public:
  explicit Gate(cudaStream_t stream);
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  void open();

 private:
  std::shared_ptr<void> state_;
};

/// Manual scheduling: while on, nothing runs by itself. step() runs one runnable op (the
/// lowest stream first) and says whether it found one; a host wait runs exactly the ops it waits
/// for on the waiting thread. Off: every stream runs on its own executor thread.
void set_manual(bool manual);
[[nodiscard]] bool step();
/// Runs runnable ops until none is left; returns how many ran.
size_t run_until_blocked();

/// Faults, each for one call from now (0: the next one): an allocation call (cudaMalloc,
/// cudaHostAlloc, cudaMallocHost) fails with cudaErrorMemoryAllocation; a kernel launch fails with
/// `error` (the launch returns it and writes it to the calling thread's last-error slot, as every
/// failed runtime call does; nothing runs); a copy call is accepted but fails when it runs, with
/// `error` as the device's sticky error.
void fail_allocation(uint64_t nth);
void fail_launch(uint64_t nth, cudaError_t error = cudaErrorLaunchOutOfResources);
void fail_copy(uint64_t nth, cudaError_t error = cudaErrorIllegalAddress);
void clear_faults();

/// A kernel of no parameters that does nothing, for cudaLaunchKernel / cudaLaunchKernelExC: an
/// engine's own launch in a test (with a bad configuration, say, whose error the engine leaves
/// pending on its thread, as an unchecked <<<>>> launch does). Every other function address is
/// cudaErrorInvalidDeviceFunction to the model, except the twins of hsstore's kernels.
[[nodiscard]] const void* noop_kernel();

/// Whether cudaDeviceCanAccessPeer answers 1 for distinct devices (default true; false: 0, and
/// cudaDeviceEnablePeerAccess fails with cudaErrorPeerAccessUnsupported). Access already enabled
/// stays until cudaDeviceReset.
void set_peer_access_supported(bool supported);

/// The device's sticky error (cudaSuccess: none) and what caused it.
[[nodiscard]] cudaError_t sticky_error(int device);
[[nodiscard]] std::string last_fault();
/// True once `device`'s primary context exists.
[[nodiscard]] bool context_active(int device);
[[nodiscard]] int device_count();
/// Live cudaMalloc bytes on `device`.
[[nodiscard]] size_t device_bytes(int device);
/// True when host dereferences of device memory fault (memory protection keys are in use).
[[nodiscard]] bool host_access_detection();

}  // namespace hss::cuda_model
