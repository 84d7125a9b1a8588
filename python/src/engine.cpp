// hsstore.Engine (one worker's cache: config, token database, KV backend and, when enabled, the
// hidden-state store bound to it) and hsstore.LocalCpuBackend (the KV chunk store).
#include <Python.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>

#include "bindings.hpp"
#include "config_source.hpp"
#include "hss/engine.hpp"
#include "hss/error.hpp"
#include "hss/local_cpu_backend.hpp"
#include "keys_io.hpp"
#include "store_py.hpp"
#include "tensor_io.hpp"

namespace hss::python {

namespace {

struct PyEngine {
  std::shared_ptr<hss::Engine> engine;
  nb::object hidden_state_store;  ///< hsstore.HiddenStateStore over the engine's store, or None
};

int engine_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  Py_VISIT(nb::inst_ptr<PyEngine>(self)->hidden_state_store.ptr());
  return 0;
}

int engine_clear(PyObject* self) {
  if (nb::inst_ready(self)) nb::inst_ptr<PyEngine>(self)->hidden_state_store.reset();
  return 0;
}

nb::dict kv_stats_dict(const hss::KvStats& st) {
  nb::dict d;
  d["chunks_held"] = st.chunks_held;
  d["bytes_held"] = st.bytes_held;
  d["capacity_bytes"] = st.capacity_bytes;
  d["puts"] = st.puts;
  d["hits"] = st.hits;
  d["misses"] = st.misses;
  d["evictions"] = st.evictions;
  d["put_failures"] = st.put_failures;
  return d;
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<hss::LocalCpuBackend>(
      m, "LocalCpuBackend",
      "The KV chunk store (LMCache's LocalCPUBackend). Bind it to a HiddenStateStore to answer "
      "KV presence without calling back into Python.")
      .def(nb::init<uint64_t>(), nb::arg("capacity_bytes"))
      .def(
          "put",
          [](hss::LocalCpuBackend& kv, const hss::CacheEngineKey& key, nb::bytes data) {
            std::span<const std::byte> bytes(static_cast<const std::byte*>(data.data()),
                                             data.size());
            return kv.put(key, bytes);
          },
          nb::arg("key"), nb::arg("data"), "Stores a copy of data (bytes); False if it cannot fit.")
      .def(
          "contains",
          [](const hss::LocalCpuBackend& kv, const hss::CacheEngineKey& key, nb::handle, bool) {
            return kv.contains(key);
          },
          nb::arg("key"), nb::arg("search_range").none() = nb::none(), nb::arg("pin") = false)
      .def("remove", &hss::LocalCpuBackend::remove, nb::arg("key"))
      .def("keys_lru_order", &hss::LocalCpuBackend::keys_lru_order)
      .def("stats", [](const hss::LocalCpuBackend& kv) { return kv_stats_dict(kv.stats()); });

  static PyType_Slot engine_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(engine_traverse)},
                                       {Py_tp_clear, reinterpret_cast<void*>(engine_clear)},
                                       {0, nullptr}};
  nb::class_<PyEngine>(m, "Engine",
                       "One worker's cache: config, token database, KV backend and, when "
                       "enable_hidden_state_cache is set, the hidden-state store bound to it.",
                       nb::type_slots(engine_slots))
      .def(
          "__init__",
          [](PyEngine* self, nb::handle config, nb::handle metadata) {
            const hss::Config c = config_from(config);
            const hss::Metadata md = metadata_from(metadata);
            std::shared_ptr<hss::Engine> engine = hss::Engine::create(c, md);
            nb::object store = nb::none();
            if (hss::HiddenStateStore* hs = engine->hidden_state_store()) {
              PyHiddenStateStore wrapper;
              wrapper.owner = engine;
              wrapper.store = hs;
              wrapper.token_database = &engine->token_database();
              store = nb::cast(std::move(wrapper), nb::rv_policy::move);
            }
            new (self) PyEngine{std::move(engine), std::move(store)};
          },
          nb::arg("config") = nb::none(), nb::arg("metadata") = nb::none())
      .def_prop_ro(
          "hidden_state_store",
          [](PyEngine& e) -> nb::object {
            return e.hidden_state_store.is_valid() ? e.hidden_state_store : nb::none();
          },
          "The hidden-state store, or None when enable_hidden_state_cache is false.")
      .def_prop_ro("config", [](PyEngine& e) { return e.engine->config(); })
      .def_prop_ro("metadata", [](PyEngine& e) { return e.engine->metadata(); })
      .def_prop_ro(
          "token_database",
          [](PyEngine& e) -> const hss::ChunkedTokenDatabase& {
            return dynamic_cast<const hss::ChunkedTokenDatabase&>(e.engine->token_database());
          },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "kv_backend", [](PyEngine& e) -> hss::LocalCpuBackend& { return e.engine->kv_backend(); },
          nb::rv_policy::reference_internal)
      .def(
          "store",
          [](PyEngine& e, nb::handle tokens, nb::handle kv, int64_t token_offset) {
            BorrowedTokenIds ids = token_ids_from(tokens, "tokens");
            BorrowedTensor t = borrow_tensor(kv, "kv");
            nb::gil_scoped_release release;
            return e.engine->store(ids.view(), t.view.as_const(), token_offset);
          },
          nb::arg("tokens").none(), nb::arg("kv").none(), nb::arg("token_offset") = 0,
          "Stores KV rows (host tensor [len(tokens) - token_offset, width]); returns the chunks "
          "of that range held after the call.")
      .def(
          "retrieve",
          [](PyEngine& e, nb::handle tokens, nb::handle kv_out) {
            BorrowedTokenIds ids = token_ids_from(tokens, "tokens");
            BorrowedTensor t = borrow_tensor(kv_out, "kv_out", Access::kWrite);
            nb::gil_scoped_release release;
            return e.engine->retrieve(ids.view(), t.view);
          },
          nb::arg("tokens").none(), nb::arg("kv_out").none())
      .def(
          "lookup",
          [](PyEngine& e, nb::handle tokens) {
            BorrowedTokenIds ids = token_ids_from(tokens, "tokens");
            nb::gil_scoped_release release;
            return e.engine->lookup(ids.view());
          },
          nb::arg("tokens").none(), "Tokens of the longest prefix whose every chunk has KV.");
}

}  // namespace hss::python
