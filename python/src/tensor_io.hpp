#pragma once
// Python tensors in and out of hsstore: DLPack import (zero-copy, with the CUDA stream
// handshake), token ids from lists / NumPy / torch, and HostTensor export as torch or NumPy
// arrays whose memory is the HostTensor itself.
//
// Everything here needs the GIL, except reading the spans and views of an imported object, which
// stay valid (the producer's buffer is kept alive) until the ImportedTensor or BorrowedTokenIds
// is destroyed.

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dlpack.hpp"
#include "hss/tensor.hpp"
#include "hss/token_ids.hpp"

namespace hss::python {

namespace nb = nanobind;

/// A consumed DLPack capsule: owns the producer's DLManagedTensor and calls its deleter on
/// destruction (with the GIL held, as producers expect).
class ImportedTensor {
 public:
  ImportedTensor() = default;
  explicit ImportedTensor(dlpack::ManagedTensor* managed) : managed_(managed) {}
  ImportedTensor(ImportedTensor&& other) noexcept
      : managed_(std::exchange(other.managed_, nullptr)) {}
  ImportedTensor& operator=(ImportedTensor&& other) noexcept {
    if (this != &other) {
      reset();
      managed_ = std::exchange(other.managed_, nullptr);
    }
    return *this;
  }
  ImportedTensor(const ImportedTensor&) = delete;
  ImportedTensor& operator=(const ImportedTensor&) = delete;
  ~ImportedTensor() { reset(); }

  [[nodiscard]] const dlpack::Tensor& tensor() const { return managed_->dl_tensor; }
  [[nodiscard]] void* data() const {
    return static_cast<char*>(managed_->dl_tensor.data) + managed_->dl_tensor.byte_offset;
  }

 private:
  void reset() noexcept;
  dlpack::ManagedTensor* managed_ = nullptr;
};

/// A Py_buffer held for as long as hsstore reads or writes through it: the buffer protocol only
/// promises buf stays valid until PyBuffer_Release, and the copy runs with the GIL released.
/// Heap-allocated so its address never changes (an exporter may keep it). Released, like an
/// ImportedTensor, with the GIL held.
class HeldBuffer {
 public:
  HeldBuffer() = default;
  /// Takes over `filled`, which PyObject_GetBuffer succeeded on.
  explicit HeldBuffer(std::unique_ptr<Py_buffer> filled) noexcept : buffer_(std::move(filled)) {}
  HeldBuffer(HeldBuffer&&) noexcept = default;
  HeldBuffer& operator=(HeldBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      buffer_ = std::move(other.buffer_);
    }
    return *this;
  }
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;
  ~HeldBuffer() { reset(); }

  [[nodiscard]] const Py_buffer& get() const { return *buffer_; }

 private:
  void reset() noexcept {
    if (buffer_) PyBuffer_Release(buffer_.get());
    buffer_.reset();
  }
  std::unique_ptr<Py_buffer> buffer_;
};

/// A 2-D float tensor borrowed from Python, plus the CUDA stream its data is ready on.
struct BorrowedTensor {
  ImportedTensor owner;
  HeldBuffer buffer;       ///< the NumPy array's buffer, when read through the buffer protocol
  nb::object keep_alive;   ///< the tensor itself, when read without DLPack (torch CPU fast path)
  MutableTensorView view;  ///< for input, use view.as_const()
  void* stream = nullptr;  ///< cudaStream_t for device tensors (null = legacy default stream)
};

/// Whether hsstore only reads a tensor (a store's input) or writes into it (a restore's output).
enum class Access { kRead, kWrite };

/// Imports a 2-D float32/float16/bfloat16 tensor through __dlpack__ (a strided CPU torch tensor is
/// read directly: data_ptr/shape/stride, without torch's ~3 us __dlpack__). `name` is the argument
/// name used in error messages (InvalidArgument). CUDA tensors: torch tensors are read on torch's
/// current stream (passed to __dlpack__ and returned in `stream`); other producers on the legacy
/// default stream. A read-only NumPy array is read through the buffer protocol for kRead and is
/// InvalidArgument for kWrite; tensors without data (torch's 'meta' device) and exports the
/// producer refuses are InvalidArgument naming `name`, never a BufferError or RuntimeError.
[[nodiscard]] BorrowedTensor borrow_tensor(nb::handle obj, const char* name,
                                           Access access = Access::kRead);

/// Token ids: 32- or 64-bit integers, borrowed from a NumPy/torch CPU tensor when possible, kept
/// alive by this object; view() is what the C++ API takes.
class BorrowedTokenIds {
 public:
  [[nodiscard]] size_t size() const { return is32_ ? i32_.size() : i64_.size(); }
  /// The ids at their own width (valid while this object lives).
  [[nodiscard]] hss::TokenIds view() const {
    return is32_ ? hss::TokenIds(i32_) : hss::TokenIds(i64_);
  }
  template <typename F>
  decltype(auto) visit(F&& f) const {
    return is32_ ? f(i32_) : f(i64_);
  }
  [[nodiscard]] std::vector<int64_t> to_vector() const;

  friend BorrowedTokenIds token_ids_from(nb::handle obj, const char* name);

 private:
  ImportedTensor owner_;
  nb::object keep_alive_;
  std::vector<int64_t> owned_;
  std::span<const int32_t> i32_;
  std::span<const int64_t> i64_;
  bool is32_ = false;
};

/// list/tuple/range of ints, 1-D integer NumPy array or 1-D integer CPU torch tensor (any object
/// with __dlpack__). Non-integers, other shapes and devices: InvalidArgument naming `name`.
[[nodiscard]] BorrowedTokenIds token_ids_from(nb::handle obj, const char* name);

/// A list of Python ints (layer indices, hashes, counts). InvalidArgument naming `name`.
/// A list of exact ints is read in place (nothing in that loop can run Python code); anything
/// else is read from a snapshot (owned_items), as __index__ may change the list.
[[nodiscard]] std::vector<int64_t> int_list_from(nb::handle obj, const char* name);

/// The items of a sequence or iterable as a tuple holding a reference to each (a tuple is
/// returned as it is: immutable, it keeps its items alive). Walk this, never a list's
/// PySequence_Fast_ITEMS, whenever the walk can run Python code (__index__, __dlpack__, repr, a
/// finalizer run by an allocation): that code may shrink or refill the list, freeing its item
/// array and the items. Invalid (a Python error set) when `obj` is not iterable or iterating it
/// raised.
[[nodiscard]] inline nb::object owned_items(nb::handle obj) {
  return nb::steal(PySequence_Tuple(obj.ptr()));
}

/// How retrieval results are returned: "torch" (default when torch imports), "numpy".
enum class ArrayKind { kDefault, kTorch, kNumpy };
[[nodiscard]] ArrayKind array_kind_from(nb::handle like);

/// Hands the tensor to Python without a copy: the array's memory is the HostTensor, freed when
/// the last Python reference dies.
[[nodiscard]] nb::object export_tensor(HostTensor&& tensor, ArrayKind kind);

}  // namespace hss::python
