#pragma once
// One error path for CUDA: every runtime call and kernel launch goes through HSS_CUDA_CHECK,
// which throws hss::Error carrying the call, the CUDA error string, file and line.
//
// The calling thread's last-error slot (cudaGetLastError / cudaPeekAtLastError) belongs to the
// engine: hsstore runs on the engine's threads, and an error an engine launch left pending there
// is the engine's to find. So hsstore never reads the slot to learn how its own work went: kernels
// launch through cudaLaunchKernelEx and check the status it returns (kernels/*.cu), as every
// other call does. What the runtime does to the slot: a call that fails writes its error there,
// over whatever was pending; a call that succeeds leaves it alone. hsstore takes out only what its
// own failed call wrote (clear_own_error), so an hsstore failure is never reported again as the
// engine's. docs/design.md, "The thread's last error".

#include <cuda_runtime_api.h>

#include <string>

#include "hss/error.hpp"

namespace hss::detail {

/// After a runtime call of hsstore's that returned `status`: when it failed, the runtime wrote
/// `status` into the calling thread's last-error slot; take it out, so that the engine's next
/// cudaGetLastError does not report hsstore's failure as its own. The slot is left alone when it
/// holds anything else: a status that never went through the runtime (cub's own checks), or an
/// error that is not hsstore's. A sticky error stays (the runtime does not clear it).
inline void clear_own_error(cudaError_t status) noexcept {
  if (status != cudaSuccess && cudaPeekAtLastError() == status) (void)cudaGetLastError();
}

/// True when the calling thread's last-error slot holds an error (a sticky one included). Peeks:
/// clears nothing.
[[nodiscard]] inline bool last_error_pending() noexcept {
  return cudaPeekAtLastError() != cudaSuccess;
}

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* what, const char* file,
                                          int line) {
  // A non-sticky error (out of memory, a bad launch configuration) of hsstore's own must not stay
  // in the engine's last-error slot once it has been thrown.
  clear_own_error(status);
  throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ") at " + file + ":" + std::to_string(line));
}

}  // namespace hss::detail

/// Checks the status a runtime call (or a launch through cudaLaunchKernelEx, or a cub call)
/// returns. Never reads the thread's last error: that is the engine's.
#define HSS_CUDA_CHECK(call)                                                   \
  do {                                                                         \
    const cudaError_t hss_status_ = (call);                                    \
    if (hss_status_ != cudaSuccess) {                                          \
      ::hss::detail::throw_cuda_error(hss_status_, #call, __FILE__, __LINE__); \
    }                                                                          \
  } while (0)
