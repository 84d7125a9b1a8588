// hsstore.HiddenStateStore: LMCache's HiddenStateStore API over hss::HiddenStateStore, plus the
// C++ API's extras (row_begin, retrieve_layers, retrieve_hidden_states_into, coverage, stats).
// Arguments are converted with the GIL held; the C++ call itself runs with the GIL released.
#include <Python.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "batch_py.hpp"
#include "bindings.hpp"
#include "config_source.hpp"
#include "hss/activation.hpp"
#include "hss/detail/stats_fields.hpp"
#include "hss/error.hpp"
#include "hss/local_cpu_backend.hpp"
#include "keys_io.hpp"
#include "store_py.hpp"
#include "tensor_io.hpp"

namespace hss::python {

PyStorageManager::PyStorageManager(nb::object manager)
    : manager_(std::move(manager)), contains_(manager_.attr("contains")) {}

PyStorageManager::~PyStorageManager() {
  nb::gil_scoped_acquire gil;
  contains_.reset();
  manager_.reset();
}

bool PyStorageManager::contains(const hss::CacheEngineKey& key) const {
  nb::gil_scoped_acquire gil;
  nb::object result = contains_(nb::cast(key));
  const int truth = PyObject_IsTrue(result.ptr());
  if (truth < 0) throw nb::python_error();
  return truth == 1;
}

int PyStorageManager::traverse(visitproc visit, void* arg) const {
  Py_VISIT(manager_.ptr());
  Py_VISIT(contains_.ptr());
  return 0;
}

int store_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  const auto* s = nb::inst_ptr<PyHiddenStateStore>(self);
  Py_VISIT(s->token_database_object.ptr());
  Py_VISIT(s->bound_object.ptr());
  for (const nb::object& backend : s->kv_backends) Py_VISIT(backend.ptr());
  for (const auto& manager : s->managers) {
    if (int rc = manager->traverse(visit, arg)) return rc;
  }
  return 0;
}

int store_clear(PyObject* self) {
  if (!nb::inst_ready(self)) return 0;
  auto* s = nb::inst_ptr<PyHiddenStateStore>(self);
  // Unreachable: no call is in flight, so the managers can go (unbound first).
  if (s->store != nullptr) s->store->bind_storage_manager(nullptr);
  s->managers.clear();
  s->kv_backends.clear();
  s->bound_object.reset();
  // The token database stays: the C++ store holds a reference to it until the store dies.
  return 0;
}

void PyHiddenStateStore::bind(nb::handle manager) {
  if (manager.is_none()) {
    store->bind_storage_manager(nullptr);
    bound_object = nb::none();
    return;
  }
  if (nb::isinstance<hss::LocalCpuBackend>(manager)) {
    // Held until the store dies (store_py.hpp): the C++ store has only the raw pointer, and a
    // call on another thread may still be inside its contains() after the next bind.
    const bool held = std::ranges::any_of(
        kv_backends, [&](const nb::object& backend) { return backend.is(manager); });
    if (!held) kv_backends.push_back(nb::borrow(manager));
    store->bind_storage_manager(&nb::cast<hss::LocalCpuBackend&>(manager));
    bound_object = nb::borrow(manager);
    return;
  }
  if (!nb::hasattr(manager, "contains")) {
    throw InvalidArgument(
        "storage_manager must be None, an hsstore KV backend or an object with "
        "contains(key, search_range=None, pin=False), got " +
        nb::cast<std::string>(nb::repr(manager)));
  }
  managers.push_back(std::make_unique<PyStorageManager>(nb::borrow(manager)));
  store->bind_storage_manager(managers.back().get());
  bound_object = nb::borrow(manager);
}

