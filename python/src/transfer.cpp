// hsstore._hsstore.PoolTransfer and friends: the pool transfer primitives (hss/pool_transfer.hpp)
// and their wire format (hss/transfer_wire.hpp) for hsstore.nixl. Control messages cross as
// bytes; descriptor lists as packed little-endian uint64 triples (address, length, 0) that NumPy
// reads with frombuffer, so no NumPy headers are needed here. Every C++ call runs with the GIL
// released.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "hss/config.hpp"
#include "hss/error.hpp"
#include "hss/pool_transfer.hpp"
#include "hss/transfer_wire.hpp"
#include "store_py.hpp"
#include "tensor_io.hpp"
#include "transfer_py.hpp"

namespace hss::python {

namespace {

std::span<const std::byte> bytes_view(const nb::bytes& b) {
  return {reinterpret_cast<const std::byte*>(b.c_str()), b.size()};
}

nb::bytes to_bytes(const std::string& s) { return nb::bytes(s.data(), s.size()); }

// The primitives over one Python store (kept alive by `store_object`).
struct PyPoolTransfer {
  nb::object store_object;
  PyHiddenStateStore* py_store = nullptr;
  std::unique_ptr<hss::PoolTransfer> transfer;
};

// A consumer's pull in progress: its chunk list, then its reservation.
//
// Thread safety: a Reservation is used by one thread at a time (hss/pool_transfer.hpp), but the
// methods below run it with the GIL released, so Python threads sharing one pull would race.
// `mutex` guards `source` and `reservation`: every method touching them takes it, always after
// releasing the GIL (with_lock), so a holder that needs the GIL (a Python storage manager's
// contains()) cannot deadlock against a thread waiting for the lock. Calls on one pull are
// serialised, check() on disjoint ranges included.
// The deleter of PyPull::owner: holds the Python PoolTransfer (the pull's traverse visits it).
struct TransferReference {
  nb::object transfer_object;
  void operator()(PyPoolTransfer* /*unused*/) const {}
};

struct PyPull {
  std::shared_ptr<PyPoolTransfer> owner;  // keeps the store alive while entries are reserved
  nb::object store_object;
  std::vector<hss::Chunk> chunks;  // up to the first chunk whose KV is gone here
  std::vector<hss::Slot> slots;
  size_t first_chunk = 0;
  std::optional<hss::ChunkExport> source;
  hss::Reservation reservation;
  std::unique_ptr<std::mutex> mutex = std::make_unique<std::mutex>();  // (a PyPull is moved)
};

// Runs fn() under the pull's lock with the GIL released; fn must not touch Python objects.
template <typename Fn>
decltype(auto) with_lock(PyPull& p, Fn&& fn) {
  nb::gil_scoped_release release;
  const std::lock_guard lock(*p.mutex);
  return fn();
}

nb::bytes pack_triples(const std::vector<hss::TransferPiece>& pieces, bool local) {
  std::string out(pieces.size() * 24, '\0');
  char* at = out.data();
  for (const hss::TransferPiece& p : pieces) {
    const uint64_t triple[3] = {local ? p.local_addr : p.remote_addr, p.bytes, 0};
    std::memcpy(at, triple, sizeof(triple));  // little-endian hosts only (x86-64, aarch64)
    at += sizeof(triple);
  }
  return to_bytes(out);
}

nb::dict import_dict(const hss::ImportResult& r) {
  nb::dict d;
  d["published"] = r.published;
  d["rejected"] = r.rejected;
  d["unauthenticated"] = r.unauthenticated;
  d["bytes"] = r.bytes;
  return d;
}

// tp_traverse of PoolTransfer and PoolPull: the store they hold is visible to the garbage
// collector, so a cycle through them (a storage manager that keeps the store's transfer or a pull)
// is collected instead of outliving the interpreter (nanobind's "leaked instance" lines at exit).
// No tp_clear: breaking such a cycle is the store's tp_clear (it drops its managers); a transfer or
// a pull must keep its store while its C++ PoolTransfer or Reservation lives.
int transfer_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  Py_VISIT(nb::inst_ptr<PyPoolTransfer>(self)->store_object.ptr());
  return 0;
}

int pull_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  const auto* p = nb::inst_ptr<PyPull>(self);
  Py_VISIT(p->store_object.ptr());
  if (const auto* held = std::get_deleter<TransferReference>(p->owner)) {
    Py_VISIT(held->transfer_object.ptr());
  }
  return 0;
}

}  // namespace

void check_transfer_available(const hss::Config& config) {
  if (config.hidden_state_transfer != hss::TransferKind::kNixl) return;
  nb::object util = nb::module_::import_("importlib.util");
  if (util.attr("find_spec")("nixl").is_none()) {
    throw hss::ConfigError(
        "config key 'hidden_state_transfer': 'nixl' needs the Python package nixl, which is not "
        "installed (pip install --no-deps nixl-cu13==1.5.1 nixl==1.5.1, or scripts/nixl_venv)");
  }
}

