// hsstore._DeviceBuffer: a plain CUDA buffer with __dlpack__, so the CUDA tests (and the GPU
// check) exercise the device path without torch: device machines often cannot install it.
// Test support, not public API. Without CUDA in the build, construction raises hsstore.Error.
#include <Python.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "dlpack.hpp"
#include "hss/error.hpp"
#include "tensor_io.hpp"

#if HSS_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace hss::python {

namespace {

#if HSS_WITH_CUDA
void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw hss::Error(std::string("_DeviceBuffer: ") + what + ": " + cudaGetErrorString(rc));
  }
}
#endif

int device_count() {
#if HSS_WITH_CUDA
  int count = 0;
  // No device (or no driver): 0. The failed call wrote its own error into the thread's slot;
  // take it back only when it is that error, so an engine's pending error stays for the engine.
  if (const cudaError_t rc = cudaGetDeviceCount(&count); rc != cudaSuccess) {
    if (cudaPeekAtLastError() == rc) (void)cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

class DeviceBuffer {
 public:
  DeviceBuffer(int64_t rows, int64_t cols, DType dtype) : rows_(rows), cols_(cols), dtype_(dtype) {
    if (rows < 0 || cols < 0) throw InvalidArgument("_DeviceBuffer: negative shape");
#if HSS_WITH_CUDA
    check(cudaGetDevice(&device_), "cudaGetDevice");
    check(cudaMalloc(&data_, bytes() == 0 ? 1 : bytes()), "cudaMalloc");
    check(cudaMemset(data_, 0, bytes()), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
    throw hss::Error("_DeviceBuffer: hsstore was built without CUDA");
#endif
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
#if HSS_WITH_CUDA
    if (data_ != nullptr) (void)cudaFree(data_);
#endif
  }

  [[nodiscard]] size_t bytes() const {
    return static_cast<size_t>(rows_ * cols_) * element_size(dtype_);
  }
  void upload(const void* host) {
#if HSS_WITH_CUDA
    check(cudaMemcpy(data_, host, bytes(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
#else
    (void)host;
#endif
  }
  void download(void* host) const {
#if HSS_WITH_CUDA
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaMemcpy(host, data_, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
#else
    (void)host;
#endif
  }

  int64_t rows_, cols_;
  DType dtype_;
  int device_ = 0;
  void* data_ = nullptr;
};

// One allocation per export: the DLPack tensor, its shape, and a reference to the buffer.
struct Export {
  dlpack::ManagedTensor managed{};
  int64_t shape[2] = {0, 0};
  nb::object owner;
};

void delete_export(dlpack::ManagedTensor* self) {
  std::unique_ptr<Export> e(static_cast<Export*>(self->manager_ctx));
  nb::gil_scoped_acquire gil;
  e->owner.reset();
}

void capsule_destructor(PyObject* capsule) {
  // Still named "dltensor": nobody consumed it, so it is ours to free.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }
}

dlpack::DataType dl_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return {dlpack::kDLFloat, 32, 1};
    case DType::kFloat16:
      return {dlpack::kDLFloat, 16, 1};
    case DType::kBFloat16:
      return {dlpack::kDLBfloat, 16, 1};
  }
  return {dlpack::kDLFloat, 32, 1};
}

DType dtype_from_name(const std::string& name) {
  if (name == "float32") return DType::kFloat32;
  if (name == "float16") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  throw InvalidArgument("dtype must be float32, float16 or bfloat16, got '" + name + "'");
}

}  // namespace

void bind_device_buffer(nb::module_& m) {
  m.def("_cuda_device_count", &device_count, "CUDA devices usable by this build (0 without CUDA).");

  nb::class_<DeviceBuffer>(m, "_DeviceBuffer",
                           "Test support: a contiguous 2-D CUDA buffer exported through DLPack.")
      .def(
          "__init__",
          [](DeviceBuffer* self, int64_t rows, int64_t cols, const std::string& dtype) {
            new (self) DeviceBuffer(rows, cols, dtype_from_name(dtype));
          },
          nb::arg("rows"), nb::arg("cols"), nb::arg("dtype") = "float32")
      .def_static(
          "from_host",
          [](nb::handle array, const std::string& dtype) {
            BorrowedTensor host = borrow_tensor(array, "array");
            const DType target = dtype_from_name(dtype);
            const bool contiguous = host.view.stride() == host.view.cols;
            const bool to_bf16 = target == DType::kBFloat16 && host.view.dtype == DType::kFloat32;
            if (host.view.device != Device::kHost || !contiguous ||
                (host.view.dtype != target && !to_bf16)) {
              throw InvalidArgument("array must be a contiguous host array of dtype " + dtype +
                                    " (or float32 for bfloat16)");
            }
            auto buffer = std::make_unique<DeviceBuffer>(host.view.rows, host.view.cols, target);
            if (!to_bf16) {
              buffer->upload(host.view.data);
              return buffer;
            }
            // float32 -> bfloat16, round to nearest even (what torch's .to(bfloat16) does).
            const auto count = static_cast<size_t>(host.view.rows * host.view.cols);
            const auto* in = static_cast<const float*>(host.view.data);
            std::vector<uint16_t> bits(count);
            for (size_t i = 0; i < count; ++i) {
              uint32_t u = 0;
              std::memcpy(&u, &in[i], sizeof u);
              u += 0x7FFFu + ((u >> 16) & 1u);
              bits[i] = static_cast<uint16_t>(u >> 16);
            }
            buffer->upload(bits.data());
            return buffer;
          },
          nb::arg("array"), nb::arg("dtype") = "float32",
          "Copies a contiguous host NumPy array (float32 or float16; float32 rounded to "
          "bfloat16 with dtype='bfloat16') into a new device buffer.")
      .def_prop_ro("shape", [](const DeviceBuffer& b) { return nb::make_tuple(b.rows_, b.cols_); })
      .def(
          "to_host_bytes",
          [](const DeviceBuffer& b) {
            std::string bytes(b.bytes(), '\0');
            {
              nb::gil_scoped_release release;
              b.download(bytes.data());
            }
            return nb::bytes(bytes.data(), bytes.size());
          },
          "The contents (synchronises the device), as raw bytes.")
      .def("__dlpack_device__",
           [](const DeviceBuffer& b) { return nb::make_tuple(int(dlpack::kDLCUDA), b.device_); })
      .def(
          "__dlpack__",
          [](nb::handle self, nb::handle /*stream*/, nb::handle /*max_version*/,
             nb::handle /*dl_device*/, nb::handle /*copy*/) {
            // Written synchronously (upload/memset synchronise): ready on any stream.
            DeviceBuffer& b = nb::cast<DeviceBuffer&>(self);
            auto e = std::make_unique<Export>();
            e->shape[0] = b.rows_;
            e->shape[1] = b.cols_;
            e->owner = nb::borrow(self);
            e->managed.dl_tensor = dlpack::Tensor{
                b.data_, {dlpack::kDLCUDA, b.device_}, 2, dl_dtype(b.dtype_), e->shape, nullptr, 0};
            e->managed.manager_ctx = e.get();
            e->managed.deleter = &delete_export;
            PyObject* capsule = PyCapsule_New(&e->managed, "dltensor", &capsule_destructor);
            if (capsule == nullptr) throw nb::python_error();
            (void)e.release();  // the capsule (or its consumer) owns it now
            return nb::steal(capsule);
          },
          nb::kw_only(), nb::arg("stream").none() = nb::none(),
          nb::arg("max_version").none() = nb::none(), nb::arg("dl_device").none() = nb::none(),
          nb::arg("copy").none() = nb::none());
}

}  // namespace hss::python
