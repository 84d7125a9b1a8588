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
/// so items of one request (its layers) pass the same ids and share the C++ key pass. Keyed by
/// address, so each entry holds its object: parsing later items runs Python code, and an object
/// freed meanwhile could have its address reused by another item's token list, which would then
/// be given these ids.
class TokenCache {
 public:
  hss::TokenIds ids_of(nb::handle obj) {
    if (auto it = by_object_.find(obj.ptr()); it != by_object_.end()) return it->second.ids;
    BorrowedTokenIds& ids = ids_.emplace_back(token_ids_from(obj, "token_ids"));
    const hss::TokenIds view = ids.visit([](auto s) { return hss::TokenIds(s); });
    by_object_.emplace(obj.ptr(), Entry{nb::borrow(obj), view});
    return view;
  }

 private:
  struct Entry {
    nb::object held;  ///< keeps the key's address from being reused during the call
    hss::TokenIds ids;
  };
  std::deque<BorrowedTokenIds> ids_;
  std::unordered_map<PyObject*, Entry> by_object_;
};

/// Tensors of a batch, borrowed once per distinct Python object (held, as in TokenCache).
class TensorCache {
 public:
  TensorCache(const char* name, Access access) : name_(name), access_(access) {}
  const BorrowedTensor& borrow(nb::handle obj) {
    if (auto it = by_object_.find(obj.ptr()); it != by_object_.end()) return *it->second.tensor;
    const BorrowedTensor& t = tensors_.emplace_back(borrow_tensor(obj, name_, access_));
    by_object_.emplace(obj.ptr(), Entry{nb::borrow(obj), &t});
    return t;
  }

 private:
  struct Entry {
    nb::object held;  ///< keeps the key's address from being reused during the call
    const BorrowedTensor* tensor;
  };
  const char* name_;
  Access access_;
  std::deque<BorrowedTensor> tensors_;
  std::unordered_map<PyObject*, Entry> by_object_;
};

/// An int field of an item: Python ints directly, anything else through int_list_from.
int64_t int_field(nb::handle value, const char* name) {
  if (PyLong_CheckExact(value.ptr())) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow == 0 && !(v == -1 && PyErr_Occurred())) return v;
    PyErr_Clear();
  }
  return int_list_from(nb::make_tuple(value), name).front();
}

/// The fields of one item tuple: (token_ids, tensor[, layer_idx[, offset[, kind]]]). The tensor
/// and token ids are held: converting the other fields may run Python code that drops them.
struct ItemFields {
  nb::object tokens;
  nb::object tensor;
  int64_t layer_idx = 0;
  int64_t offset = 0;  // token_offset (store) or row_begin (retrieve)
  hss::ActivationKind kind = hss::ActivationKind::kHidden;
};

ItemFields fields_of(nb::handle item, const char* offset_name) {
  if (!PyTuple_Check(item.ptr()) && !PyList_Check(item.ptr())) {
    throw InvalidArgument(std::string("must be a tuple (token_ids, tensor[, layer_idx[, ") +
                          offset_name + "[, kind]]]), got " +
                          nb::cast<std::string>(nb::repr(item)));
  }
  // A list item is read from a snapshot (a tuple as it is): the int and kind fields may run
  // Python code (__index__) that changes the list.
  const nb::object fields = owned_items(item);
  if (!fields.is_valid()) throw nb::python_error();
  const Py_ssize_t n = PyTuple_GET_SIZE(fields.ptr());
  if (n < 2 || n > 5) {
    throw InvalidArgument(std::string("must be a tuple (token_ids, tensor[, layer_idx[, ") +
                          offset_name + "[, kind]]]), got " +
                          nb::cast<std::string>(nb::repr(item)));
  }
  const auto field = [&](Py_ssize_t i) { return nb::handle(PyTuple_GET_ITEM(fields.ptr(), i)); };
  ItemFields out{nb::borrow(field(0)), nb::borrow(field(1))};
  if (n > 2) out.layer_idx = int_field(field(2), "layer_idx");
  if (n > 3) out.offset = int_field(field(3), offset_name);
  if (n > 4) out.kind = kind_from(field(4));
  return out;
}

/// The items as a tuple holding each one (parsing an item runs Python code, which may change a
/// list of items), with "items" named in the error otherwise.
nb::object sequence_of(nb::handle items) {
  nb::object seq = owned_items(items);
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
  const auto count = static_cast<size_t>(PyTuple_GET_SIZE(seq.ptr()));
  TokenCache tokens;
  TensorCache tensors("hidden_states", Access::kRead);
  std::vector<hss::StoreItem> batch(count);
  for (size_t i = 0; i < count; ++i) {
    parse_item(i, [&] {
      const ItemFields f =
          fields_of(PyTuple_GET_ITEM(seq.ptr(), static_cast<Py_ssize_t>(i)), "token_offset");
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
  const auto count = static_cast<size_t>(PyTuple_GET_SIZE(seq.ptr()));
  TokenCache tokens;
  TensorCache outs("out", Access::kWrite);
  std::vector<hss::RetrieveItem> batch(count);
  for (size_t i = 0; i < count; ++i) {
    parse_item(i, [&] {
      const ItemFields f =
          fields_of(PyTuple_GET_ITEM(seq.ptr(), static_cast<Py_ssize_t>(i)), "row_begin");
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
