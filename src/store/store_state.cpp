#include "store/store_state.hpp"

#include <algorithm>
#include <string>

#include "base/log.hpp"
#include "base/nvtx.hpp"
#include "datapath/cuda_runtime.hpp"
#include "hss/detail/host_buffer.hpp"
#include "hss/error.hpp"
#include "store/backing_tiers.hpp"

namespace hss::detail {

namespace {

/// The pool's size once the key table (config_keys.cpp, the one place keys are checked) accepts
/// the config as a store's: a store is the hidden-state cache enabled, whatever the switch says.
uint64_t checked_pool_bytes(const Config& config) {
  Config as_store = config;
  as_store.enable_hidden_state_cache = true;
  as_store.validate();
  return as_store.hidden_state_pool_bytes();
}

/// The granule the pool is asked for: hidden_state_block_bytes, or for the automatic granule
/// (0) under FP8 storage a quarter of the automatic one. A scaled entry is its codes plus 4 bytes
/// a row (row_format.hpp): a 256 x 4096 chunk is 1 MiB + 1 KiB, 17 granules of 64 KiB (6% of
/// it lost to the last one, and only 1.88x the chunks of bfloat16) but 65 of 16 KiB (1.5%).
uint64_t requested_granule(const Config& config, uint64_t pool_bytes) {
  const auto given = static_cast<uint64_t>(config.hidden_state_block_bytes);
  if (given != 0) return given;
  switch (config.hidden_state_storage_dtype) {
    case StorageDType::kFloat32:
    case StorageDType::kNative:
      return 0;
    case StorageDType::kFp8E4M3:
    case StorageDType::kFp8E5M2:
      break;
  }
  return std::max(BlockPool::granule_for_pool(pool_bytes) / 4, BlockPool::kMinGranuleBytes);
}

}  // namespace

StoreState::StoreState(const Config& given, const TokenDatabase& keys)
    // The HSS_* debugging variables win over every source (config_env.hpp).
    : config(given.with_env_overrides()),
      token_database(keys),
      pool_(checked_pool_bytes(config), requested_granule(config, checked_pool_bytes(config)),
           /*try_pinned=*/true, /*prefault=*/true, store_device(config)),
      // The pool is empty: the calibration may overwrite it.
      host_copy(choose_host_copy(config,
                                 std::span<std::byte>(pool_.block_address(0), pool_.capacity_bytes()))),
      copy_threads(choose_copy_threads(config.tuning.copy_threads, this_thread_cpu_budget())),
      // Cheap: the workers start on the first split copy.
      copy_workers(copy_threads.threads > 1 ? std::make_unique<CopyWorkers>(copy_threads.threads)
                                            : nullptr),
      device_path(DevicePath::create(config)),
      mac(ValueMac::from_config(config)),
      leases(static_cast<uint64_t>(config.hidden_state_transfer_max_leases),
             static_cast<uint64_t>(config.hidden_state_transfer_max_leased_bytes)),
      // Queued writes may keep half the pool from eviction; beyond that they copy.
      tiers(make_backing_tiers(config), pool_.capacity_bytes() / 2) {
  // Process-wide: the recycler of restore outputs, and the log threshold when the config sets one.
  host_buffer_pool_set_limit(static_cast<size_t>(config.tuning.output_cache_bytes));
  if (config.hidden_state_log_level) set_log_level(*config.hidden_state_log_level);
  make_device_tier();
}

void StoreState::make_device_tier() {
  const uint64_t bytes = config.device_cache_bytes();
  if (bytes == 0) return;
  // Only where device stores happen: a store with no device path has nothing to keep resident.
  const int device = device_path ? store_device(config) : -1;
  try {
    if (device < 0) throw Error("no CUDA device");
    // A restore reads resident and pool chunks in one device launch: the pool must be
    // device-mapped (a pageable pool's restores are host copies).
    if (!pool_.pinned()) throw Error("the hidden-state pool is not page-locked");
    device_tier_ = std::make_unique<DeviceTier>(bytes, pool_.granule_bytes(), device);
    if (device_tier_->pool().granule_bytes() != pool_.granule_bytes()) {
      throw Error("device-resident tier of " + std::to_string(bytes) +
                  " bytes is smaller than one granule of the pool");
    }
    device_deferred_ = std::make_unique<DeferredRelease>(*device_tier_);
  } catch (const std::exception& e) {
    // A cache, not a requirement: the store runs on the host pool alone (stats().tiers' `device`
    // row counts the failure in errors).
    device_tier_.reset();
    device_tier_failed_ = true;
    log(LogLevel::kWarn, std::string("hidden_state_device_cache_size: the device-resident tier "
                                     "is off for this store: ") + e.what());
  }
}

bool StoreState::grant_device_blocks(const IndexLock& lock, Entry& copy, uint64_t guard) noexcept {
  const size_t need = device_tier_->pool().blocks_for(copy.payload_bytes());
  if (need > device_tier_->pool().num_blocks()) return false;
  copy.blocks.resize(need);  // reserved by the caller: no allocation
  if (device_tier_->allocate(copy.blocks)) return true;
  // Device-pool pressure: the device copies of the least recently used keys go (host entries
  // stay), until the pool has room; copies still read by a restore come back when it ends.
  for (const KeyRecord* record = index(lock).lru_front(); record != nullptr;
       record = record->lru_next) {
    if (guard != 0 && record->guard == guard) continue;
    bool dropped = false;
    for (const EntryRef& entry : record->slots) {
      if (entry->device_copy) {
        entry->device_copy.reset();  // its granules: back now, or when the last pin drops
        device_tier_->evictions.fetch_add(1, std::memory_order_relaxed);
        dropped = true;
      }
    }
    if (dropped && device_tier_->allocate(copy.blocks)) return true;
  }
  copy.blocks.clear();
  return false;
}

std::optional<TierStats> StoreState::device_tier_stats() const {
  if (!device_tier_ && !device_tier_failed_) return std::nullopt;
  TierStats row;
  row.name = "device";
  if (!device_tier_) {
    row.errors = 1;  // the allocation at construction
    return row;
  }
  row.hits = device_tier_->hits.load(std::memory_order_relaxed);
  row.errors = device_tier_->errors.load(std::memory_order_relaxed);
  row.evictions = device_tier_->evictions.load(std::memory_order_relaxed);
  row.entries_held = device_tier_->entries();
  row.bytes_held = device_tier_->bytes_in_use();
  return row;
}

HostCopyContext StoreState::host_copy_context() const {
  return {&host_copy, copy_workers.get(),
          config.tuning.copy_split_bytes ? static_cast<uint64_t>(*config.tuning.copy_split_bytes)
                                         : host_copy.info.min_bytes_per_copy_thread};
}

size_t StoreState::kv_prefix_end(std::span<const Chunk> chunks, size_t from,
                                             detail::KvAnswers* kv_answers) const {
  const StorageManager* kv = storage_manager.load(std::memory_order_acquire);
  if (kv == nullptr) return chunks.size();  // no KV side bound: KV counts as present
  for (size_t i = from; i < chunks.size(); ++i) {
    const bool present = kv_answers != nullptr
                             ? kv_answers->contains(*kv, i, chunks.size(), chunks[i].key)
                             : kv->contains(chunks[i].key);
    if (!present) return i;
  }
  return chunks.size();
}

bool StoreState::grant_blocks(const IndexLock& lock, detail::Entry& entry, uint64_t guard,
                              detail::GranuleStash* stash) noexcept {
  const size_t need = pool_.blocks_for(entry.payload_bytes());
  entry.blocks.resize(need);  // within the capacity the caller reserved: no allocation
  const auto allocate = [&] {
    return stash != nullptr ? stash->allocate(entry.blocks) : pool_.allocate(entry.blocks);
  };
  bool ok = need <= pool_.num_blocks() && allocate();
  while (!ok && need <= pool_.num_blocks() && evict_for_space(lock, guard)) ok = allocate();
  if (!ok) {
    entry.blocks.clear();
    counters.allocation_failures.fetch_add(1, std::memory_order_relaxed);
  }
  return ok;
}

KeyRecord& StoreState::insert_empty_record(const IndexLock& lock, const CacheEngineKey& key,
                                           size_t slots) {
  (void)lock;
  return index_.insert_empty(key, slots);
}

bool StoreState::reserve_entry(const IndexLock& lock, const CacheEngineKey& key,
                               const EntryRef& entry, uint64_t guard, const Entry* replaces) {
  KeyRecord* record = &open_record(lock, key, index_.find(key), guard);
  uint64_t epoch = index(lock).erasures();
  // The record is guarded, so the grant's evictions keep it; erasing another key may move it.
  const auto find_record = [&] {
    if (index(lock).erasures() != epoch) {
      record = index_.find(key);
      epoch = index(lock).erasures();
    }
    return record;
  };
  if (reserve(lock, find_record, entry, guard, replaces) != nullptr) return true;
  close_record(lock, *find_record());
  return false;
}

void StoreState::pin_prefix(const IndexLock& lock, PinnedWalk& w, std::span<const Chunk> chunks,
                              std::span<const Slot> slots, RecordLookups* lookups) const {
  w.chunks = chunks;
  w.slots = slots.size();
  size_t present = 0;  // chunks whose every slot is held, READY and of a consistent shape
  w.pinned.reserve(std::min<size_t>(chunks.size(), 4096) * slots.size());
  if (device_tier_ && !w.device) {
    w.device = std::make_unique<PinnedWalk::DeviceCopies>(w.pinned.get_allocator().resource());
  }
  for (; present < chunks.size(); ++present) {
    const Chunk& chunk = chunks[present];
    const KeyRecord* record = lookups
                                          ? lookups->find(index(lock), present, chunk.key)
                                          : index(lock).find(chunk.key);
    if (record == nullptr) break;
    // Each slot is found once and pinned; a chunk that misses any slot unpins its slots again.
    const size_t chunk_pins = w.pinned.size();
    size_t s = 0;
    for (; s < slots.size(); ++s) {
      const EntryRef* entry = record->find(slots[s]);
      if (entry == nullptr || !(*entry)->ready() || (*entry)->rows != chunk.size()) break;
      // A hidden dim that changes part-way (a caller bug) ends the prefix there.
      if (present > 0 && (*entry)->cols != w.pinned[s]->cols) break;
      w.any_fence = w.any_fence || (*entry)->fence != nullptr;
      w.pinned.push_back(*entry);
      if (w.device) w.device->pins.push_back((*entry)->device_copy);
    }
    if (s != slots.size()) {
      w.pinned.resize(chunk_pins);  // the index still holds them: no entry dies under the lock
      if (w.device) w.device->pins.resize(chunk_pins);
      break;
    }
  }
  w.hits = static_cast<int64_t>(present);
}

void StoreState::end_walk(const IndexLock& lock, const PinnedWalk& w, RecordLookups* lookups,
                              int64_t touch_from) noexcept {
  if (w.orphan) {
    // KV evicted => hidden states evicted (every slot of the key).
    if (index(lock).find(w.chunks[*w.orphan].key) != nullptr) {
      (void)index_.erase(w.chunks[*w.orphan].key);
      counters.coupled_evictions.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (w.failed_copy && index_.erase(w.chunks[*w.failed_copy].key) > 0) {
    counters.copy_failures.fetch_add(1, std::memory_order_relaxed);  // dropped, never served
  }
  // A device copy whose kernel failed is dropped (never served; its host entry stays).
  const size_t failed_copies = w.device ? w.device->failed.size() : 0;
  for (size_t i = 0; i + 1 < failed_copies; i += 2) {
    const EntryRef& host = w.device->failed[i];
    if (host->device_copy == w.device->failed[i + 1]) {
      host->device_copy.reset();
      count_device_errors(1);
    }
  }
  // Reverse order: chunk 0 ends most recent, so pressure evicts the suffix first.
  for (int64_t i = w.hits - 1; i >= touch_from; --i) {
    const auto chunk = static_cast<size_t>(i);
    const CacheEngineKey& key = w.chunks[chunk].key;
    if (KeyRecord* record = find_record(lock, key, lookups, chunk)) {
      index_.touch(*record);
    }
  }
}

bool StoreState::evict_for_space(const IndexLock& lock, uint64_t guard,
                                 bool freeable_only) noexcept {
  HSS_RANGE("evict");
  // Only keys nobody pins give their granules back now; evicting a pinned one would lose its
  // data without making room for this allocation.
  const CacheEngineKey* victim = index_.eviction_candidate(guard, freeable_only);
  if (victim == nullptr) return false;
  (void)drop_key(lock, *victim);
  counters.hs_evictions.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void StoreState::reclaim_device_resources() noexcept {
  if (!device_path) return;
  try {
    device_path->poll();
  } catch (...) {  // a broken device: nothing to reclaim now; the next checked call reports it
  }
  (void)deferred_.reclaim();
  if (device_deferred_) (void)device_deferred_->reclaim();
}

void StoreState::check_open(const IndexLock& lock) const {
  if (is_closed(lock)) throw Error("HiddenStateStore is closed");
}

void StoreState::check_chunks(std::span<const Chunk> chunks) {
  int64_t expected_start = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    if (c.start != expected_start || c.end <= c.start) {
      throw InvalidArgument("chunks[" + std::to_string(i) + "] = [" + std::to_string(c.start) +
                            ", " + std::to_string(c.end) + ") must be non-empty and start at " +
                            std::to_string(expected_start) +
                            " (chunks are contiguous from token 0)");
    }
    expected_start = c.end;
  }
}

}  // namespace hss::detail
