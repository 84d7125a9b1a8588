// DLPack import/export and token-id conversion for the hsstore module (see tensor_io.hpp).
#include <Python.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "bindings.hpp"
#include "hss/error.hpp"
#include "tensor_io.hpp"

namespace hss::python {

namespace {

std::string repr_of(nb::handle obj) {
  std::string text = nb::cast<std::string>(nb::repr(obj));
  constexpr size_t kMaxShown = 80;
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown) + "...";
  return text;
}

std::string py_type_name(nb::handle obj) {
  return nb::cast<std::string>(
      nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr()))).attr("__qualname__"));
}

std::string shape_of(const dlpack::Tensor& t) {
  std::string out = "(";
  for (int32_t i = 0; i < t.ndim; ++i) {
    if (i) out += ", ";
    out += std::to_string(t.shape[i]);
  }
  return out + (t.ndim == 1 ? ",)" : ")");
}

std::string dtype_of(const dlpack::DataType& d) {
  const char* base = d.code == dlpack::kDLInt      ? "int"
                     : d.code == dlpack::kDLUInt   ? "uint"
                     : d.code == dlpack::kDLFloat  ? "float"
                     : d.code == dlpack::kDLBfloat ? "bfloat"
                                                   : "code";
  std::string out = base + std::to_string(d.bits);
  if (d.lanes != 1) out += "x" + std::to_string(d.lanes);
  return out;
}

bool is_torch_tensor(nb::handle obj) {
  // Without importing torch: a torch tensor's type lives in the torch module.
  nb::handle type(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())));
  nb::object module = nb::getattr(type, "__module__", nb::none());
  if (module.is_none()) return false;
  std::string name = nb::cast<std::string>(nb::str(module));
  return name == "torch" || name.rfind("torch.", 0) == 0;
}

ImportedTensor import_dlpack_checked(nb::handle obj, void** stream_out);

// Calls obj.__dlpack__ with the stream handshake and takes ownership of the capsule's tensor.
ImportedTensor import_dlpack(nb::handle obj_in, const char* name, void** stream_out) {
  nb::object obj = nb::borrow(obj_in);
  if (!nb::hasattr(obj, "__dlpack__") || !nb::hasattr(obj, "__dlpack_device__")) {
    throw InvalidArgument(std::string(name) +
                          " must be a tensor with __dlpack__ (NumPy array, torch tensor, ...), "
                          "got " +
                          py_type_name(obj) + " " + repr_of(obj));
  }
  if (is_torch_tensor(obj) && nb::cast<bool>(nb::getattr(obj, "is_meta", nb::bool_(false)))) {
    throw InvalidArgument(std::string(name) +
                          " is a torch tensor on the 'meta' device, which holds no data: hsstore "
                          "reads and writes CPU or CUDA memory");
  }
  if (nb::cast<bool>(nb::getattr(obj, "requires_grad", nb::bool_(false)))) {
    obj = obj.attr("detach")();  // LMCache detaches too; DLPack refuses tensors needing grad
  }
  try {
    return import_dlpack_checked(obj, stream_out);
  } catch (const nb::python_error& e) {
    // The producer refused the export (a read-only buffer, a device DLPack cannot describe):
    // name the argument, as every other bad input does.
    const nb::handle error = e.value();
    throw InvalidArgument(std::string(name) + " cannot be exported through DLPack (" +
                          py_type_name(obj) + "): " + py_type_name(error) + ": " +
                          nb::cast<std::string>(nb::str(error)));
  }
}