void bind_transfer(nb::module_& m) {
  static PyType_Slot pull_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(pull_traverse)},
                                     {0, nullptr}};
  nb::class_<PyPull>(m, "PoolPull",
                     "A consumer's pull of one prompt: request bytes for the producer, then the "
                     "reservation its READ fills (hsstore.nixl drives it).",
                     nb::type_slots(pull_slots))
      .def_prop_ro(
          "request",
          [](PyPull& p) {
            const hss::PullRequest q{p.chunks, p.slots, static_cast<uint32_t>(p.first_chunk), 0};
            return to_bytes(hss::encode_pull_request(q));
          })
      .def_prop_ro("first_chunk", [](PyPull& p) { return p.first_chunk; })
      .def_prop_ro("end_chunk", [](PyPull& p) { return p.chunks.size(); })
      .def(
          "reserve",
          [](PyPull& p, nb::bytes export_bytes) {
            const auto view = bytes_view(export_bytes);  // the bytes object outlives the call
            with_lock(p, [&] {
              hss::ChunkExport source = hss::decode_export(view);
              p.reservation = p.owner->transfer->reserve(p.chunks, source);
              p.source = std::move(source);
            });
          },
          nb::arg("export"),
          "Reserves destination entries for the producer's export (InvalidArgument when it "
          "does not fit this pull: nothing reserved).")
      .def_prop_ro(
          "lease_id",
          [](PyPull& p) { return with_lock(p, [&] { return p.source ? p.source->lease_id : 0; }); })
      .def_prop_ro("producer_prefix_tokens",
                   [](PyPull& p) {
                     return with_lock(p, [&] { return p.source ? p.source->prefix_tokens : 0; });
                   })
      .def_prop_ro(
          "chunks_covered",
          [](PyPull& p) { return with_lock(p, [&] { return p.reservation.chunks_covered(); }); })
      .def_prop_ro("bytes",
                   [](PyPull& p) { return with_lock(p, [&] { return p.reservation.bytes(); }); })
      .def_prop_ro(
          "entries",
          [](PyPull& p) { return with_lock(p, [&] { return p.reservation.entries().size(); }); })
      .def(
          "descriptors",
          [](PyPull& p, size_t first, std::optional<size_t> count) {
            const std::vector<hss::TransferPiece> pieces = with_lock(p, [&] {
              if (!p.source) throw hss::InvalidArgument("descriptors(): nothing reserved yet");
              const size_t n = count.value_or(p.reservation.entries().size() -
                                              std::min(first, p.reservation.entries().size()));
              return hss::transfer_pieces(*p.source, p.reservation, first, n);
            });
            return nb::make_tuple(pack_triples(pieces, true), pack_triples(pieces, false));
          },
          nb::arg("first") = 0, nb::arg("count").none() = nb::none(),
          "(local, remote): packed uint64 (address, length, 0) triples of the READ of reserved "
          "entries [first, first + count) (all by default), in pairs.")
      .def(
          "entry_bytes",
          [](PyPull& p) {
            return with_lock(p, [&] {
              std::vector<uint64_t> sizes;
              for (const hss::Reservation::Reserved& r : p.reservation.entries()) {
                uint64_t n = 0;
                for (const hss::Extent& x : r.extents) n += x.bytes;
                sizes.push_back(n);
              }
              return sizes;
            });
          },
          "Payload bytes of each reserved entry, in order.")
      .def(
          "check",
          [](PyPull& p, size_t first, size_t count) {
            return with_lock(p, [&] { return p.reservation.check(first, count); });
          },
          nb::arg("first"), nb::arg("count"),
          "Checks reserved entries [first, first + count) now (their READ has landed); the "
          "failures. publish() checks only the others.")
      .def(
          "publish",
          [](PyPull& p) {
            const hss::ImportResult r = with_lock(p, [&] { return p.reservation.publish(); });
            return import_dict(r);
          },
          "Checks (xxHash3, and the MAC when this store has a key) and publishes the entries.")
      .def(
          "abandon", [](PyPull& p) { with_lock(p, [&] { p.reservation.abandon(); }); },
          "Drops every reserved entry not yet published.");

  static PyType_Slot transfer_slots[] = {
      {Py_tp_traverse, reinterpret_cast<void*>(transfer_traverse)}, {0, nullptr}};
  nb::class_<PyPoolTransfer>(m, "PoolTransfer",
                             "Export/lease/import primitives over a HiddenStateStore's pinned "
                             "pool, for a one-sided transport (hsstore.nixl).",
                             nb::type_slots(transfer_slots))
      .def(
          "__init__",
          [](PyPoolTransfer* self, nb::handle store) {
            if (!nb::isinstance<PyHiddenStateStore>(store)) {
              throw hss::InvalidArgument("store must be an hsstore.HiddenStateStore, got " +
                                         nb::cast<std::string>(nb::repr(store)));
            }
            auto& s = nb::cast<PyHiddenStateStore&>(store);
            new (self) PyPoolTransfer{nb::borrow(store), &s,
                                      std::make_unique<hss::PoolTransfer>(*s.store)};
          },
          nb::arg("store"))
      .def(
          "memory_regions",
          [](PyPoolTransfer& t) {
            std::vector<std::tuple<uint64_t, uint64_t, bool>> out;
            for (const hss::MemoryRegion& r : t.transfer->memory_regions()) {
              out.emplace_back(r.addr, r.bytes, r.pinned);
            }
            return out;
          },
          "[(address, bytes, pinned)] to register once with the transport.")
      .def(
          "serve",
          [](PyPoolTransfer& t, nb::bytes request, uint32_t lease_ms) {
            const auto view = bytes_view(request);
            std::string reply;
            uint64_t lease_id = 0, leased = 0;
            {
              nb::gil_scoped_release release;
              const hss::PullRequest q = hss::decode_pull_request(view);
              const hss::ChunkExport e = t.transfer->export_chunks(
                  q.chunks, q.slots, q.first_chunk, std::chrono::milliseconds(lease_ms));
              reply = hss::encode_export(e);
              lease_id = e.lease_id;
              for (const hss::ExportedEntry& x : e.entries) {
                for (const hss::Extent& extent : x.extents) leased += extent.bytes;
              }
            }
            return nb::make_tuple(to_bytes(reply), lease_id, leased);
          },
          nb::arg("request"), nb::arg("lease_ms"),
          "Producer: a pull request in; (export bytes, lease id (0: none), payload bytes leased) "
          "out, the export leased for lease_ms.")
      .def(
          "handshake_tag",
          [](PyPoolTransfer& t, const std::string& label, nb::bytes transcript) -> nb::object {
            const auto view = bytes_view(transcript);
            std::optional<std::array<std::byte, hss::kEntryMacBytes>> tag;
            {
              nb::gil_scoped_release release;
              tag = t.transfer->handshake_tag(label, view);
            }
            if (!tag) return nb::none();
            return nb::bytes(reinterpret_cast<const char*>(tag->data()), tag->size());
          },
          nb::arg("label"), nb::arg("transcript"),
          "HMAC-SHA256 under the store's MAC key of a control handshake's transcript for one "
          "side's label (hss/pool_transfer.hpp), or None when the store has no key.")
      .def(
          "release",
          [](PyPoolTransfer& t, uint64_t lease_id) { return t.transfer->release_lease(lease_id); },
          nb::arg("lease_id"),
          "Producer: ends a lease; True when it was held and not past its deadline.")
      .def(
          "begin_pull",
          [](nb::handle self, nb::handle token_ids, nb::handle layers) -> nb::object {
            auto& t = nb::cast<PyPoolTransfer&>(self);
            std::vector<hss::Chunk> chunks = chunks_for(*t.py_store, token_ids, "token_ids");
            std::vector<hss::Slot> slots = slots_from(layers, "layers");
            PyPull pull;
            {
              nb::gil_scoped_release release;
              const auto [from, end] = t.transfer->missing_range(chunks, slots);
              chunks.resize(end);
              pull.chunks = std::move(chunks);
              pull.slots = std::move(slots);
              pull.first_chunk = from;
            }
            if (pull.first_chunk >= pull.chunks.size()) return nb::none();
            // The pull keeps the transfer (and so the store) alive while it holds entries.
            pull.owner = std::shared_ptr<PyPoolTransfer>(nb::inst_ptr<PyPoolTransfer>(self),
                                                         TransferReference{nb::borrow(self)});
            pull.store_object = t.store_object;
            return nb::cast(std::move(pull), nb::rv_policy::move);
          },
          nb::arg("token_ids"), nb::arg("layers"),
          "Consumer: a pull of the chunks not held here whose KV is present here (token ids, or "
          "(start, end, key) chunks keyed by the caller, e.g. LMCache's), or None when there is "
          "nothing to pull.");

  m.def(
      "transfer_settings",
      [](const hss::Config& c) {
        nb::dict d;
        d["transfer"] = std::string(hss::to_string(c.hidden_state_transfer));
        d["backend"] = c.hidden_state_transfer_backend;
        d["lease_ms"] = c.hidden_state_transfer_lease_ms;
        d["timeout_ms"] = c.hidden_state_transfer_timeout_ms;
        d["listen"] = c.hidden_state_transfer_listen;
        d["max_chunks"] = c.hidden_state_transfer_max_chunks;
        d["peer_leases"] = c.hidden_state_transfer_peer_leases;
        d["peer_leased_bytes"] = c.hidden_state_transfer_peer_leased_bytes;
        d["max_peers"] = c.hidden_state_transfer_max_peers;
        d["idle_ms"] = c.hidden_state_transfer_idle_ms;
        d["trusted_network"] = c.hidden_state_transfer_trusted_network;
        d["mac"] = !c.hidden_state_mac_key.empty() || !c.hidden_state_mac_key_file.empty();
        return d;
      },
      nb::arg("config"), "The point-to-point transfer keys of a Config, as a dict.");
}

}  // namespace hss::python
