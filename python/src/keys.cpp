// hsstore.CacheEngineKey, hsstore.Metadata and hsstore.ChunkedTokenDatabase (LMCache's
// process_tokens(tokens=None, hashes=None, offsets=None) -> (start, end, key) list).
#include <Python.h>
#include <nanobind/operators.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <functional>
#include <string>
#include <tuple>

#include "bindings.hpp"
#include "config_source.hpp"
#include "hss/error.hpp"
#include "hss/token_database.hpp"
#include "keys_io.hpp"
#include "tensor_io.hpp"

namespace hss::python {

namespace {

auto as_tuple(const hss::CacheEngineKey& k) {
  return std::tie(k.fmt, k.model_name, k.world_size, k.worker_id, k.chunk_hash, k.kv_dtype);
}

std::string dtype_name(nb::handle dtype) {
  std::string text = nb::cast<std::string>(nb::str(dtype));
  constexpr std::string_view kTorchPrefix = "torch.";
  if (text.rfind(kTorchPrefix, 0) == 0) text = text.substr(kTorchPrefix.size());
  return text;
}

nb::list chunks_to_python(const std::vector<hss::Chunk>& chunks, bool make_key) {
  nb::list out;
  for (const hss::Chunk& c : chunks) {
    if (make_key) {
      out.append(nb::make_tuple(c.start, c.end, c.key));
    } else {
      out.append(nb::make_tuple(c.start, c.end, c.key.chunk_hash));
    }
  }
  return out;
}

}  // namespace

hss::Metadata metadata_from(nb::handle source) {
  hss::Metadata md;
  if (source.is_none()) return md;
  if (nb::isinstance<hss::Metadata>(source)) return nb::cast<hss::Metadata>(source);
  auto get = [&](const char* key) -> nb::object {
    if (nb::isinstance<nb::dict>(source)) {
      nb::dict d = nb::borrow<nb::dict>(source);
      return d.contains(key) ? nb::object(d[key]) : nb::object(nb::none());
    }
    return nb::getattr(source, key, nb::none());
  };
  try {
    if (nb::object v = get("fmt"); !v.is_none()) md.fmt = nb::cast<std::string>(v);
    if (nb::object v = get("model_name"); !v.is_none()) md.model_name = nb::cast<std::string>(v);
    if (nb::object v = get("world_size"); !v.is_none()) md.world_size = nb::cast<int64_t>(v);
    if (nb::object v = get("worker_id"); !v.is_none()) md.worker_id = nb::cast<int64_t>(v);
    if (nb::object v = get("kv_dtype"); !v.is_none()) md.kv_dtype = dtype_name(v);
  } catch (const nb::cast_error&) {
    throw InvalidArgument("metadata has a field of the wrong type: " +
                          nb::cast<std::string>(nb::repr(source)));
  }
  return md;
}

std::vector<uint64_t> hash_list_from(nb::handle hashes, const char* name) {
  // A snapshot holding every item: repr of a bad item runs Python code, which may change a list.
  const nb::object seq = owned_items(hashes);
  if (!seq.is_valid()) {
    PyErr_Clear();
    throw InvalidArgument(std::string(name) + " must be a sequence of ints, got " +
                          nb::cast<std::string>(nb::repr(hashes)));
  }
  const Py_ssize_t count = PyTuple_GET_SIZE(seq.ptr());
  std::vector<uint64_t> out(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* item = PyTuple_GET_ITEM(seq.ptr(), i);
    auto bad = [&] {
      PyErr_Clear();
      return InvalidArgument(std::string(name) + "[" + std::to_string(i) +
                             "] = " + nb::cast<std::string>(nb::repr(item)) +
                             " is not an integer in [-2^63, 2^64)");
    };
    if (!PyLong_Check(item)) throw bad();
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow == 0) {
      out[static_cast<size_t>(i)] = static_cast<uint64_t>(value);
      continue;
    }
    const unsigned long long unsigned_value = PyLong_AsUnsignedLongLong(item);
    if (unsigned_value == static_cast<unsigned long long>(-1) && PyErr_Occurred()) throw bad();
    out[static_cast<size_t>(i)] = unsigned_value;
  }
  return out;
}

