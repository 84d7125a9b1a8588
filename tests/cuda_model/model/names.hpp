#pragma once
// Names and descriptions of the CUDA runtime's error codes (cudaGetErrorName/String).

#include <cuda_runtime_api.h>

namespace hss::cuda_model::detail {

[[nodiscard]] const char* error_name(cudaError_t e);
[[nodiscard]] const char* error_string(cudaError_t e);

}  // namespace hss::cuda_model::detail