ImportedTensor import_dlpack_checked(nb::handle obj, void** stream_out) {
  nb::tuple device = nb::cast<nb::tuple>(obj.attr("__dlpack_device__")());
  const int device_type = nb::cast<int>(device[0]);
  const int device_id = nb::cast<int>(device[1]);
  nb::object capsule;
  if (device_type == dlpack::kDLCUDA || device_type == dlpack::kDLCUDAManaged) {
    // Stream handshake: the producer orders its pending work before our stream. For torch that
    // stream is its current one, so the store's copy runs in order with the producer's kernels.
    intptr_t stream = 1;  // DLPack: 1 = the legacy default stream (0 is not allowed)
    if (is_torch_tensor(obj)) {
      nb::object torch_cuda = nb::module_::import_("torch.cuda");
      intptr_t current =
          nb::cast<intptr_t>(torch_cuda.attr("current_stream")(device_id).attr("cuda_stream"));
      if (current != 0) stream = current;
    }
    capsule = obj.attr("__dlpack__")(nb::arg("stream") = stream);
    if (stream_out != nullptr) {
      *stream_out = stream == 1 ? nullptr : reinterpret_cast<void*>(stream);
    }
  } else {
    capsule = obj.attr("__dlpack__")();
  }
  auto* managed =
      static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) throw nb::python_error();  // "not an unused 'dltensor' capsule"
  // Consumed: the capsule's destructor must no longer free it; we call the deleter ourselves.
  if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) throw nb::python_error();
  return ImportedTensor(managed);
}

// A strided, CPU torch tensor read through its attributes (a few hundred ns) instead of torch's
// __dlpack__ (~3 us). Anything unusual (other devices, layouts, dtypes, negated views) takes the
// DLPack path, which also produces the error messages.
struct TorchCpuView {
  void* data = nullptr;
  std::string dtype;  ///< "float32", "int64", ... (torch's name without "torch.")
  std::vector<int64_t> shape, strides;
};

std::optional<TorchCpuView> torch_cpu_view_or_throw(nb::handle obj) {
  if (!nb::cast<bool>(obj.attr("is_cpu"))) return std::nullopt;
  static PyObject* strided = [] {
    nb::object layout = nb::module_::import_("torch").attr("strided");
    return layout.release().ptr();  // lives as long as torch does (the process)
  }();
  if (obj.attr("layout").ptr() != strided) return std::nullopt;
  TorchCpuView v;
  const nb::object dtype_object = obj.attr("dtype");
  // str() of the dtype ("torch.float32"); nb::str(object) would only re-type the object.
  std::string dtype = nb::cast<std::string>(nb::str(nb::handle(dtype_object)));
  constexpr std::string_view kPrefix = "torch.";
  v.dtype = dtype.rfind(kPrefix, 0) == 0 ? dtype.substr(kPrefix.size()) : dtype;
  v.shape = nb::cast<std::vector<int64_t>>(obj.attr("shape"));
  v.strides = nb::cast<std::vector<int64_t>>(obj.attr("stride")());
  v.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(obj.attr("data_ptr")()));
  return v;
}

std::optional<TorchCpuView> torch_cpu_view(nb::handle obj) {
  if (!is_torch_tensor(obj)) return std::nullopt;
  try {
    return torch_cpu_view_or_throw(obj);
  } catch (const nb::python_error&) {  // not a plain tensor after all (torch.Size, a dtype, ...)
    return std::nullopt;
  }
}

}  // namespace

void ImportedTensor::reset() noexcept {
  if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
  managed_ = nullptr;
}

