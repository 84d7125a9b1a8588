#pragma once
// What the parts of a store share (HiddenStateStore::Impl, src/store/hidden_state_store_impl.hpp):
// the config, the pool and its entries, the index and its mutex, the copy paths, the backing
// tiers, the counters, and the few rules every part applies the same way (the store is open,
// a grant of granules with eviction for room, a new PENDING entry, KV's end).
//
// The index mutex is private: lock_index() takes it and answers the token (index_lock.hpp) that
// the index and every function needing the lock ask for. Every writer's entry goes through the
// one write transaction below (reserve, fill outside the lock, commit or abort; drawn in
// docs/design.md, "The index lock and the write transaction").
//
// Lock order: the index mutex, then the pool's free-stack mutex. Never the reverse, never a KV
// backend's lock or a copy under the index mutex.
//
// Member order is destruction order, reversed: the entry pool outlives the block pool, which
// outlives every entry the device path, the leases or the tiers' queues may still hold.

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "config/copy_threads.hpp"
#include "datapath/data_path.hpp"
#include "datapath/host/copy_workers.hpp"
#include "datapath/host/host_copy.hpp"
#include "format/value_mac.hpp"
#include "hss/hidden_state_store.hpp"
#include "index/entry_pool.hpp"
#include "index/lease_table.hpp"
#include "index/store_index.hpp"
#include "pool/block_pool.hpp"
#include "pool/deferred_release.hpp"
#include "pool/device_tier.hpp"
#include "store/index_lock.hpp"
#include "tiers/tier_chain.hpp"

namespace hss::detail {

/// The KV answers for one chunk list, shared by the reads of a call that pass it (the layers of
/// a request, a read-through and its walk): each chunk's StorageManager::contains() is asked
/// once per call, not once per read (the KV side is read at one moment for the whole call; a KV
/// backend's lock, or the GIL for a Python manager, is taken a third as often for a three-layer
/// step). Asked in the walk's order: a read asks only the chunks its own walk reaches, and finds
/// the answers an earlier read of the list got. A manager bound in between is asked afresh.
/// Used by one thread, no lock held.
class KvAnswers {
 public:
  /// Chunk `chunk` (of `chunks`) of the list: KV's answer, asked now unless asked before.
  [[nodiscard]] bool contains(const StorageManager& kv, size_t chunk, size_t chunks,
                              const CacheEngineKey& key) {
    if (&kv != asked_) {  // the list's first question, or another manager: forget the answers
      asked_ = &kv;
      if (chunks <= kInline) {
        inline_.fill(kUnknown);
      } else {
        heap_.assign(chunks, kUnknown);  // a long prompt's list: one allocation
      }
    }
    uint8_t& answer = chunks <= kInline ? inline_[chunk] : heap_[chunk];
    if (answer == kUnknown) answer = kv.contains(key) ? kPresent : kGone;
    return answer == kPresent;
  }

 private:
  static constexpr uint8_t kUnknown = 0, kPresent = 1, kGone = 2;
  static constexpr size_t kInline = 16;  // a short prompt's chunks: no allocation per list
  const StorageManager* asked_ = nullptr;
  std::array<uint8_t, kInline> inline_{};
  std::vector<uint8_t> heap_;
};

class StoreState {
 public:
  /// ConfigError for a config the key table rejects as a store's; hss::Error if the pool does
  /// not fit in the memory available to the process. Allocates the whole pool now.
  StoreState(const Config& given, const TokenDatabase& keys);
  StoreState(const StoreState&) = delete;
  StoreState& operator=(const StoreState&) = delete;

