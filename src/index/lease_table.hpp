#pragma once
// The leases of a store's exports (hss/pool_transfer.hpp): each holds references to the exported
// entries, so their granules are neither evicted for pool pressure (a pinned key is never a
// victim) nor reused (an entry's granules return to the pool with its last reference) until the
// lease is released or passes its deadline.
//
// Lease states:  (export) --> HELD --release before deadline--> gone (released: true)
//                              \---deadline passed: expire() or release--> gone (expired: false)
//
// Thread-safe; one short mutex, never held with the store's index mutex (lock order: lease table,
// then the pool's free-stack mutex, taken when a last reference drops here).

#include <chrono>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "index/store_index.hpp"

namespace hss::detail {

/// 64 bits from getrandom(2) (the kernel's CSPRNG); hss::Error when it fails.
[[nodiscard]] uint64_t random_lease_id();

class LeaseTable {
 public:
  using Clock = std::chrono::steady_clock;

  /// At most `max_leases` held at once, pinning at most `max_bytes` payload bytes in all
  /// (hidden_state_transfer_max_leases / _max_leased_bytes).
  LeaseTable(uint64_t max_leases, uint64_t max_bytes);

  /// A new lease on `pins` (payload `bytes`) until `deadline`; 0 (nothing held, `pins` dropped)
  /// when it would pass either bound. Ids are 64 bits from the kernel's CSPRNG (getrandom) and
  /// never 0, so a peer on the control channel cannot guess another consumer's lease.
  [[nodiscard]] uint64_t add(std::vector<EntryRef> pins, uint64_t bytes,
                             Clock::time_point deadline);
  /// Ends the lease; true when it was held and `now` is not past its deadline.
  bool release(uint64_t id, Clock::time_point now) noexcept;
  /// Ends every lease past its deadline (cheap when none is due).
  void expire(Clock::time_point now) noexcept;

  struct Counts {
    uint64_t held = 0, bytes = 0, released = 0, expired = 0;
  };
  [[nodiscard]] Counts counts() const;
  /// Drops every lease (the store is closing).
  void clear() noexcept;

 private:
  struct Lease {
    std::vector<EntryRef> pins;
    uint64_t bytes = 0;
    Clock::time_point deadline;
  };

  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Lease> leases_;
  Clock::time_point earliest_ = Clock::time_point::max();  // no lease is due before this
  const uint64_t max_leases_, max_bytes_;
  uint64_t bytes_ = 0, released_ = 0, expired_ = 0;
};

}  // namespace hss::detail
