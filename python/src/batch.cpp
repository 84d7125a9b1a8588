#include "batch_py.hpp"

#include <Python.h>
#include <nanobind/stl/string.h>  // every TU casting std::string needs it: one caster (ODR)

#include <deque>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "hss/error.hpp"
#include "tensor_io.hpp"

namespace hss::python {

namespace {

/// Token ids of a batch at their own width (no copy), borrowed once per distinct Python object,
/// so items of one request (its layers) pass the same ids and share the C++ key pass.
class TokenCache {
 public:
  hss::TokenIds ids_of(PyObject* obj) {
    if (auto it = by_object_.find(obj); it != by_object_.end()) return it->second;
    BorrowedTokenIds& ids = ids_.emplace_back(token_ids_from(obj, "token_ids"));
    const hss::TokenIds view = ids.visit([](auto s) { return hss::TokenIds(s); });
    by_object_.emplace(obj, view);
    return view;
  }

 private:
  std::deque<BorrowedTokenIds> ids_;
  std::unordered_map<PyObject*, hss::TokenIds> by_object_;
};

/// Tensors of a batch, borrowed once per distinct Python object.
class TensorCache {
 public:
  TensorCache(const char* name, Access access) : name_(name), access_(access) {}
  const BorrowedTensor& borrow(PyObject* obj) {
    if (auto it = by_object_.find(obj); it != by_object_.end()) return *it->second;
    const BorrowedTensor& t = tensors_.emplace_back(borrow_tensor(obj, name_, access_));
    by_object_.emplace(obj, &t);
    return t;
  }

 private:
  const char* name_;
  Access access_;
  std::deque<BorrowedTensor> tensors_;
  std::unordered_map<PyObject*, const BorrowedTensor*> by_object_;
};

/// An int field of an item: Python ints directly, anything else through int_list_from.
int64_t int_field(PyObject* value, const char* name) {
  if (PyLong_CheckExact(value)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow == 0 && !(v == -1 && PyErr_Occurred())) return v;
    PyErr_Clear();
  }
  return int_list_from(nb::make_tuple(nb::handle(value)), name).front();
}

/// The fields of one item tuple: (token_ids, tensor[, layer_idx[, offset[, kind]]]).
struct ItemFields {
  PyObject* tokens = nullptr;
  PyObject* tensor = nullptr;
  int64_t layer_idx = 0;
  int64_t offset = 0;  // token_offset (store) or row_begin (retrieve)
  hss::ActivationKind kind = hss::ActivationKind::kHidden;
};

ItemFields fields_of(PyObject* item, const char* offset_name) {
  const bool sequence = PyTuple_Check(item) || PyList_Check(item);
  const Py_ssize_t n = sequence ? PySequence_Fast_GET_SIZE(item) : 0;
  if (n < 2 || n > 5) {
    throw InvalidArgument(std::string("must be a tuple (token_ids, tensor[, layer_idx[, ") +
                          offset_name + "[, kind]]]), got " +
                          nb::cast<std::string>(nb::repr(nb::handle(item))));
  }
  PyObject** f = PySequence_Fast_ITEMS(item);  // tuples and lists: no new references
  ItemFields out{f[0], f[1]};
  if (n > 2) out.layer_idx = int_field(f[2], "layer_idx");
  if (n > 3) out.offset = int_field(f[3], offset_name);
  if (n > 4) out.kind = kind_from(f[4]);
  return out;
}

/// The items as a sequence, with "items" named in the error otherwise.
nb::object sequence_of(nb::handle items) {
  nb::object seq = nb::steal(PySequence_Fast(items.ptr(), "not a sequence"));
  if (!seq.is_valid()) {
    PyErr_Clear();
    throw InvalidArgument("items must be a list of tuples, got " +
                          nb::cast<std::string>(nb::repr(items)));
  }
  return seq;
}

/// Runs `parse`, naming the item in an InvalidArgument ("items[i]: ...", the message built only
/// on failure).
template <typename Fn>
void parse_item(size_t i, Fn&& parse) {
  try {
    parse();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("items[" + std::to_string(i) + "]: " + e.what());
  }
}

}  // namespace

nb::list store_batch(PyHiddenStateStore& s, nb::handle items) {
  nb::object seq = sequence_of(items);
  const auto count = static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr()));
  PyObject** entries = PySequence_Fast_ITEMS(seq.ptr());
  TokenCache tokens;
  TensorCache tensors("hidden_states", Access::kRead);
  std::vector<hss::StoreItem> batch(count);
  for (size_t i = 0; i < count; ++i) {
    parse_item(i, [&] {
      const ItemFields f = fields_of(entries[i], "token_offset");
      const BorrowedTensor& hs = tensors.borrow(f.tensor);
      batch[i] = {tokens.ids_of(f.tokens),
                  hs.view.as_const(),
                  {f.layer_idx, f.offset, f.kind, static_cast<hss::Stream>(hs.stream)}};
    });
  }
  std::vector<hss::StoreResult> results;
  {
    nb::gil_scoped_release release;
    results = s.store->store_batch(batch);
  }
  nb::list written;
  for (const hss::StoreResult& r : results) written.append(r.written);
  return written;
}

nb::list retrieve_batch_into(PyHiddenStateStore& s, nb::handle items) {
  nb::object seq = sequence_of(items);
  const auto count = static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr()));
  PyObject** entries = PySequence_Fast_ITEMS(seq.ptr());
  TokenCache tokens;
  TensorCache outs("out", Access::kWrite);
  std::vector<hss::RetrieveItem> batch(count);
  for (size_t i = 0; i < count; ++i) {
    parse_item(i, [&] {
      const ItemFields f = fields_of(entries[i], "row_begin");
      const BorrowedTensor& out = outs.borrow(f.tensor);
      batch[i] = {tokens.ids_of(f.tokens),
                  out.view,
                  {f.layer_idx, f.offset, f.kind, static_cast<hss::Stream>(out.stream)}};
    });
  }
  std::vector<int64_t> rows;
  {
    nb::gil_scoped_release release;
    rows = s.store->retrieve_batch_into(batch);
  }
  nb::list result;
  for (const int64_t r : rows) result.append(r);
  return result;
}

}  // namespace hss::python
