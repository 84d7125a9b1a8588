#pragma once
// The DLPack ABI (v0.8 "dltensor" capsules), declared here rather than vendored: these layouts are
// frozen by the DLPack specification and every producer (NumPy, PyTorch, CuPy, JAX) speaks them.

#include <cstdint>

namespace hss::python::dlpack {

enum DeviceType : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,  ///< page-locked host memory: readable from the host like kDLCPU
  kDLCUDAManaged = 13,
};

enum TypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  ///< in elements; null = compact row-major
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

}  // namespace hss::python::dlpack