namespace {

std::optional<BorrowedTensor> borrow_torch_cpu(nb::handle obj) {
  std::optional<TorchCpuView> v = torch_cpu_view(obj);
  if (!v || v->shape.size() != 2) return std::nullopt;
  BorrowedTensor out;
  if (v->dtype == "float32") {
    out.view.dtype = DType::kFloat32;
  } else if (v->dtype == "float16") {
    out.view.dtype = DType::kFloat16;
  } else if (v->dtype == "bfloat16") {
    out.view.dtype = DType::kBFloat16;
  } else {
    return std::nullopt;
  }
  out.view.rows = v->shape[0];
  out.view.cols = v->shape[1];
  const bool cols_contiguous = v->strides[1] == 1 || out.view.cols <= 1;
  const bool rows_describable = out.view.rows <= 1 || v->strides[0] >= out.view.cols;
  if (!cols_contiguous || !rows_describable) return std::nullopt;
  out.view.row_stride = out.view.rows <= 1 ? 0 : v->strides[0];
  out.view.data = v->data;
  out.view.device = Device::kHost;
  out.keep_alive = nb::borrow(obj);
  return out;
}

/// A 2-D float32/float16 NumPy array read through the buffer protocol (a C call, where
/// __dlpack__ costs a Python call, a capsule and a deleter). A read-only array (np.broadcast_to,
/// an array over bytes) is decided here, as DLPack cannot export it: read when its rows are
/// describable and Access::kRead, InvalidArgument naming `name` otherwise. Anything else hsstore
/// cannot take as it is (bfloat16, odd strides, other types): nullopt, and the DLPack path
/// decides (and words the message).
std::optional<BorrowedTensor> borrow_numpy(nb::handle obj, const char* name, Access access) {
  if (std::strcmp(Py_TYPE(obj.ptr())->tp_name, "numpy.ndarray") != 0) return std::nullopt;
  auto filled = std::make_unique<Py_buffer>();
  bool read_only = false;
  if (PyObject_GetBuffer(obj.ptr(), filled.get(), PyBUF_RECORDS) != 0) {
    PyErr_Clear();
    if (PyObject_GetBuffer(obj.ptr(), filled.get(), PyBUF_RECORDS_RO) != 0) {
      PyErr_Clear();
      return std::nullopt;
    }
    read_only = true;
  }
  // Held until the call is over (it moves into the result), released on every other way out.
  HeldBuffer held(std::move(filled));
  const Py_buffer& buffer = held.get();
  const std::string_view format = buffer.format != nullptr ? buffer.format : "";
  const bool f32 = format == "f" || format == "<f" || format == "=f";
  const bool f16 = format == "e" || format == "<e" || format == "=e";
  const bool usable = buffer.ndim == 2 && (f32 || f16) && buffer.strides != nullptr &&
                      buffer.strides[0] % buffer.itemsize == 0 &&
                      buffer.strides[1] % buffer.itemsize == 0;
  std::optional<BorrowedTensor> out;
  if (usable) {
    const int64_t rows = buffer.shape[0];
    const int64_t cols = buffer.shape[1];
    const int64_t row_stride = buffer.strides[0] / buffer.itemsize;
    const int64_t col_stride = buffer.strides[1] / buffer.itemsize;
    if ((col_stride == 1 || cols <= 1) && (rows <= 1 || row_stride >= cols)) {
      out.emplace();
      out->view = {buffer.buf,
                   f32 ? DType::kFloat32 : DType::kFloat16,
                   rows,
                   cols,
                   rows <= 1 ? 0 : row_stride,
                   Device::kHost,
                   0};
    }
  }
  // The view is valid while the buffer is held (which also holds a reference to the array): the
  // result keeps it, as the copy runs without the GIL after this returns.
  const auto keep_buffer = [&] {
    if (out) out->buffer = std::move(held);
    return std::move(out);
  };
  if (!read_only) return keep_buffer();
  const std::string n(name);
  if (access == Access::kWrite) {
    throw InvalidArgument(n +
                          " is a read-only NumPy array: hsstore writes the restored rows "
                          "into it (pass a writable array)");
  }
  if (!out) {
    std::string shape = "(";
    for (int i = 0; i < buffer.ndim; ++i) {
      if (i) shape += ", ";
      shape += std::to_string(buffer.shape[i]);
    }
    shape += buffer.ndim == 1 ? ",)" : ")";
    throw InvalidArgument(n + " is a read-only NumPy array (format '" + std::string(format) +
                          "', shape " + shape +
                          ") that hsstore cannot read as it is: it needs 2-D float32 or float16 "
                          "rows, contiguous within a row, with a row stride >= hidden_dim (pass "
                          "np.ascontiguousarray(" +
                          n + ", np.float32))");
  }
  return keep_buffer();
}

}  // namespace

// torch's negated/conjugated views share their storage with a flag that __dlpack__ ignores (the
// export reads the un-negated values): materialise them first.
nb::object resolved_torch_view(nb::handle obj) {
  nb::object tensor = nb::borrow(obj);
  if (!is_torch_tensor(obj)) return tensor;
  try {
    if (nb::cast<bool>(tensor.attr("is_neg")())) tensor = tensor.attr("resolve_neg")();
    if (nb::cast<bool>(tensor.attr("is_conj")())) tensor = tensor.attr("resolve_conj")();
  } catch (const nb::python_error&) {  // not a plain tensor: the DLPack path reports it
  }
  return tensor;
}

