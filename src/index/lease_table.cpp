#include "index/lease_table.hpp"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <system_error>
#include <string>

#include "hss/error.hpp"

namespace hss::detail {

uint64_t random_lease_id() {
  uint64_t id = 0;
  auto* at = reinterpret_cast<unsigned char*>(&id);
  size_t got = 0;
  while (got < sizeof(id)) {
    const ssize_t n = getrandom(at + got, sizeof(id) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("getrandom failed for a lease id: " + std::system_category().message(errno));
    }
    got += static_cast<size_t>(n);
  }
  return id;
}

LeaseTable::LeaseTable(uint64_t max_leases, uint64_t max_bytes)
    : max_leases_(max_leases), max_bytes_(max_bytes) {}

uint64_t LeaseTable::add(std::vector<EntryRef> pins, uint64_t bytes, Clock::time_point deadline) {
  uint64_t id = random_lease_id();  // outside the lock: a syscall
  std::lock_guard lock(mutex_);
  if (leases_.size() >= max_leases_ || bytes > max_bytes_ - std::min(bytes_, max_bytes_)) {
    return 0;  // `pins` go with the argument, after the lock (lock order: header)
  }
  while (id == 0 || leases_.contains(id)) id = random_lease_id();
  leases_.emplace(id, Lease{std::move(pins), bytes, deadline});
  bytes_ += bytes;
  earliest_ = std::min(earliest_, deadline);
  return id;
}

bool LeaseTable::release(uint64_t id, Clock::time_point now) noexcept {
  std::lock_guard lock(mutex_);
  const auto it = leases_.find(id);
  if (it == leases_.end()) return false;
  const bool valid = now <= it->second.deadline;
  ++(valid ? released_ : expired_);
  bytes_ -= it->second.bytes;
  leases_.erase(it);  // the pins go here: granules nobody else holds return to the pool
  return valid;
}

void LeaseTable::expire(Clock::time_point now) noexcept {
  std::lock_guard lock(mutex_);
  if (now < earliest_) return;
  earliest_ = Clock::time_point::max();
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline < now) {
      ++expired_;
      bytes_ -= it->second.bytes;
      it = leases_.erase(it);
    } else {
      earliest_ = std::min(earliest_, it->second.deadline);
      ++it;
    }
  }
}

LeaseTable::Counts LeaseTable::counts() const {
  std::lock_guard lock(mutex_);
  return {leases_.size(), bytes_, released_, expired_};
}

void LeaseTable::clear() noexcept {
  std::lock_guard lock(mutex_);
  leases_.clear();
  bytes_ = 0;
  earliest_ = Clock::time_point::max();
}

}  // namespace hss::detail
