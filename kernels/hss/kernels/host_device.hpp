#pragma once
// HSS_HOST_DEVICE marks per-element logic shared by the CUDA kernels and the host path, so the
// CPU test suite exercises exactly what the kernels run.
//
// HSS_DEVICE_ACCESS(p, bytes, write) marks every typed load and store of that logic. It compiles
// to nothing, except in builds against the CUDA runtime model (HSS_KERNEL_TWIN_CHECKS, set by
// the `model` presets), where a kernel's host twin checks each access there: the alignment a GPU
// requires for an access of that width (a misaligned one is cudaErrorMisalignedAddress) and a
// live allocation the device may touch (else cudaErrorIllegalAddress). Outside a kernel twin (the
// host path) the check does nothing.

#if defined(__CUDACC__)
#define HSS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define HSS_HOST_DEVICE inline
#endif

#if defined(HSS_KERNEL_TWIN_CHECKS) && !defined(__CUDA_ARCH__)
namespace hss::kernels {
/// Defined by the CUDA runtime model (tests/cuda_model/model/kernels.cpp).
void twin_access(const void* p, unsigned bytes, bool write);
}  // namespace hss::kernels
#define HSS_DEVICE_ACCESS(p, bytes, write) ::hss::kernels::twin_access((p), (bytes), (write))
#else
#define HSS_DEVICE_ACCESS(p, bytes, write) ((void)0)
#endif
