#pragma once
// The Python-side state of an hsstore.HiddenStateStore: the C++ store (owned, or an engine's),
// the Python objects it must keep alive, and the storage managers it was bound to.
//
// Thread safety: the C++ store is thread-safe and every call releases the GIL around it. The
// members here change only with the GIL held (bind_storage_manager), and every storage manager
// ever bound (a Python manager's PyStorageManager, or an hsstore.LocalCpuBackend, which the C++
// store calls by raw pointer) is kept alive until the store object dies: a call on another thread
// may still be inside its contains() after it was unbound or replaced.

#include <nanobind/nanobind.h>

#include <memory>
#include <vector>

#include "hss/hidden_state_store.hpp"
#include "hss/storage_manager.hpp"

namespace hss::python {

namespace nb = nanobind;

/// A Python object with LMCache's StorageManager.contains(key, search_range=None, pin=False):
/// a truthy result means KV is present. Called with the GIL taken back, from the thread that
/// called the store.
class PyStorageManager final : public hss::StorageManager {
 public:
  explicit PyStorageManager(nb::object manager);
  ~PyStorageManager() override;
  PyStorageManager(const PyStorageManager&) = delete;
  PyStorageManager& operator=(const PyStorageManager&) = delete;
  [[nodiscard]] bool contains(const hss::CacheEngineKey& key) const override;
  /// For the garbage collector (tp_traverse): visits the Python objects held.
  int traverse(visitproc visit, void* arg) const;

 private:
  nb::object manager_;
  nb::object contains_;
};

struct PyHiddenStateStore {
  PyHiddenStateStore() = default;
  PyHiddenStateStore(const PyHiddenStateStore&) = delete;
  PyHiddenStateStore& operator=(const PyHiddenStateStore&) = delete;
  PyHiddenStateStore(PyHiddenStateStore&&) = default;
  PyHiddenStateStore& operator=(PyHiddenStateStore&&) = default;
  ~PyHiddenStateStore() = default;

  std::shared_ptr<void> owner;  ///< keeps `store` alive (the store itself or its engine)
  hss::HiddenStateStore* store = nullptr;
  const hss::TokenDatabase* token_database = nullptr;
  nb::object token_database_object;  ///< the Python token database, if it came from Python
  nb::object bound_object;           ///< what bind_storage_manager was last given
  std::vector<std::unique_ptr<PyStorageManager>> managers;  ///< last = current; others retired
  /// Every LocalCpuBackend ever bound, each once (bound_object alone would let the next bind free
  /// one that a retrieve on another thread is still asking).
  std::vector<nb::object> kv_backends;

  void bind(nb::handle manager);
};

/// An ActivationKind or its name ('hidden', ...); InvalidArgument otherwise.
[[nodiscard]] hss::ActivationKind kind_from(nb::handle kind);
/// Layer indices (kind hidden) or (kind, layer) tuples; InvalidArgument naming `name` otherwise.
[[nodiscard]] std::vector<hss::Slot> slots_from(nb::handle items, const char* name);
/// The chunks of token ids (hashed by the store's token database, with the GIL released) or a
/// caller's (start, end, key) chunk list as it is; InvalidArgument naming `name` otherwise.
[[nodiscard]] std::vector<hss::Chunk> chunks_for(PyHiddenStateStore& s, nb::handle tokens_or_chunks,
                                                 const char* name);

/// tp_traverse / tp_clear of hsstore.HiddenStateStore, so a storage manager or token database
/// that refers back to the store does not make an uncollectable cycle.
int store_traverse(PyObject* self, visitproc visit, void* arg);
int store_clear(PyObject* self);

}  // namespace hss::python
