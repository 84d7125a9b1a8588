#pragma once
// hss::PoolTransfer: transport-neutral primitives to move cached chunks from one store's pinned
// pool into another's with a one-sided transport (an RDMA READ through NIXL, UCX, libfabric...).
// hsstore.nixl (Python) drives them over NIXL; a C++ transport uses the same calls.
//
//   producer                                        consumer
//   memory_regions()  -> register once             memory_regions() -> register once
//   export_chunks(chunks, slots, lease) -> ChunkExport (entries: header, MAC, extents; a lease)
//                         ---- control message (hss/transfer_wire.hpp) ---->
//                                                   reserve(chunks, export) -> Reservation
//                                                   transfer_pieces(export, reservation)
//                         <==== one-sided READs into the reserved granules ====
//                         <---- release_lease(id) -> true: the lease held throughout
//                                                   publish() (checks xxHash3 + MAC) or abandon()
//
// Lease rules (docs/design.md, "Leases: who may evict what"):
// * An export pins the exported entries' granules, as a retrieve pins what it copies: pool
//   pressure (a store, a read-through, an import) never evicts a key whose entries are pinned.
//   drop_key, a coupled eviction (KV gone) or evict_one_lru may still take such a key out of the
//   index, but its granules are not reused until the lease ends: bytes a consumer is reading never
//   change under it.
// * What one request may cost is bounded by the config: hidden_state_transfer_max_chunks chunks,
//   each key and slot once, _max_lease_bytes payload bytes per lease, _max_leases leases and
//   _max_leased_bytes bytes held in all; beyond, export_chunks refuses (counted in
//   TransferStats::refused_exports, nothing leased): InvalidArgument for a request that names too
//   many chunks or a key or slot twice, hss::Error past a byte or lease bound.
// * A lease ends when the consumer releases it or at its deadline (checked lazily, by every
//   store, import, export and lease call); then the granules are free for reuse. release_lease
//   answers true only when the lease was still held and not past its deadline: a consumer
//   publishes nothing it read under a lease that had ended, so an expired lease is a miss.
// * A reservation is PENDING entries: invisible to every read, never evicted, never written by
//   the store. publish() checks every entry's bytes against the producer's header (xxHash3) and,
//   when this store has a MAC key, its MAC over (remote key, header, payload); an entry failing
//   either is a counted miss and is dropped, the others become READY. abandon() (and the
//   destructor) drop every entry not yet published: nothing half-written is ever served.
//
// Failure: bad arguments (a malformed export included) are InvalidArgument naming the argument,
// with nothing changed, stats included. Thread safety (a Reservation is used by one thread at a
// time) and what may block the host: docs/design.md, "What may run concurrently and what may
// block the host".

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "hss/activation.hpp"
#include "hss/cache_key.hpp"
#include "hss/tensor.hpp"

namespace hss {

class HiddenStateStore;

/// A range of one process's memory: absolute address and length.
struct Extent {
  uint64_t addr = 0;
  uint64_t bytes = 0;

  friend bool operator==(const Extent&, const Extent&) = default;
};

/// Memory a transport registers once (the pool arena: page-locked when `pinned`).
struct MemoryRegion {
  uint64_t addr = 0;
  uint64_t bytes = 0;
  bool pinned = false;
};

inline constexpr size_t kEntryHeaderBytes = 32;  ///< the remote codec's header (remote_codec.hpp)
inline constexpr size_t kEntryMacBytes = 32;     ///< HMAC-SHA256

/// One exported (chunk, slot): its header (shape, storage dtype, xxHash3 of the payload), its MAC
/// when the producer has a key, and where its payload lies in the producer's memory, in order.
struct ExportedEntry {
  uint32_t chunk = 0;  ///< index into the chunk list of the export
  Slot slot;
  std::array<std::byte, kEntryHeaderBytes> header{};
  std::optional<std::array<std::byte, kEntryMacBytes>> mac;
  std::vector<Extent> extents;
};

/// What export_chunks leased: entries chunk-major in slot order, for chunks [first_chunk,
/// first_chunk + chunks). lease_id 0: nothing leased (an empty export).
struct ChunkExport {
  uint64_t lease_id = 0;
  uint32_t first_chunk = 0;
  uint32_t chunks = 0;
  int64_t prefix_tokens = 0;  ///< tokens of the producer's prefix (chunks before first_chunk too)
  uint32_t lease_ms = 0;
  std::vector<ExportedEntry> entries;
};

/// What publish() did.
struct ImportResult {
  size_t published = 0;        ///< entries now READY
  size_t rejected = 0;         ///< failed the checksum or the MAC (counted misses)
  size_t unauthenticated = 0;  ///< of those, failed the MAC
  uint64_t bytes = 0;          ///< payload bytes published
};

/// One piece of a one-sided READ: `bytes` from the producer's `remote_addr` to `local_addr`.
struct TransferPiece {
  uint64_t local_addr = 0;
  uint64_t remote_addr = 0;
  uint64_t bytes = 0;
};

class Reservation;

class PoolTransfer {
 public:
  /// Primitives over `store`, which must outlive this object and every Reservation it makes.
  explicit PoolTransfer(HiddenStateStore& store);

