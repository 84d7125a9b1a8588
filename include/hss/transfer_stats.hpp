#pragma once
// Counters of the point-to-point pool transfer (hss/pool_transfer.hpp), part of HiddenStateStats.
// A plain value: safe to copy and read from any thread.

#include <cstdint>

#include "hss/detail/stats_fields.hpp"

namespace hss {

struct TransferStats {
  // Producer side (export_chunks / release_lease).
  uint64_t exports = 0;           ///< export_chunks calls that leased at least one entry
  uint64_t exported_entries = 0;  ///< (chunk, slot) entries leased
  uint64_t exported_bytes = 0;    ///< their payload bytes
  uint64_t leases_held = 0;       ///< leases held now
  uint64_t leased_bytes = 0;      ///< payload bytes pinned by the leases held now
  uint64_t leases_released = 0;   ///< released by the consumer while still valid
  uint64_t leases_expired = 0;    ///< dropped at their deadline (or released after it)
  /// export requests refused: a repeated chunk key or slot, over hidden_state_transfer_max_chunks
  /// or _max_lease_bytes, or past the lease table's bounds (nothing leased)
  uint64_t refused_exports = 0;
  // Consumer side (reserve / publish / abandon).
  uint64_t reserved_entries = 0;         ///< destination entries reserved
  uint64_t imported_entries = 0;         ///< published: checked and now served
  uint64_t imported_bytes = 0;           ///< their payload bytes
  uint64_t rejected_entries = 0;         ///< failed the xxHash3 check or the MAC: counted misses
  uint64_t unauthenticated_entries = 0;  ///< of those, failing the MAC (or without one)
  uint64_t abandoned_entries = 0;  ///< reservations given up (transport failure, expired lease)
};

/// TransferStats's fields, each once, in the order stats() reports them: the Python dict is
/// built from this list, the stub and docs/stats.md are checked against it
/// (hss/detail/stats_fields.hpp).
template <detail::MaybeConst<TransferStats> Self, class Visit>
constexpr void for_each_field(Self& s, Visit&& visit) {
  visit("exports", s.exports);
  visit("exported_entries", s.exported_entries);
  visit("exported_bytes", s.exported_bytes);
  visit("leases_held", s.leases_held);
  visit("leased_bytes", s.leased_bytes);
  visit("leases_released", s.leases_released);
  visit("leases_expired", s.leases_expired);
  visit("refused_exports", s.refused_exports);
  visit("reserved_entries", s.reserved_entries);
  visit("imported_entries", s.imported_entries);
  visit("imported_bytes", s.imported_bytes);
  visit("rejected_entries", s.rejected_entries);
  visit("unauthenticated_entries", s.unauthenticated_entries);
  visit("abandoned_entries", s.abandoned_entries);
}

}  // namespace hss