std::vector<hss::Chunk> chunks_from(nb::handle chunks, const char* name) {
  // A snapshot holding every chunk: casting one runs Python code (__index__, a list chunk's
  // items), which may change a list of them.
  const nb::object seq = owned_items(chunks);
  if (!seq.is_valid()) {
    PyErr_Clear();
    throw InvalidArgument(std::string(name) + " must be a list of (start, end, key) tuples");
  }
  const Py_ssize_t count = PyTuple_GET_SIZE(seq.ptr());
  std::vector<hss::Chunk> out;
  out.reserve(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    const nb::handle item(PyTuple_GET_ITEM(seq.ptr(), i));
    try {
      auto [start, end, key] = nb::cast<std::tuple<int64_t, int64_t, hss::CacheEngineKey>>(item);
      out.push_back(hss::Chunk{start, end, std::move(key)});
    } catch (const nb::cast_error&) {
      throw InvalidArgument(std::string(name) + "[" + std::to_string(i) +
                            "] = " + nb::cast<std::string>(nb::repr(item)) +
                            " is not a (start, end, hsstore.CacheEngineKey) tuple");
    }
  }
  return out;
}

void bind_keys(nb::module_& m) {
  nb::class_<hss::Metadata>(m, "Metadata", "Identity of the worker whose cache this is.")
      .def(
          "__init__",
          [](hss::Metadata* self, std::string model_name, int64_t world_size, int64_t worker_id,
             nb::handle kv_dtype, std::string fmt) {
            new (self) hss::Metadata{std::move(fmt), std::move(model_name), world_size, worker_id,
                                     dtype_name(kv_dtype)};
          },
          nb::arg("model_name") = "", nb::arg("world_size") = 1, nb::arg("worker_id") = 0,
          nb::arg("kv_dtype") = "bfloat16", nb::arg("fmt") = "vllm")
      .def_ro("fmt", &hss::Metadata::fmt)
      .def_ro("model_name", &hss::Metadata::model_name)
      .def_ro("world_size", &hss::Metadata::world_size)
      .def_ro("worker_id", &hss::Metadata::worker_id)
      .def_ro("kv_dtype", &hss::Metadata::kv_dtype)
      .def("__repr__", [](const hss::Metadata& md) {
        return "hsstore.Metadata(model_name='" + md.model_name +
               "', world_size=" + std::to_string(md.world_size) +
               ", worker_id=" + std::to_string(md.worker_id) + ", kv_dtype='" + md.kv_dtype +
               "', fmt='" + md.fmt + "')";
      });

  nb::class_<hss::CacheEngineKey>(
      m, "CacheEngineKey",
      "The key of one chunk, identical for its KV and its hidden states. Immutable, hashable, "
      "ordered.")
      .def(
          "__init__",
          [](hss::CacheEngineKey* self, std::string model_name, int64_t world_size,
             int64_t worker_id, nb::handle chunk_hash, nb::handle kv_dtype, std::string fmt) {
            const uint64_t hash = hash_list_from(nb::make_tuple(chunk_hash), "chunk_hash")[0];
            new (self)
                hss::CacheEngineKey{std::move(fmt), std::move(model_name), world_size, worker_id,
                                    hash,           dtype_name(kv_dtype)};
          },
          nb::arg("model_name") = "", nb::arg("world_size") = 1, nb::arg("worker_id") = 0,
          nb::arg("chunk_hash") = 0, nb::arg("kv_dtype") = "bfloat16", nb::arg("fmt") = "vllm")
      .def_ro("fmt", &hss::CacheEngineKey::fmt)
      .def_ro("model_name", &hss::CacheEngineKey::model_name)
      .def_ro("world_size", &hss::CacheEngineKey::world_size)
      .def_ro("worker_id", &hss::CacheEngineKey::worker_id)
      .def_ro("chunk_hash", &hss::CacheEngineKey::chunk_hash)
      .def_ro("kv_dtype", &hss::CacheEngineKey::kv_dtype)
      .def("to_string", &hss::CacheEngineKey::to_string)
      .def("__str__", &hss::CacheEngineKey::to_string)
      .def("__repr__",
           [](const hss::CacheEngineKey& k) { return "CacheEngineKey('" + k.to_string() + "')"; })
      .def("__hash__",
           [](const hss::CacheEngineKey& k) {
             return static_cast<Py_hash_t>(std::hash<hss::CacheEngineKey>{}(k));
           })
      .def(
          "__eq__",
          [](const hss::CacheEngineKey& a, nb::handle b) {
            return nb::isinstance<hss::CacheEngineKey>(b) &&
                   a == nb::cast<const hss::CacheEngineKey&>(b);
          },
          nb::is_operator())
      .def(
          "__ne__",
          [](const hss::CacheEngineKey& a, nb::handle b) {
            return !(nb::isinstance<hss::CacheEngineKey>(b) &&
                     a == nb::cast<const hss::CacheEngineKey&>(b));
          },
          nb::is_operator())
      .def("__lt__", [](const hss::CacheEngineKey& a,
                        const hss::CacheEngineKey& b) { return as_tuple(a) < as_tuple(b); })
      .def("__le__", [](const hss::CacheEngineKey& a,
                        const hss::CacheEngineKey& b) { return as_tuple(a) <= as_tuple(b); })
      .def("__gt__", [](const hss::CacheEngineKey& a,
                        const hss::CacheEngineKey& b) { return as_tuple(a) > as_tuple(b); })
      .def("__ge__", [](const hss::CacheEngineKey& a,
                        const hss::CacheEngineKey& b) { return as_tuple(a) >= as_tuple(b); })
      .def("__getstate__",
           [](const hss::CacheEngineKey& k) {
             return nb::make_tuple(k.fmt, k.model_name, k.world_size, k.worker_id, k.chunk_hash,
                                   k.kv_dtype);
           })
      .def("__setstate__",
           [](hss::CacheEngineKey& k, const std::tuple<std::string, std::string, int64_t, int64_t,
                                                       uint64_t, std::string>& s) {
             new (&k) hss::CacheEngineKey{std::get<0>(s), std::get<1>(s), std::get<2>(s),
                                          std::get<3>(s), std::get<4>(s), std::get<5>(s)};
           });

  nb::class_<hss::TokenDatabase>(m, "TokenDatabase",
                                 "Turns tokens (or an engine's block hashes) into chunk keys.")
      .def_prop_ro("chunk_size", &hss::TokenDatabase::chunk_size);

  nb::class_<hss::ChunkedTokenDatabase, hss::TokenDatabase>(
      m, "ChunkedTokenDatabase",
      "LMCache's ChunkedTokenDatabase: prefix-chained chunk hashes, chunk_size tokens a chunk.")
      .def(
          "__init__",
          [](hss::ChunkedTokenDatabase* self, nb::handle config, nb::handle metadata) {
            if (!config.is_none()) {  // its hidden_state_chunk_hash_key_file too
              new (self) hss::ChunkedTokenDatabase(
                  hss::ChunkedTokenDatabase::from_config(config_from(config),
                                                         metadata_from(metadata)));
              return;
            }
            // LMCache's defaults without a config: 256 tokens, the trailing partial chunk kept.
            new (self) hss::ChunkedTokenDatabase(256, true, metadata_from(metadata));
          },
          nb::arg("config") = nb::none(), nb::arg("metadata") = nb::none())
      .def_prop_ro("metadata", &hss::ChunkedTokenDatabase::metadata)
      .def_prop_ro("keyed", &hss::ChunkedTokenDatabase::keyed,
                   "True when hidden_state_chunk_hash_key_file keys its chunk hash")
      .def(
          "process_tokens",
          [](const hss::ChunkedTokenDatabase& db, nb::handle tokens, nb::handle hashes,
             nb::handle offsets, bool make_key) {
            std::vector<hss::Chunk> chunks;
            if (!tokens.is_none()) {
              BorrowedTokenIds ids = token_ids_from(tokens, "tokens");
              nb::gil_scoped_release release;
              chunks = ids.visit([&](auto span) { return db.process_tokens(span); });
            } else if (!hashes.is_none()) {
              if (offsets.is_none()) {
                throw InvalidArgument("offsets must be given with hashes (token counts per chunk)");
              }
              std::vector<uint64_t> hash_values = hash_list_from(hashes, "hashes");
              std::vector<int64_t> counts = int_list_from(offsets, "offsets");
              nb::gil_scoped_release release;
              chunks = db.process_hashes(hash_values, counts);
            } else {
              throw InvalidArgument("Either tokens or hashes must be provided.");
            }
            return chunks_to_python(chunks, make_key);
          },
          nb::arg("tokens") = nb::none(), nb::arg("hashes") = nb::none(),
          nb::arg("offsets") = nb::none(), nb::arg("make_key") = true,
          "A list of (start, end, key) for tokens, or for hashes with offsets = token counts per "
          "chunk (LMCache's meaning). make_key=False gives the chunk hash instead of the key.")
      .def("make_key", &hss::ChunkedTokenDatabase::make_key, nb::arg("chunk_hash"));
}

}  // namespace hss::python
