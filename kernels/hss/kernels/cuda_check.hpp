#pragma once
// One error path for CUDA: every runtime call and kernel launch goes through HSS_CUDA_CHECK,
// which throws hss::Error carrying the call, the CUDA error string, file and line.

#include <cuda_runtime_api.h>

#include <string>

#include "hss/error.hpp"

namespace hss::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* what, const char* file,
                                          int line) {
  // Reset the thread's last-error slot: a non-sticky error (out of memory, a bad launch
  // configuration) must not make the next HSS_CUDA_CHECK_LAUNCH report it again.
  (void)cudaGetLastError();
  throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ") at " + file + ":" + std::to_string(line));
}

}  // namespace hss::detail

#define HSS_CUDA_CHECK(call)                                                   \
  do {                                                                         \
    const cudaError_t hss_status_ = (call);                                    \
    if (hss_status_ != cudaSuccess) {                                          \
      ::hss::detail::throw_cuda_error(hss_status_, #call, __FILE__, __LINE__); \
    }                                                                          \
  } while (0)

/// After a kernel launch: catches launch-configuration errors without synchronising, and clears
/// them (cudaGetLastError, not cudaPeekAtLastError) so one failed launch does not fail the next.
#define HSS_CUDA_CHECK_LAUNCH() HSS_CUDA_CHECK(cudaGetLastError())

/// Before a kernel launch: an error an earlier call of the caller's thread left in the last-error
/// slot (cudaErrorNotReady from a stream or event query is recorded there too) is not this
/// launch's; it is cleared so that HSS_CUDA_CHECK_LAUNCH reports the launch alone. A sticky error
/// is not cleared: cudaGetLastError keeps returning it, and the launch check reports it.
#define HSS_CUDA_CLEAR_STALE_ERROR() ((void)cudaGetLastError())