BorrowedTensor borrow_tensor(nb::handle obj_in, const char* name, Access access) {
  const nb::object obj = resolved_torch_view(obj_in);
  if (std::optional<BorrowedTensor> fast = borrow_torch_cpu(obj)) return std::move(*fast);
  if (std::optional<BorrowedTensor> fast = borrow_numpy(obj, name, access)) {
    return std::move(*fast);
  }
  BorrowedTensor out;
  out.owner = import_dlpack(obj, name, &out.stream);
  const dlpack::Tensor& t = out.owner.tensor();
  const std::string n(name);
  if (t.ndim != 2) {
    throw InvalidArgument(n + " must be 2-D [num_tokens, hidden_dim], got shape " + shape_of(t));
  }
  if (t.dtype.lanes != 1 ||
      !((t.dtype.code == dlpack::kDLFloat && (t.dtype.bits == 32 || t.dtype.bits == 16)) ||
        (t.dtype.code == dlpack::kDLBfloat && t.dtype.bits == 16))) {
    throw InvalidArgument(n + " must be float32, float16 or bfloat16, got " + dtype_of(t.dtype));
  }
  out.view.dtype = t.dtype.code == dlpack::kDLBfloat ? DType::kBFloat16
                   : t.dtype.bits == 32              ? DType::kFloat32
                                                     : DType::kFloat16;
  out.view.rows = t.shape[0];
  out.view.cols = t.shape[1];
  out.view.data = out.owner.data();
  if (t.strides != nullptr) {
    const int64_t row_stride = t.strides[0];
    const int64_t col_stride = t.strides[1];
    const bool cols_contiguous = col_stride == 1 || out.view.cols <= 1;
    const bool rows_describable = out.view.rows <= 1 || row_stride >= out.view.cols;
    if (!cols_contiguous || !rows_describable) {
      throw InvalidArgument(n + " has strides (" + std::to_string(row_stride) + ", " +
                            std::to_string(col_stride) + ") for shape " + shape_of(t) +
                            ": rows must be contiguous with a row stride >= hidden_dim "
                            "(call .contiguous() first)");
    }
    out.view.row_stride = out.view.rows <= 1 ? 0 : row_stride;
  }
  switch (t.device.device_type) {
    case dlpack::kDLCPU:
    case dlpack::kDLCUDAHost:
      out.view.device = Device::kHost;
      break;
    case dlpack::kDLCUDA:
    case dlpack::kDLCUDAManaged:
      out.view.device = Device::kCuda;
      out.view.device_index = t.device.device_id;
      break;
    default:
      throw InvalidArgument(n + " is on DLPack device type " +
                            std::to_string(t.device.device_type) +
                            ", which hsstore cannot use (CPU or CUDA only)");
  }
  return out;
}

std::vector<int64_t> BorrowedTokenIds::to_vector() const {
  return visit([](auto span) { return std::vector<int64_t>(span.begin(), span.end()); });
}

