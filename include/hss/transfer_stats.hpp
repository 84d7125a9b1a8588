#pragma once
// Counters of the point-to-point pool transfer (hss/pool_transfer.hpp), part of HiddenStateStats.
// A plain value: safe to copy and read from any thread.

#include <cstdint>

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
  // Consumer side (reserve / publish / abandon).
  uint64_t reserved_entries = 0;         ///< destination entries reserved
  uint64_t imported_entries = 0;         ///< published: checked and now served
  uint64_t imported_bytes = 0;           ///< their payload bytes
  uint64_t rejected_entries = 0;         ///< failed the xxHash3 check or the MAC: counted misses
  uint64_t unauthenticated_entries = 0;  ///< of those, failing the MAC (or without one)
  uint64_t abandoned_entries = 0;  ///< reservations given up (transport failure, expired lease)
};

}  // namespace hss
