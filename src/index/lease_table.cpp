#include "index/lease_table.hpp"

#include <algorithm>

namespace hss::detail {

LeaseTable::LeaseTable() : ids_(std::random_device{}()) {}

uint64_t LeaseTable::add(std::vector<EntryRef> pins, uint64_t bytes, Clock::time_point deadline) {
  std::lock_guard lock(mutex_);
  uint64_t id = 0;
  while (id == 0 || leases_.contains(id)) id = ids_();
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