BorrowedTokenIds token_ids_from(nb::handle obj, const char* name) {
  BorrowedTokenIds ids;
  const std::string n(name);
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr()) || PyRange_Check(obj.ptr())) {
    ids.owned_ = int_list_from(obj, name);
    ids.i64_ = ids.owned_;
    return ids;
  }
  if (!nb::hasattr(obj, "__dlpack__")) {
    throw InvalidArgument(n + " must be a list of ints or a 1-D integer array/tensor, got " +
                          py_type_name(obj) + " " + repr_of(obj));
  }
  if (std::optional<TorchCpuView> v = torch_cpu_view(obj); v && v->shape.size() == 1) {
    const auto count = static_cast<size_t>(v->shape[0]);
    const bool contiguous = v->strides[0] == 1 || count <= 1;
    if (contiguous && v->dtype == "int64") {
      ids.keep_alive_ = nb::borrow(obj);
      ids.i64_ = {static_cast<const int64_t*>(v->data), count};
      return ids;
    }
    if (contiguous && v->dtype == "int32") {
      ids.keep_alive_ = nb::borrow(obj);
      ids.i32_ = {static_cast<const int32_t*>(v->data), count};
      ids.is32_ = true;
      return ids;
    }
  }
  ids.owner_ = import_dlpack(obj, name, nullptr);
  const dlpack::Tensor& t = ids.owner_.tensor();
  if (t.device.device_type != dlpack::kDLCPU && t.device.device_type != dlpack::kDLCUDAHost) {
    throw InvalidArgument(n + " must be on the CPU, got DLPack device type " +
                          std::to_string(t.device.device_type));
  }
  if (t.ndim != 1) throw InvalidArgument(n + " must be 1-D, got shape " + shape_of(t));
  if (t.dtype.lanes != 1 || (t.dtype.code != dlpack::kDLInt && t.dtype.code != dlpack::kDLUInt)) {
    throw InvalidArgument(n + " must hold integers, got " + dtype_of(t.dtype));
  }
  const auto count = static_cast<size_t>(t.shape[0]);
  const int64_t stride = t.strides != nullptr ? t.strides[0] : 1;
  const void* data = ids.owner_.data();
  const bool contiguous = stride == 1 || count <= 1;
  if (contiguous && t.dtype.code == dlpack::kDLInt && t.dtype.bits == 32) {
    ids.i32_ = {static_cast<const int32_t*>(data), count};
    ids.is32_ = true;
    return ids;
  }
  if (contiguous && t.dtype.code == dlpack::kDLInt && t.dtype.bits == 64) {
    ids.i64_ = {static_cast<const int64_t*>(data), count};
    return ids;
  }
  // Other integer widths or strided: widen into our own buffer.
  ids.owned_.resize(count);
  auto read = [&](size_t i) -> int64_t {
    const auto offset = static_cast<int64_t>(i) * stride;
    const bool is_signed = t.dtype.code == dlpack::kDLInt;
    switch (t.dtype.bits) {
      case 8:
        return is_signed ? static_cast<const int8_t*>(data)[offset]
                         : static_cast<const uint8_t*>(data)[offset];
      case 16:
        return is_signed ? static_cast<const int16_t*>(data)[offset]
                         : static_cast<const uint16_t*>(data)[offset];
      case 32:
        return is_signed ? static_cast<const int32_t*>(data)[offset]
                         : static_cast<const uint32_t*>(data)[offset];
      case 64: {
        if (is_signed) return static_cast<const int64_t*>(data)[offset];
        const uint64_t value = static_cast<const uint64_t*>(data)[offset];
        if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          throw InvalidArgument(n + "[" + std::to_string(i) + "] = " + std::to_string(value) +
                                " is out of range for a token id");
        }
        return static_cast<int64_t>(value);
      }
      default:
        throw InvalidArgument(n + " has unsupported integer width " + dtype_of(t.dtype));
    }
  };
  for (size_t i = 0; i < count; ++i) ids.owned_[i] = read(i);
  ids.i64_ = ids.owned_;
  return ids;
}

namespace {

[[noreturn]] void throw_out_of_range(nb::handle item, const char* name, Py_ssize_t i) {
  throw InvalidArgument(std::string(name) + "[" + std::to_string(i) + "] = " + repr_of(item) +
                        " is out of the 64-bit range");
}

/// The ints of a list that holds only exact ints, read in place; nullopt as soon as an item is
/// anything else. Token lists take this path: nothing in the loop calls into Python (no
/// __index__, no allocation that could run a finalizer), so the list cannot change under the
/// raw item pointer while it is read.
std::optional<std::vector<int64_t>> exact_int_list(PyObject* list, const char* name) {
  const Py_ssize_t count = PyList_GET_SIZE(list);
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* item = PyList_GET_ITEM(list, i);
    if (!PyLong_CheckExact(item)) return std::nullopt;
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(item, &overflow);  // no Python code
    if (overflow != 0) {
      // repr allocates: hold the item first, in case that runs code that empties the list.
      throw_out_of_range(nb::borrow(item), name, i);
    }
    out[static_cast<size_t>(i)] = value;
  }
  return out;
}

}  // namespace