  // ---- rules every part applies (store_state.cpp)
  /// The device-resident tier of hidden_state_device_cache_size, or none (logged once).
  void make_device_tier();
  /// hss::Error once the store is closed. Takes the lock's token.
  void check_open(const IndexLock& lock) const;
  /// Chunks passed by a caller: contiguous from 0, non-empty. InvalidArgument otherwise.
  static void check_chunks(std::span<const Chunk> chunks);
  /// Pointer checks of the device path (device memory of device_index, or not device memory).
  void check_pointer(const void* data, Device device, int device_index, const char* what) const;
  /// hss::Error (nothing changed) when device work on `stream` would be captured into a graph.
  void check_stream(Device device, Stream stream) const;
  /// How this store's host copies run (strategy, workers, split size).
  [[nodiscard]] HostCopyContext host_copy_context() const;
  /// Outside the index lock, before eviction decisions: refresh fence flags, release finished
  /// restores' pins and granules whose copies landed (none of it waits).
  void reclaim_device_resources() noexcept;
  /// Evicts one LRU key for pool pressure, skipping keys guarded by store call `guard`. False
  /// when nothing can be evicted. Takes the lock's token.
  bool evict_for_space(const IndexLock& lock, uint64_t guard) noexcept;
  /// Grants `entry` its granules (blocks_for(payload_bytes()); the caller reserved them in
  /// `blocks`, so nothing allocates), evicting LRU keys not guarded by `guard` while the pool is
  /// short. False, nothing taken and counted as an allocation failure, when the pool cannot make
  /// room. From `stash` when given (a batch: the same outcome, fewer pool locks). Takes the
  /// lock's token.
  bool grant_blocks(const IndexLock& lock, Entry& entry, uint64_t guard,
                    GranuleStash* stash = nullptr) noexcept;
  /// One entry of `key` made PENDING outside the store pipeline (the tiers' read-through, an
  /// import): room in the key's record or a new empty one, the granules (grant_blocks), then
  /// `replaces` (the slot's entry of another shape, or nullptr) removed and the entry added.
  /// False when the pool had no room (only evictions happened). std::bad_alloc before anything
  /// changed, or, rarely, after the grant (an eviction removed the key's record and inserting it
  /// again failed: the granules go back, only evictions happened). Takes the lock's token.
  bool reserve_entry(const IndexLock& lock, const CacheEngineKey& key, const EntryRef& entry,
                     uint64_t guard, const Entry* replaces);
  /// PENDING -> READY (StoreIndex::publish): `entry`, filled outside the lock, becomes visible
  /// to walks, unless it was dropped meanwhile (close, drop_key, a coupled eviction: false).
  bool commit_entry(const IndexLock& lock, const CacheEngineKey& key, Entry& entry,
                    KeyRecord* hint = nullptr) noexcept {
    (void)lock;
    return index_.publish(key, entry, hint);
  }
  /// PENDING -> DETACHED (StoreIndex::withdraw): a fill that failed or was refused; the granules
  /// go back with the entry's last reference.
  void abort_entry(const IndexLock& lock, const CacheEngineKey& key, Entry& entry) noexcept {
    (void)lock;
    index_.withdraw(key, entry);
  }
  /// (made) -> PENDING for a record the caller found since the last erasure or inserted empty
  /// (StoreIndex::add_pending); the batch form of reserve_entry, whose granules were granted by
  /// grant_blocks.
  void add_pending_entry(const IndexLock& lock, KeyRecord& record, EntryRef entry,
                         uint64_t guard) noexcept {
    (void)lock;
    index_.add_pending(record, std::move(entry), guard);
  }
  /// Takes the index mutex: the only way to (the token every function above asks for).
  [[nodiscard]] IndexLock lock_index() const { return IndexLock(mutex_); }
  /// Ends the export leases past their deadline (no lock held by the caller).
  void expire_leases() noexcept { leases.expire(LeaseTable::Clock::now()); }
  /// The first chunk at or after `from` whose KV is gone (chunks.size() when none is, or when no
  /// KV side is bound). Asks the storage manager outside every lock; through `kv_answers` when
  /// given (the call's answers, shared with its walk).
  [[nodiscard]] size_t kv_prefix_end(std::span<const Chunk> chunks, size_t from,
                                     KvAnswers* kv_answers = nullptr) const;

  // ---- the device-resident tier (store_state.cpp)
  /// The address of granule `id` of `entry`'s home (the host pool or the device tier).
  [[nodiscard]] std::byte* block_address(const Entry& entry, uint32_t id) const {
    return home_pool(entry).block_address(id);
  }
  /// The pool `entry`'s granules are in. Asked once per entry in the planners' loops, not once
  /// per granule: without a device tier it is the host pool with no virtual call (the residency
  /// is the home's, behind GranuleHome).
  [[nodiscard]] const BlockPool& home_pool(const Entry& entry) const {
    return device_tier && entry.residency() == Residency::kDevicePool ? device_tier->pool() : pool;
  }
  /// True when a store from a tensor on `device_index` keeps device copies (the tier is on and
  /// lives on that device).
  [[nodiscard]] bool keeps_device_copies(Device device, int device_index) const {
    return device_tier && device == Device::kCuda && device_index == device_tier->device();
  }
  /// Grants a device copy its granules (reserved by the caller), dropping device copies of the
  /// least recently used keys not guarded by `guard` (their host entries stay) while the device
  /// pool is short. False (nothing taken, not an error) when it cannot make room. Takes the
  /// lock's token. Never throws.
  bool grant_device_blocks(const IndexLock& lock, Entry& copy, uint64_t guard) noexcept;
  /// The `device` row of stats().tiers (none when the tier was not asked for).
  [[nodiscard]] std::optional<TierStats> device_tier_stats() const;