  /// The memory a transport must register (today one region: the pool arena).
  [[nodiscard]] std::vector<MemoryRegion> memory_regions() const;

  /// Leases the store's prefix for `chunks` and `slots` (the walk of retrieve_layers: KV present
  /// on this side, every slot READY with a consistent shape), from chunk `first_chunk` on, for
  /// `lease` (1 ms .. 1 h). Touches the prefix as a retrieve would, counts no retrieve. An empty
  /// export (nothing at or after first_chunk) holds no lease. Waits for device copies into the
  /// exported entries; computes (once per entry) its xxHash3 and MAC.
  [[nodiscard]] ChunkExport export_chunks(std::span<const Chunk> chunks,
                                          std::span<const Slot> slots, size_t first_chunk,
                                          std::chrono::milliseconds lease);
  /// Ends a lease. True when it was held and not past its deadline (the READ saw stable bytes);
  /// false for an unknown, released or expired lease. Never throws.
  bool release_lease(uint64_t lease_id) noexcept;

  /// The first chunk whose `slots` are not all held locally, and the first chunk at or after it
  /// whose KV is gone on this side (chunks.size() when none): the range worth pulling.
  [[nodiscard]] std::pair<size_t, size_t> missing_range(std::span<const Chunk> chunks,
                                                        std::span<const Slot> slots) const;

  /// Reserves destination entries for the export's entries, in order, for chunks of `chunks`
  /// (the consumer's own chunk list: its keys decide where entries go). Entries whose slot is
  /// already held READY with the same shape (or being written by another call) are skipped;
  /// under pool pressure LRU keys outside `chunks` are evicted; the first entry that does not fit
  /// ends the reservation (prefix-strict: a clean partial prefix). InvalidArgument when the export
  /// does not fit `chunks` (index, rows, header, extents), nothing reserved.
  [[nodiscard]] Reservation reserve(std::span<const Chunk> chunks, const ChunkExport& source);

  /// HMAC-SHA256 under the store's MAC key (hidden_state_mac_key) of a control channel's
  /// handshake `transcript` (both sides' nonces), for `label` (1..64 bytes: which side proves
  /// itself), domain-separated from every value MAC; nullopt when the store has no key. What
  /// hsstore.nixl's peers prove to each other before any address or metadata leaves a producer
  /// (docs/design.md, "Threat model"). The key never leaves the store.
  [[nodiscard]] std::optional<std::array<std::byte, kEntryMacBytes>> handshake_tag(
      std::string_view label, std::span<const std::byte> transcript) const;

 private:
  HiddenStateStore* store_;
};

/// Destination entries reserved by PoolTransfer::reserve. Move-only; the destructor abandons
/// whatever was not published.
class Reservation {
 public:
  struct Reserved {
    size_t source_entry = 0;  ///< index into ChunkExport::entries
    std::vector<Extent> extents;
  };

  Reservation() noexcept;
  Reservation(Reservation&&) noexcept;
  Reservation& operator=(Reservation&&) noexcept;
  ~Reservation();

  [[nodiscard]] std::span<const Reserved> entries() const;
  /// Payload bytes the transport must write.
  [[nodiscard]] uint64_t bytes() const;
  /// Chunks of the source export that are reserved or already held: the pull's prefix.
  [[nodiscard]] size_t chunks_covered() const;
  /// Checks reserved entries [first, first + count) now (xxHash3, and the MAC when the store has a
  /// key), on the calling thread, so a transport can check what has landed while the rest is in
  /// flight; publish() then checks only the others. Returns how many failed. Calls on disjoint
  /// ranges may run concurrently; not concurrently with publish() or abandon(). InvalidArgument
  /// for a range past entries().
  size_t check(size_t first, size_t count);
  /// Checks (what check() has not) and publishes every reserved entry; the reservation is empty
  /// afterwards.
  ImportResult publish();
  /// Drops every entry not yet published. Never throws; idempotent.
  void abandon() noexcept;

  struct State;

 private:
  friend class PoolTransfer;
  std::unique_ptr<State> state_;
};

/// The READ pieces of a reservation: each reserved entry's remote extents paired with its local
/// ones, split where either side's extents end, adjacent pieces merged. InvalidArgument when an
/// entry's two sides differ in length.
[[nodiscard]] std::vector<TransferPiece> transfer_pieces(const ChunkExport& source,
                                                         const Reservation& reservation);
/// The same for reserved entries [first, first + count) only (one batch of a pipelined READ).
[[nodiscard]] std::vector<TransferPiece> transfer_pieces(const ChunkExport& source,
                                                         const Reservation& reservation,
                                                         size_t first, size_t count);

}  // namespace hss