std::vector<int64_t> int_list_from(nb::handle obj, const char* name) {
  if (PyList_Check(obj.ptr())) {
    if (std::optional<std::vector<int64_t>> ints = exact_int_list(obj.ptr(), name)) {
      return std::move(*ints);
    }
  } else if (!PyTuple_Check(obj.ptr()) && !PySequence_Check(obj.ptr()) &&
             !nb::hasattr(obj, "__iter__")) {
    throw InvalidArgument(std::string(name) + " must be a sequence of ints, got " +
                          py_type_name(obj) + " " + repr_of(obj));
  }
  // Anything else is read from a snapshot that holds every item: __index__ (NumPy integers, any
  // object) and repr run Python code, which may change or empty the list.
  const nb::object items = owned_items(obj);
  if (!items.is_valid()) throw nb::python_error();
  const Py_ssize_t count = PyTuple_GET_SIZE(items.ptr());
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* item = PyTuple_GET_ITEM(items.ptr(), i);  // alive as long as `items`
    if (PyBool_Check(item) || !PyIndex_Check(item)) {
      throw InvalidArgument(std::string(name) + "[" + std::to_string(i) + "] = " + repr_of(item) +
                            " is not an integer");
    }
    int overflow = 0;
    long long value = 0;
    if (PyLong_Check(item)) {
      value = PyLong_AsLongLongAndOverflow(item, &overflow);  // ints and int subclasses: no call
    } else {
      const nb::object index = nb::steal(PyNumber_Index(item));  // a non-int with __index__
      if (!index.is_valid()) throw nb::python_error();
      value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    }
    if (overflow != 0) throw_out_of_range(item, name, i);
    out[static_cast<size_t>(i)] = value;
  }
  return out;
}

ArrayKind array_kind_from(nb::handle like) {
  if (like.is_none()) return ArrayKind::kDefault;
  if (nb::isinstance<nb::str>(like)) {
    std::string text = nb::cast<std::string>(like);
    if (text == "numpy") return ArrayKind::kNumpy;
    if (text == "torch") return ArrayKind::kTorch;
  }
  throw InvalidArgument("like must be None, \"torch\" or \"numpy\", got " + repr_of(like));
}

namespace {

bool torch_importable() {
  static const bool importable = [] {
    try {
      nb::module_::import_("torch");
      return true;
    } catch (const nb::python_error&) {
      return false;
    }
  }();
  return importable;
}

}  // namespace

nb::object export_tensor(HostTensor&& tensor, ArrayKind kind) {
  auto owned = std::make_unique<HostTensor>(std::move(tensor));
  float* data = owned->data();
  const size_t rows = static_cast<size_t>(owned->rows());
  const size_t cols = static_cast<size_t>(owned->cols());
  nb::capsule owner(owned.get(), [](void* p) noexcept {
    std::unique_ptr<HostTensor> release(static_cast<HostTensor*>(p));
  });
  (void)owned.release();  // the capsule owns it now
  if (kind == ArrayKind::kDefault)
    kind = torch_importable() ? ArrayKind::kTorch : ArrayKind::kNumpy;
  if (kind == ArrayKind::kTorch) {
    return nb::ndarray<nb::pytorch, float, nb::ndim<2>, nb::c_contig>(data, {rows, cols}, owner)
        .cast();
  }
  return nb::ndarray<nb::numpy, float, nb::ndim<2>, nb::c_contig>(data, {rows, cols}, owner).cast();
}

void bind_tensor(nb::module_& m) {
  m.def(
      "_roundtrip_tensor",
      [](nb::handle obj) {
        BorrowedTensor t = borrow_tensor(obj, "tensor");
        return nb::make_tuple(t.view.rows, t.view.cols, t.view.stride(),
                              std::string(to_string(t.view.dtype)),
                              std::string(to_string(t.view.device)));
      },
      nb::arg("tensor"),
      "Test helper: how hsstore sees a tensor (rows, cols, stride, dtype, device).");
}

}  // namespace hss::python