namespace {

hss::HiddenStateStore& live(PyHiddenStateStore& s) { return *s.store; }

// stats() as a dict, built from the stats structs' field lists (hss/detail/stats_fields.hpp): no
// field is named here, and a field's Python value follows its C++ shape.
template <class T>
nb::object stats_value(const T& value);

template <hss::detail::HasFieldList Stats>
nb::dict stats_dict(const Stats& stats) {
  nb::dict d;
  for_each_field(stats,
                 [&d](const char* name, const auto& field) { d[name] = stats_value(field); });
  return d;
}

template <class T>
nb::object stats_value(const T& value) {
  if constexpr (hss::detail::HasFieldList<T>) {
    return stats_dict(value);
  } else if constexpr (hss::detail::PerKindField<T>) {
    nb::dict d;
    for (int k = 0; k < hss::kNumActivationKinds; ++k) {
      const std::string_view kind = hss::to_string(static_cast<hss::ActivationKind>(k));
      d[nb::str(kind.data(), kind.size())] = stats_value(value[static_cast<size_t>(k)]);
    }
    return d;
  } else if constexpr (hss::detail::ListField<T>) {
    nb::list list;
    for (const auto& item : value) list.append(stats_value(item));
    return list;
  } else if constexpr (std::is_enum_v<T>) {
    const std::string_view text = to_string(value);
    return nb::str(text.data(), text.size());
  } else {
    static_assert(std::is_arithmetic_v<T> || std::is_same_v<T, std::string>,
                  "a stats field is a number, bool, string, enum, struct, per-kind array or list "
                  "(hss/detail/stats_fields.hpp)");
    return nb::cast(value);
  }
}

}  // namespace

hss::ActivationKind kind_from(nb::handle kind) {
  if (nb::isinstance<hss::ActivationKind>(kind)) return nb::cast<hss::ActivationKind>(kind);
  if (nb::isinstance<nb::str>(kind)) {
    if (auto k = hss::activation_kind_from_string(nb::cast<std::string>(kind))) return *k;
  }
  throw InvalidArgument(
      "kind must be an hsstore.ActivationKind or one of 'hidden', 'query', 'key', 'value', "
      "'mlp_intermediate', got " +
      nb::cast<std::string>(nb::repr(kind)));
}

// Layer indices (kind hidden) or (kind, layer) tuples, mixed freely.
std::vector<hss::Slot> slots_from(nb::handle items, const char* name) {
  // A snapshot holding every item: __index__ and repr of an item may change a list.
  const nb::object seq = owned_items(items);
  if (!seq.is_valid()) {
    PyErr_Clear();
    throw InvalidArgument(std::string(name) +
                          " must be a list of layer indices or (kind, layer) "
                          "tuples, got " +
                          nb::cast<std::string>(nb::repr(items)));
  }
  const Py_ssize_t count = PyTuple_GET_SIZE(seq.ptr());
  std::vector<hss::Slot> slots;
  slots.reserve(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    const nb::handle item(PyTuple_GET_ITEM(seq.ptr(), i));
    const std::string where = std::string(name) + "[" + std::to_string(i) + "]";
    if (PyTuple_Check(item.ptr()) && nb::len(item) == 2) {
      const int64_t layer = int_list_from(nb::make_tuple(item[1]), where.c_str())[0];
      slots.push_back(hss::Slot{kind_from(item[0]), layer});
    } else {
      slots.push_back(hss::Slot{hss::ActivationKind::kHidden,
                                int_list_from(nb::make_tuple(item), where.c_str())[0]});
    }
  }
  return slots;
}

std::vector<hss::Chunk> chunks_for(PyHiddenStateStore& s, nb::handle tokens_or_chunks,
                                   const char* name) {
  // A list whose first element is a tuple: caller-computed chunks; otherwise token ids.
  if ((PyList_Check(tokens_or_chunks.ptr()) || PyTuple_Check(tokens_or_chunks.ptr())) &&
      nb::len(tokens_or_chunks) > 0 && PyTuple_Check(tokens_or_chunks[0].ptr())) {
    return chunks_from(tokens_or_chunks, name);
  }
  BorrowedTokenIds ids = token_ids_from(tokens_or_chunks, name);
  nb::gil_scoped_release release;
  return ids.visit([&](auto span) { return s.token_database->process_tokens(span); });
}

namespace {

hss::Stream as_stream(void* stream) { return static_cast<hss::Stream>(stream); }

}  // namespace

