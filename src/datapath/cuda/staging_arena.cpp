#include "datapath/cuda/staging_arena.hpp"

#include <algorithm>
#include <string>

#include "datapath/cuda/capture_mode.hpp"
#include "hss/error.hpp"
#include "hss/kernels/cuda_check.hpp"

namespace hss::detail::cuda {

// ---- RangeAllocator

RangeAllocator::RangeAllocator(size_t capacity, size_t max_ranges) : capacity_(capacity) {
  free_.reserve(max_ranges + 1);  // n leased ranges split the free space into at most n + 1
  if (capacity > 0) free_.push_back({0, capacity});
}

size_t RangeAllocator::allocate(size_t n) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->size < n) continue;
    const size_t offset = it->offset;
    it->offset += n;
    it->size -= n;
    if (it->size == 0) free_.erase(it);
    return offset;
  }
  return SIZE_MAX;
}

void RangeAllocator::release(size_t offset, size_t n) noexcept {
  auto next = std::lower_bound(free_.begin(), free_.end(), offset,
                               [](const Range& r, size_t o) { return r.offset < o; });
  const bool joins_prev =
      next != free_.begin() && std::prev(next)->offset + std::prev(next)->size == offset;
  const bool joins_next = next != free_.end() && offset + n == next->offset;
  if (joins_prev && joins_next) {
    std::prev(next)->size += n + next->size;
    free_.erase(next);
  } else if (joins_prev) {
    std::prev(next)->size += n;
  } else if (joins_next) {
    next->offset = offset;
    next->size += n;
  } else {
    free_.insert(next, {offset, n});  // within the reserved capacity: no allocation
  }
}

// ---- StagingArena

struct StagingArena::Round {
  size_t offset = 0, bytes = 0;
  size_t tile_offset = 0, tiles = 0;
  Event gathered = Event::create();
  Event done = Event::create(/*blocking_sync=*/true);  // acquire() and synchronize() wait on it
};

StagingArena::StagingArena(size_t bytes, size_t tiles, size_t rounds)
    : staging_(DeviceBuffer::allocate(std::max(bytes / kAlign * kAlign, kAlign))),
      table_(PinnedTable::allocate(tiles * sizeof(kernels::WriteSegment))),
      bytes_(staging_.bytes(), rounds),
      tiles_(tiles, rounds) {
  rounds_.reserve(rounds);
  idle_.reserve(rounds);
  in_flight_.reserve(rounds);
  for (size_t i = 0; i < rounds; ++i) {
    rounds_.push_back(std::make_unique<Round>());
    idle_.push_back(rounds_.back().get());
  }
}

StagingArena::~StagingArena() { synchronize(); }

unsigned char* StagingArena::Lease::staging() const {
  return static_cast<unsigned char*>(arena_.staging_.get()) + round_.offset;
}

kernels::WriteSegment* StagingArena::Lease::tiles_host() const {
  return static_cast<kernels::WriteSegment*>(arena_.table_.host()) + round_.tile_offset;
}

const kernels::WriteSegment* StagingArena::Lease::tiles_device() const {
  return static_cast<const kernels::WriteSegment*>(arena_.table_.device()) + round_.tile_offset;
}

cudaEvent_t StagingArena::Lease::gathered() const { return round_.gathered.get(); }

void StagingArena::Lease::touch(cudaStream_t stream) {
  for (int i = 0; i < touched_count_; ++i) {
    if (touched_[i] == stream) return;
  }
  if (touched_count_ < 2) touched_[touched_count_++] = stream;
}

void StagingArena::Lease::record(cudaStream_t copy_stream) {
  HSS_CUDA_CHECK(cudaEventRecord(round_.done.get(), copy_stream));
  std::lock_guard lock(arena_.mutex_);
  arena_.in_flight_.push_back(&round_);  // within the capacity reserved for every record
  recorded_ = true;
  arena_.changed_.notify_all();
}

StagingArena::Lease::~Lease() {
  if (recorded_) return;
  // Dropped without record(), after an exception: work may still read the ranges.
  const RelaxedCaptureMode relaxed;
  for (int i = 0; i < touched_count_; ++i) clear_own_error(cudaStreamSynchronize(touched_[i]));
  std::lock_guard lock(arena_.mutex_);
  arena_.free_locked(round_);
  arena_.changed_.notify_all();
}

std::unique_ptr<StagingArena::Lease> StagingArena::acquire(size_t bytes, size_t tiles,
                                                           bool* waited) {
  const size_t need = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  if (need > bytes_.capacity() || tiles > tiles_.capacity() || tiles == 0) {
    throw Error("device store: a staging round of " + std::to_string(bytes) + " bytes and " +
                std::to_string(tiles) + " tiles does not fit the staging of " +
                std::to_string(bytes_.capacity()) + " bytes and " +
                std::to_string(tiles_.capacity()) + " tiles");
  }
  std::unique_lock lock(mutex_);
  for (;;) {
    reclaim_locked();
    if (!idle_.empty()) {
      const size_t offset = bytes_.allocate(need);
      if (offset != SIZE_MAX) {
        const size_t tile_offset = tiles_.allocate(tiles);
        if (tile_offset != SIZE_MAX) {
          Round* round = idle_.back();
          idle_.pop_back();
          round->offset = offset;
          round->bytes = need;
          round->tile_offset = tile_offset;
          round->tiles = tiles;
          return std::make_unique<Lease>(*this, *round);
        }
        bytes_.release(offset, need);
      }
    }
    // Nothing fits beside the rounds in flight: wait for the oldest, then look again.
    if (in_flight_.empty()) {
      // Only rounds other threads hold leased have what is missing: wait until one is recorded
      // or given back.
      changed_.wait(lock);
      continue;
    }
    if (waited != nullptr) *waited = true;
    const cudaEvent_t oldest = in_flight_.front()->done.get();
    lock.unlock();
    HSS_CUDA_CHECK(cudaEventSynchronize(oldest));
    lock.lock();
  }
}

void StagingArena::reclaim_locked() noexcept {
  std::erase_if(in_flight_, [&](Round* round) {
    if (!event_finished(round->done.get())) return false;
    free_locked(*round);
    return true;
  });
}

void StagingArena::free_locked(Round& round) noexcept {
  bytes_.release(round.offset, round.bytes);
  tiles_.release(round.tile_offset, round.tiles);
  idle_.push_back(&round);
}

void StagingArena::synchronize() noexcept {
  const RelaxedCaptureMode relaxed;
  std::lock_guard lock(mutex_);
  for (Round* round : in_flight_) clear_own_error(cudaEventSynchronize(round->done.get()));
  for (Round* round : in_flight_) free_locked(*round);
  in_flight_.clear();
}

}  // namespace hss::detail::cuda
