#include "pool/block_pool.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "base/huge_pages.hpp"
#include "config/config_env.hpp"
#include "datapath/cuda_runtime.hpp"
#include "hss/error.hpp"

namespace hss::detail {
namespace {

/// First integer after `label` on a line of `path` (e.g. "MemAvailable:" in /proc/meminfo).
std::optional<uint64_t> read_labelled(const char* path, const std::string& label) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(label, 0) == 0) return std::stoull(line.substr(label.size()));
  }
  return std::nullopt;
}

std::optional<uint64_t> read_number(const char* path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    return std::stoull(word);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// Bytes this process may still populate: MemAvailable, lowered by the cgroup (v2) limit.
/// nullopt when neither can be read, or when HSS_POOL_MEMORY_CHECK=0 (then nothing is checked):
/// a VM whose memory is plugged in as it is used (the lent GPU machines) starts with a
/// MemAvailable far below what it will give. Not a Config key (config/config_env.hpp says why):
/// it describes the machine rather than the store, changes no value a store runs with, and must
/// not travel in a config file to a machine where the check matters.
std::optional<uint64_t> memory_available() {
  if (pool_memory_check_off()) return std::nullopt;
  std::optional<uint64_t> limit;
  if (auto kib = read_labelled("/proc/meminfo", "MemAvailable:")) limit = *kib * 1024;
  const auto max = read_number("/sys/fs/cgroup/memory.max");
  const auto current = read_number("/sys/fs/cgroup/memory.current");
  if (max && current) {
    const uint64_t room = *max > *current ? *max - *current : 0;
    limit = limit ? std::min(*limit, room) : room;
  }
  return limit;
}

/// Faults every page of [mem, mem + bytes) in writable (huge pages where madvise asked for them):
/// MADV_POPULATE_WRITE (Linux 5.14), else one write per 4 KiB page.
void populate(void* mem, uint64_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(mem, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  auto* p = static_cast<volatile unsigned char*>(mem);
  for (uint64_t off = 0; off < bytes; off += 4096) p[off] = 0;
}

uint64_t checked_granule(uint64_t capacity_bytes, uint64_t requested) {
  if (requested == 0) return BlockPool::granule_for_pool(capacity_bytes);
  if (requested % BlockPool::kMinGranuleBytes != 0 || requested > BlockPool::kMaxGranuleBytes) {
    throw InvalidArgument("hidden_state_block_bytes = " + std::to_string(requested) +
                          " must be a multiple of 64 and at most 64 MiB");
  }
  return std::min(requested,
                  capacity_bytes / BlockPool::kMinGranuleBytes * BlockPool::kMinGranuleBytes);
}

}  // namespace

uint64_t BlockPool::granule_for_pool(uint64_t capacity_bytes) {
  const uint64_t for_1024 = std::bit_floor(std::max<uint64_t>(capacity_bytes / 1024, 1));
  const uint64_t pool_cap = capacity_bytes / kMinGranuleBytes * kMinGranuleBytes;
  return std::min({kDefaultGranuleBytes, std::max(for_1024, kMinGranuleBytes), pool_cap});
}

BlockPool::BlockPool(uint64_t capacity_bytes, uint64_t granule_bytes, bool try_pinned,
                     bool prefault, int device)
    : arena_bytes_(capacity_bytes),
      granule_bytes_(checked_granule(capacity_bytes, granule_bytes)),
      num_blocks_(granule_bytes_ == 0 ? 0 : capacity_bytes / granule_bytes_),
      device_(device) {
  check_sizes_and_reserve(capacity_bytes);
  // Populating (or pinning) more than the process may use is an OOM kill, not an error: check
  // before touching a page.
  if (prefault) {
    if (const auto available = memory_available(); available && capacity_bytes > *available) {
      throw Error("hidden-state pool: " + std::to_string(capacity_bytes) +
                  " bytes (max_hidden_state_cpu_size) exceed the " + std::to_string(*available) +
                  " bytes of memory available to this process (MemAvailable / cgroup limit)");
    }
  }
  if (try_pinned) {
    // A failed cudaHostAlloc is not an error: the pool falls back to ordinary pages (documented;
    // stats().pinned says which).
    base_ = static_cast<std::byte*>(pinned_host_alloc(capacity_bytes, device));
    pinned_ = base_ != nullptr;
  }
  if (base_ == nullptr) {
    // Huge pages before the first fault: populated first (MAP_POPULATE), the pool was all 4 KiB
    // pages, and khugepaged then collapsed it 16 MiB per 10 s while the engine ran, so the same
    // call got faster over minutes (issue 22's small-call times; docs/perf.md).
    void* mem = map_huge_pages(capacity_bytes, /*noreserve=*/true);
    if (mem == nullptr) {
      throw Error("hidden-state pool: could not map " + std::to_string(capacity_bytes) + " bytes");
    }
    if (prefault) populate(mem, capacity_bytes);
    base_ = static_cast<std::byte*>(mem);
  }
  fill_free_stack();
}

BlockPool::BlockPool(uint64_t capacity_bytes, uint64_t granule_bytes, OnDevice on_device)
    : arena_bytes_(capacity_bytes),
      granule_bytes_(checked_granule(capacity_bytes, granule_bytes)),
      num_blocks_(granule_bytes_ == 0 ? 0 : capacity_bytes / granule_bytes_),
      device_(on_device.device) {
  check_sizes_and_reserve(capacity_bytes);
  std::string why;
  base_ = static_cast<std::byte*>(device_memory_alloc(capacity_bytes, device_, &why));
  if (base_ == nullptr) {
    throw Error("device-resident tier: cudaMalloc of " + std::to_string(capacity_bytes) +
                " bytes on device " + std::to_string(device_) + " failed (" + why + ")");
  }
  device_memory_ = true;
  fill_free_stack();
}

void BlockPool::check_sizes_and_reserve(uint64_t capacity_bytes) {
  if (num_blocks_ == 0) {
    throw InvalidArgument("hidden-state pool of " + std::to_string(capacity_bytes) +
                          " bytes is smaller than one 64-byte granule");
  }
  if (num_blocks_ > UINT32_MAX) {
    throw InvalidArgument("hidden-state pool of " + std::to_string(capacity_bytes) +
                          " bytes has more than 2^32 granules of " +
                          std::to_string(granule_bytes_) + " bytes; raise the granule");
  }
  free_.reserve(num_blocks_);  // before the arena: a throw here leaks nothing
}

void BlockPool::fill_free_stack() {
  // Lowest ids on top of the stack: the first entries fill the arena from its start.
  for (uint64_t i = 0; i < num_blocks_; ++i) {
    free_.push_back(static_cast<uint32_t>(num_blocks_ - 1 - i));
  }
}

BlockPool::~BlockPool() {
  if (device_memory_) {
    device_memory_free(base_, device_);
  } else if (pinned_) {
    pinned_host_free(base_, device_);
  } else {
    unmap_huge_pages(base_, arena_bytes_);
  }
}

uint64_t BlockPool::free_blocks() const {
  std::lock_guard lock(mutex_);
  return free_.size();
}

bool BlockPool::allocate(std::span<uint32_t> out) noexcept {
  std::lock_guard lock(mutex_);
  if (free_.size() < out.size()) return false;
  // Pop in stack order so consecutive fresh ids land in ascending order in `out`.
  for (uint32_t& id : out) {
    id = free_.back();
    free_.pop_back();
  }
  return true;
}

void BlockPool::release(std::span<const uint32_t> blocks) noexcept {
  if (blocks.empty()) return;
  std::lock_guard lock(mutex_);
  // Reverse, so the entry's first granule is on top again; never reallocates (capacity is full).
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) free_.push_back(*it);
}