void bind_store(nb::module_& m) {
  auto coverage_scope =
      nb::enum_<hss::CoverageScope>(m, "CoverageScope",
                                    "What coverage() counts: the local pool, or the pool and "
                                    "every backing tier.")
          .value("local", hss::CoverageScope::kLocal)
          .value("all_tiers", hss::CoverageScope::kAllTiers);
  // The older name, deprecated: an alias of all_tiers the way Python's enum makes one (the same
  // member, listed in __members__), so code that passes it keeps working.
  const nb::object all_tiers = coverage_scope.attr("all_tiers");
  nb::setattr(coverage_scope, "local_and_remote", all_tiers);
  coverage_scope.attr("_member_map_")["local_and_remote"] = all_tiers;

  nb::enum_<hss::ActivationKind>(m, "ActivationKind",
                                 "What a cached activation is; kind= also takes the name.")
      .value("hidden", hss::ActivationKind::kHidden)
      .value("query", hss::ActivationKind::kQuery)
      .value("key", hss::ActivationKind::kKey)
      .value("value", hss::ActivationKind::kValue)
      .value("mlp_intermediate", hss::ActivationKind::kMlpIntermediate);

  static PyType_Slot store_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(store_traverse)},
                                      {Py_tp_clear, reinterpret_cast<void*>(store_clear)},
                                      {0, nullptr}};
  nb::class_<PyHiddenStateStore>(
      m, "HiddenStateStore",
      "Per-chunk hidden-state cache beside the KV cache (LMCache's HiddenStateStore API). "
      "Thread-safe; every call releases the GIL while it copies, hashes or waits.",
      nb::type_slots(store_slots))
      .def(
          "__init__",
          [](PyHiddenStateStore* self, nb::handle config, nb::handle token_database) {
            if (!nb::isinstance<hss::TokenDatabase>(token_database)) {
              throw InvalidArgument("token_database must be an hsstore.ChunkedTokenDatabase, got " +
                                    nb::cast<std::string>(nb::repr(token_database)));
            }
            const hss::Config c = config_from(config);
            const auto& db = nb::cast<const hss::TokenDatabase&>(token_database);
            auto store = std::make_shared<hss::HiddenStateStore>(c, db);
            new (self) PyHiddenStateStore{};
            self->store = store.get();
            self->owner = std::move(store);
            self->token_database = &db;
            self->token_database_object = nb::borrow(token_database);
          },
          nb::arg("config").none(), nb::arg("token_database").none())
      .def(
          "bind_storage_manager",
          [](PyHiddenStateStore& s, nb::handle manager) { s.bind(manager); },
          nb::arg("storage_manager").none(),
          "Binds the KV side: an object with contains(key, search_range=None, pin=False) "
          "(truthy = KV present), an hsstore KV backend, or None (KV treated as present).")
      .def_prop_ro("storage_manager", [](PyHiddenStateStore& s) { return s.bound_object; })
      .def(
          "store_hidden_states",
          [](PyHiddenStateStore& s, nb::handle token_ids, nb::handle hidden_states,
             int64_t layer_idx, int64_t token_offset, nb::handle kind) {
            BorrowedTokenIds ids = token_ids_from(token_ids, "token_ids");
            BorrowedTensor hs = borrow_tensor(hidden_states, "hidden_states");
            const hss::StoreOptions options{layer_idx, token_offset, kind_from(kind),
                                            as_stream(hs.stream)};
            nb::gil_scoped_release release;
            return live(s).store_hidden_states(ids.view(), hs.view.as_const(), options).written;
          },
          nb::arg("token_ids").none(), nb::arg("hidden_states").none(), nb::kw_only(),
          nb::arg("layer_idx") = 0, nb::arg("token_offset") = 0, nb::arg("kind") = "hidden",
          "Stores rows of hidden_states ([len(token_ids) - token_offset, hidden_dim], float32, "
          "float16 or bfloat16, CPU or CUDA, read zero-copy) for the chunks starting at or after "
          "token_offset. Returns the chunks newly written (LMCache's number).")
      .def(
          "store_chunks",
          [](PyHiddenStateStore& s, nb::handle chunks, nb::handle hidden_states, int64_t layer_idx,
             int64_t token_offset, nb::handle kind) {
            std::vector<hss::Chunk> list = chunks_from(chunks, "chunks");
            BorrowedTensor hs = borrow_tensor(hidden_states, "hidden_states");
            const hss::StoreOptions options{layer_idx, token_offset, kind_from(kind),
                                            as_stream(hs.stream)};
            nb::gil_scoped_release release;
            return live(s).store_chunks(list, hs.view.as_const(), options).written;
          },
          nb::arg("chunks").none(), nb::arg("hidden_states").none(), nb::kw_only(),
          nb::arg("layer_idx") = 0, nb::arg("token_offset") = 0, nb::arg("kind") = "hidden",
          "store_hidden_states with caller-computed (start, end, key) chunks, contiguous from 0; "
          "hidden_states has chunks[-1][1] - token_offset rows.")
      .def(
          "retrieve_hidden_states",
          [](PyHiddenStateStore& s, nb::handle token_ids, int64_t layer_idx, int64_t row_begin,
             nb::handle kind, nb::handle like) -> nb::object {
            BorrowedTokenIds ids = token_ids_from(token_ids, "token_ids");
            const ArrayKind array_kind = array_kind_from(like);
            const hss::RetrieveOptions options{layer_idx, row_begin, kind_from(kind), nullptr};
            std::optional<hss::HostTensor> out;
            {
              nb::gil_scoped_release release;
              out = live(s).retrieve_hidden_states(ids.view(), options);
            }
            if (!out) return nb::none();
            return export_tensor(std::move(*out), array_kind);
          },
          nb::arg("token_ids").none(), nb::kw_only(), nb::arg("layer_idx") = 0,
          nb::arg("row_begin") = 0, nb::arg("kind") = "hidden", nb::arg("like").none() = nb::none(),
          "The cached prefix as a float32 [rows, hidden_dim] tensor (torch when importable, "
          "NumPy otherwise or with like='numpy'), zero-copy over the C++ result; None on a miss.")
      .def(
          "retrieve_chunks",
          [](PyHiddenStateStore& s, nb::handle chunks, int64_t layer_idx, int64_t row_begin,
             nb::handle kind, nb::handle like) -> nb::object {
            std::vector<hss::Chunk> list = chunks_from(chunks, "chunks");
            const ArrayKind array_kind = array_kind_from(like);
            const hss::RetrieveOptions options{layer_idx, row_begin, kind_from(kind), nullptr};
            std::optional<hss::HostTensor> out;
            {
              nb::gil_scoped_release release;
              out = live(s).retrieve_chunks(list, options);
            }
            if (!out) return nb::none();
            return export_tensor(std::move(*out), array_kind);
          },
          nb::arg("chunks").none(), nb::kw_only(), nb::arg("layer_idx") = 0,
          nb::arg("row_begin") = 0, nb::arg("kind") = "hidden", nb::arg("like").none() = nb::none(),
          "retrieve_hidden_states with caller-computed (start, end, key) chunks.")
      .def(
          "retrieve_hidden_states_into",
          [](PyHiddenStateStore& s, nb::handle token_ids, nb::handle out, int64_t layer_idx,
             int64_t row_begin, nb::handle kind) {
            BorrowedTokenIds ids = token_ids_from(token_ids, "token_ids");
            BorrowedTensor dst = borrow_tensor(out, "out", Access::kWrite);
            const hss::RetrieveOptions options{layer_idx, row_begin, kind_from(kind),
                                               as_stream(dst.stream)};
            nb::gil_scoped_release release;
            return live(s).retrieve_hidden_states_into(ids.view(), dst.view, options);
          },
          nb::arg("token_ids").none(), nb::arg("out").none(), nb::kw_only(),
          nb::arg("layer_idx") = 0, nb::arg("row_begin") = 0, nb::arg("kind") = "hidden",
          "Writes the cached prefix into out (float32, float16 or bfloat16, CPU or CUDA); returns "
          "the "
          "rows written.")
      .def("store_batch", &store_batch, nb::arg("items"),
           "An engine step as one call: items are tuples (token_ids, hidden_states[, layer_idx[, "
           "token_offset[, kind]]]). Returns the chunks newly written per item, as "
           "store_hidden_states would in item order. One key pass per distinct token_ids object, "
           "one index lock, one device launch per CUDA stream. A bad item raises "
           "InvalidArgument naming items[i], and nothing is stored.")
      .def("retrieve_batch_into", &retrieve_batch_into, nb::arg("items"),
           "Batched retrieve_hidden_states_into: items are tuples (token_ids, out[, layer_idx[, "
           "row_begin[, kind]]]). Returns the rows written per item. A bad item raises "
           "InvalidArgument naming items[i], and nothing is written.")
      .def(
          "retrieve_layers",
          [](PyHiddenStateStore& s, nb::handle token_ids, nb::handle layer_idxs, int64_t row_begin,
             nb::handle like) {
            BorrowedTokenIds ids = token_ids_from(token_ids, "token_ids");
            std::vector<hss::Slot> slots = slots_from(layer_idxs, "layer_idxs");
            const ArrayKind array_kind = array_kind_from(like);
            std::vector<hss::HostTensor> tensors;
            {
              nb::gil_scoped_release release;
              tensors =
                  live(s).retrieve_layers(ids.view(), std::span<const hss::Slot>(slots), row_begin);
            }
            nb::list result;
            for (hss::HostTensor& t : tensors) {
              result.append(export_tensor(std::move(t), array_kind));
            }
            return result;
          },
          nb::arg("token_ids").none(), nb::arg("layer_idxs").none(), nb::kw_only(),
          nb::arg("row_begin") = 0, nb::arg("like").none() = nb::none(),
          "All-or-nothing restore of several slots (layer indices, or (kind, layer) tuples): one "
          "tensor each, all with the same rows; [] when no prefix has every slot.")
      .def(
          "retrieve_layers_into",
          [](PyHiddenStateStore& s, nb::handle tokens_or_chunks, nb::handle layer_idxs,
             nb::handle outs, int64_t row_begin) {
            std::vector<hss::Chunk> chunks = chunks_for(s, tokens_or_chunks, "token_ids");
            std::vector<hss::Slot> slots = slots_from(layer_idxs, "layer_idxs");
            // A snapshot holding every tensor: borrowing one runs Python code (__dlpack__),
            // which may change a list of them.
            const nb::object seq = owned_items(outs);
            if (!seq.is_valid()) {
              PyErr_Clear();
              throw InvalidArgument("outs must be a list of tensors, one per layer, got " +
                                    nb::cast<std::string>(nb::repr(outs)));
            }
            const Py_ssize_t count = PyTuple_GET_SIZE(seq.ptr());
            std::vector<BorrowedTensor> borrowed;
            borrowed.reserve(static_cast<size_t>(count));
            std::vector<hss::MutableTensorView> views;
            for (Py_ssize_t i = 0; i < count; ++i) {
              const std::string name = "outs[" + std::to_string(i) + "]";
              borrowed.push_back(
                  borrow_tensor(PyTuple_GET_ITEM(seq.ptr(), i), name.c_str(), Access::kWrite));
              views.push_back(borrowed.back().view);
            }
            // One stream orders every device output: the first one's (torch's current stream).
            const hss::RetrieveLayersOptions options{
                row_begin, borrowed.empty() ? nullptr : as_stream(borrowed.front().stream)};
            nb::gil_scoped_release release;
            return live(s).retrieve_layers_into(
                std::span<const hss::Chunk>(chunks), std::span<const hss::Slot>(slots),
                std::span<const hss::MutableTensorView>(views), options);
          },
          nb::arg("token_ids").none(), nb::arg("layer_idxs").none(), nb::arg("outs").none(),
          nb::kw_only(), nb::arg("row_begin") = 0,
          "retrieve_layers into caller tensors (token ids or (start, end, key) chunks): outs[i] "
          "(CPU or CUDA; float32, float16 or bfloat16) receives rows [row_begin, prefix end) of "
          "layer_idxs[i], all or nothing. Returns the rows written to each (0 on a miss).")
      .def(
          "coverage",
          [](PyHiddenStateStore& s, nb::handle tokens_or_chunks, nb::handle layer_idxs,
             hss::CoverageScope scope) {
            std::vector<hss::Chunk> chunks = chunks_for(s, tokens_or_chunks, "token_ids");
            std::vector<hss::Slot> slots = slots_from(layer_idxs, "layer_idxs");
            nb::gil_scoped_release release;
            return live(s).coverage(chunks, std::span<const hss::Slot>(slots), scope);
          },
          nb::arg("token_ids").none(), nb::arg("layer_idxs") = std::vector<int64_t>{0},
          nb::kw_only(), nb::arg("scope") = hss::CoverageScope::kLocal,
          "Tokens of the prefix retrieve_layers would return (token ids or (start, end, key) "
          "chunks). scope=CoverageScope.all_tiers also counts what the backing tiers hold (each "
          "asked in retrieve order, for what the ones before it lack). Changes nothing.")
      .def(
          "coverage_by_tier",
          [](PyHiddenStateStore& s, nb::handle tokens_or_chunks, nb::handle layer_idxs) {
            std::vector<hss::Chunk> chunks = chunks_for(s, tokens_or_chunks, "token_ids");
            std::vector<hss::Slot> slots = slots_from(layer_idxs, "layer_idxs");
            hss::TierCoverage found;
            {
              nb::gil_scoped_release release;
              found = live(s).coverage_by_tier(chunks, std::span<const hss::Slot>(slots));
            }
            return nb::make_tuple(found.tokens, found.chunk_tiers);
          },
          nb::arg("token_ids").none(), nb::arg("layer_idxs") = std::vector<int64_t>{0},
          "(tokens, tiers): coverage(..., scope=CoverageScope.all_tiers) and, per chunk of "
          "that prefix, the tier a retrieve reads it from: 'host' (the pool holds every slot), "
          "else the slowest tier it promotes a slot from ('disk', 'remote'). Changes nothing.")
      .def(
          "has_chunk",
          [](PyHiddenStateStore& s, const hss::CacheEngineKey& key, int64_t layer_idx,
             nb::handle kind) { return live(s).has_chunk(key, layer_idx, kind_from(kind)); },
          nb::arg("key"), nb::arg("layer_idx") = 0, nb::kw_only(), nb::arg("kind") = "hidden")
      .def(
          "drop_key",
          [](PyHiddenStateStore& s, const hss::CacheEngineKey& key) {
            return live(s).drop_key(key);
          },
          nb::arg("key"), "Drops every slot of the key (KV untouched). True if something was held.")
      .def(
          "num_cached_chunks", [](PyHiddenStateStore& s) { return live(s).num_cached_chunks(); },
          "Distinct chunk keys held (as LMCache counts).")
      .def(
          "num_entries", [](PyHiddenStateStore& s) { return live(s).num_entries(); },
          "(key, kind, layer) entries held.")
      .def(
          "lru_keys", [](PyHiddenStateStore& s) { return live(s).lru_keys(); },
          "Keys from least to most recently used (tests, admin tools).")
      .def(
          "evict_one_lru",
          [](PyHiddenStateStore& s) {
            nb::gil_scoped_release release;
            return live(s).evict_one_lru();
          },
          "Evicts the least recently used key as pool pressure would; False if none.")
      .def(
          "check_invariants",
          [](PyHiddenStateStore& s) {
            nb::gil_scoped_release release;
            live(s).check_invariants();
          },
          "Debug: raises hsstore.Error naming the first broken index/pool invariant.")
      .def(
          "flush",
          [](PyHiddenStateStore& s) {
            nb::gil_scoped_release release;
            live(s).flush();
          },
          "Waits for every pending device-to-host copy.")
      .def(
          "close",
          [](PyHiddenStateStore& s) {
            nb::gil_scoped_release release;
            live(s).close();
          },
          "Frees every cached chunk; later stores/retrieves raise hsstore.Error. Idempotent.")
      .def("stats", [](PyHiddenStateStore& s) { return stats_dict(live(s).stats()); })
      .def_prop_ro(
          "config", [](PyHiddenStateStore& s) { return live(s).config(); },
          "The Config this store runs with (a copy): the one given, with the HSS_* debugging "
          "variables applied, so config.to_yaml() shows what is in effect.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def(
          "__exit__",
          [](PyHiddenStateStore& s, nb::handle, nb::handle, nb::handle) {
            nb::gil_scoped_release release;
            live(s).close();
          },
          nb::arg("exc_type").none(), nb::arg("exc").none(), nb::arg("tb").none());
}

}  // namespace hss::python