  // ---- the state
  // The HSS_* debugging variables win over every source (config_env.hpp): `config` is what this
  // store runs with, so config.to_yaml() shows what is in effect.
  const Config config;
  const TokenDatabase& token_database;
  // Every entry's node (entry_pool.hpp): declared before the pool, so it outlives every entry.
  EntryPool entries;
  BlockPool pool;
  // Granules of dropped entries whose copies were in flight: returned after the device path
  // drained and before the pool goes.
  DeferredRelease deferred{pool};
  // The device-resident tier (hidden_state_device_cache_size; null: off, or its allocation at
  // construction failed: device_tier_failed) and where its granules wait for in-flight kernels.
  std::unique_ptr<DeviceTier> device_tier;
  std::unique_ptr<DeferredRelease> device_deferred;
  bool device_tier_failed = false;
  // Host copies: the strategy chosen for this machine (calibrated on the empty pool, once per
  // process) and the workers that split large copies (none with hidden_state_copy_threads 1).
  const HostCopy host_copy;
  CopyThreadsChoice copy_threads;
  std::unique_ptr<CopyWorkers> copy_workers;
  std::unique_ptr<DevicePath> device_path;
  std::atomic<const StorageManager*> storage_manager{nullptr};

 private:
  // Guards index_, Entry::state, closed_, next_guard_. Private: taken through lock_index() only,
  // whose IndexLock every function that needs the lock asks for.
  mutable std::mutex mutex_;
  StoreIndex index_;
  bool closed_ = false;
  uint64_t next_guard_ = 0;

 public:
  /// True once close() ran (then every call that changes the index throws; check_open).
  [[nodiscard]] bool is_closed(const IndexLock& lock) const {
    (void)lock;
    return closed_;
  }
  /// close(): later calls throw hss::Error. Once set, never cleared.
  void mark_closed(const IndexLock& lock) {
    (void)lock;
    closed_ = true;
  }
  /// A new store call's guard: the keys it marks with it are off limits to its own evictions.
  [[nodiscard]] uint64_t new_guard(const IndexLock& lock) {
    (void)lock;
    return ++next_guard_;
  }
  /// The index, for a holder of the lock only (its token): no walk, publish or erase compiles
  /// without it.
  [[nodiscard]] StoreIndex& index(const IndexLock& lock) {
    (void)lock;
    return index_;
  }
  [[nodiscard]] const StoreIndex& index(const IndexLock& lock) const {
    (void)lock;
    return index_;
  }

  struct Counters {
    std::atomic<uint64_t> stores{0}, chunks_written{0}, retrieves{0}, hit_tokens{0}, miss_tokens{0},
        hs_evictions{0}, coupled_evictions{0}, allocation_failures{0}, copy_failures{0};
    std::array<std::atomic<uint64_t>, kNumActivationKinds> kind_chunks_written{};
  };
  mutable Counters counters;
  // The MAC key of both remote paths (null: values carry no MAC). Before the leases: nothing
  // below may throw a ConfigError after it.
  const std::shared_ptr<const ValueMac> mac;
  // Leases of exports: destroyed before the pool, after the index.
  LeaseTable leases;
  struct TransferCounters {
    std::atomic<uint64_t> exports{0}, exported_entries{0}, exported_bytes{0}, reserved{0},
        imported{0}, imported_bytes{0}, rejected{0}, unauthenticated{0}, abandoned{0},
        refused_exports{0};
  };
  mutable TransferCounters transfer_counters;
  // The backing tiers (store/backing_tiers.cpp makes them). Last: destroyed first, so the
  // entries their write-behind queues still hold go back to a live pool; constructed last, so a
  // ConfigError here (no hiredis) leaves nothing behind.
  mutable TierChain tiers;
};

}  // namespace hss::detail