void BlockPool::free_ids(std::vector<uint32_t>& out) const {
  std::lock_guard lock(mutex_);
  out.assign(free_.begin(), free_.end());
}

bool BlockPool::restock(std::vector<uint32_t>& stash, size_t need, size_t want) noexcept {
  std::lock_guard lock(mutex_);
  free_.insert(free_.end(), stash.begin(), stash.end());  // capacity is full: no reallocation
  stash.clear();
  const size_t take = std::min(want, free_.size());
  if (take < need) return false;
  const auto first = free_.end() - static_cast<std::ptrdiff_t>(take);
  stash.insert(stash.end(), first, free_.end());  // within the capacity the caller reserved
  free_.erase(first, free_.end());
  return true;
}

GranuleStash::GranuleStash(BlockPool& pool, size_t expected)
    : pool_(pool), expected_(std::min<uint64_t>(expected, pool.num_blocks())) {
  ids_.reserve(expected_);
}

GranuleStash::~GranuleStash() {
  if (!ids_.empty()) (void)pool_.restock(ids_, 0, 0);  // an exact estimate leaves nothing
}

bool GranuleStash::refill_and_allocate(std::span<uint32_t> out) noexcept {
  const size_t n = out.size();
  // Beyond the estimate: the pool's own allocate, after the stash's ids went back on top.
  if (n > ids_.capacity()) return pool_.restock(ids_, 0, 0) && pool_.allocate(out);
  if (!pool_.restock(ids_, n, std::max(n, std::min(expected_, ids_.capacity())))) return false;
  hand_out(out);
  return true;
}

}  // namespace hss::detail
