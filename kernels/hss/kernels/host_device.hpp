#pragma once
// HSS_HOST_DEVICE marks per-element logic shared by the CUDA kernels and the host path, so the
// CPU test suite exercises exactly what the kernels run.

#if defined(__CUDACC__)
#define HSS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define HSS_HOST_DEVICE inline
#endif
