#pragma once
// What the parts of a store share (HiddenStateStore::Impl, src/store/hidden_state_store_impl.hpp).
//
// The catalog is closed: the index (its map and LRU), the index mutex, the host pool, the entry
// pool and the device-resident tier are private. lock_index() takes the mutex and answers the
// token (index_lock.hpp) every function needing the lock asks for; the index and the pool are
// handed out read-only; every change is one of the named operations below: the write
// transaction (open_record, reserve, fill outside the lock, commit or abort), the read
// transaction (pin_prefix ... end_walk, pinned_walk.hpp), evictions and drops. Drawn, with what
// each part may touch, in docs/design.md, "The index lock and the write transaction".
// Public: the config, the copy paths, the backing tiers and the counters (none of them guarded
// by the index mutex), and the rules every part applies the same way (the store is open, KV's
// end, pointer and stream checks).
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
#include "store/pinned_walk.hpp"
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
  void check_pointer(const void* data, Device device, int device_index, const char* what) const {
    if (device_path && data != nullptr) {
      device_path->check_pointer(data, device == Device::kCuda, device_index, what);
    }
  }
  /// hss::Error (nothing changed) when device work on `stream` would be captured into a graph.
  void check_stream(Device device, Stream stream) const {
    if (device_path && device == Device::kCuda) device_path->check_stream(stream);
  }
  /// How this store's host copies run (strategy, workers, split size).
  [[nodiscard]] HostCopyContext host_copy_context() const;
  /// Outside the index lock, before eviction decisions: refresh fence flags, release finished
  /// restores' pins and granules whose copies landed (none of it waits).
  void reclaim_device_resources() noexcept;
  /// Evicts one LRU key for pool pressure, skipping keys guarded by store call `guard` (0:
  /// none) and, when `freeable_only`, keys whose granules a pin (a read, a lease) would keep.
  /// False when nothing can be evicted. Takes the lock's token.
  bool evict_for_space(const IndexLock& lock, uint64_t guard, bool freeable_only = true) noexcept;
  /// Grants `entry` its granules (blocks_for(payload_bytes()); the caller reserved them in
  /// `blocks`, so nothing allocates), evicting LRU keys not guarded by `guard` while the pool is
  /// short. False, nothing taken and counted as an allocation failure, when the pool cannot make
  /// room. From `stash` when given (a batch: the same outcome, fewer pool locks). Takes the
  /// lock's token.
  bool grant_blocks(const IndexLock& lock, Entry& entry, uint64_t guard,
                    GranuleStash* stash = nullptr) noexcept;
  // ---- the write transaction: every producer's entry (the store pipeline, the tiers'
  //      read-through, a P/D import) takes these steps, drawn in docs/design.md, "The index
  //      lock and the write transaction". 1 and 2 under the lock, the fill outside it, then 3
  //      or 4 under it again.
  /// 1. May allocate (std::bad_alloc), nothing visible changes: `key`'s record (`found`, or
  /// inserted empty, outside the LRU) marked with `guard`, so this call's evictions never take
  /// it, with room for one more slot (`grow` more when it is full).
  KeyRecord& open_record(const IndexLock& lock, const CacheEngineKey& key, KeyRecord* found,
                         uint64_t guard, size_t grow = 1) {
    KeyRecord* record = found;
    if (record == nullptr) {
      record = &insert_empty_record(lock, key, grow);
    } else if (record->slots.size() == record->slots.capacity()) [[unlikely]] {
      record->slots.reserve(record->slots.size() + grow);
    }
    record->guard = guard;
    return *record;
  }
  /// 2. Never throws: `replaces` (the slot's entry of another shape, or nullptr) detached, so
  /// its granules make room for its replacement; `entry` granted its granules (grant_blocks:
  /// LRU keys not guarded by `guard` evicted while the pool is short; from `stash` when given);
  /// then `entry` PENDING in the key's record, which `find_record()` answers (a record moves when
  /// another key is erased: an eviction). Answers the record, or null when the pool had no
  /// room: nothing of `entry` taken, the replaced entry stays detached, and the record of step 1
  /// may be empty (close_record).
  template <typename FindRecord>
  KeyRecord* reserve(const IndexLock& lock, FindRecord&& find_record, const EntryRef& entry,
                     uint64_t guard, const Entry* replaces,
                     GranuleStash* stash = nullptr) noexcept {
    if (replaces != nullptr) index_.detach_slot(*find_record(), replaces);
    if (!grant_blocks(lock, *entry, guard, stash)) return nullptr;
    KeyRecord* const record = find_record();
    index_.add_pending(*record, entry, guard);
    return record;
  }
  /// Undo of step 1 for a key whose step 2 failed or never ran: its record goes when empty.
  void close_record(const IndexLock& lock, KeyRecord& record) noexcept {
    (void)lock;
    index_.erase_if_empty(record);
  }
  /// Steps 1 and 2 for one key (the tiers' read-through, an import): false when the pool had
  /// no room (only evictions happened, the record of step 1 is closed again). std::bad_alloc
  /// before anything changed.
  bool reserve_entry(const IndexLock& lock, const CacheEngineKey& key, const EntryRef& entry,
                     uint64_t guard, const Entry* replaces);
  /// 3. PENDING -> READY (StoreIndex::publish): `entry`, filled outside the lock, becomes
  /// visible to walks, unless it was dropped meanwhile (close, drop_key, a coupled eviction:
  /// false). `hint`: the key's record when no key was erased since step 2.
  bool commit_entry(const IndexLock& lock, const CacheEngineKey& key, Entry& entry,
                    KeyRecord* hint = nullptr) noexcept {
    (void)lock;
    return index_.publish(key, entry, hint);
  }
  /// 4. PENDING -> DETACHED (StoreIndex::withdraw): a fill that failed or was refused; the
  /// granules go back with the entry's last reference (after `fence` when given: copies
  /// enqueued into them may still land).
  void abort_entry(const IndexLock& lock, const CacheEngineKey& key, Entry& entry) noexcept {
    (void)lock;
    index_.withdraw(key, entry);
  }
  /// The fill's fence on `entry` (null: none): its granules go back only after it landed.
  void set_fence(Entry& entry, const FenceRef& fence) noexcept {
    if (!fence && !entry.fence) return;  // a host fill: no fence to keep, nothing deferred
    entry.deferred = fence ? release_after_fence(entry) : nullptr;
    entry.fence = fence;
  }

  // ---- the read transaction (pinned_walk.hpp): begin and end under the lock
  /// Begin: the READY prefix of `chunks` for every slot of `slots` (a chunk missing a slot, of
  /// another row count, or of another hidden dim than chunk 0's ends it), each entry pinned in
  /// `w` with its device copy. Changes nothing. `lookups` (optional): the chunk list's record
  /// lookups, shared by the reads of a batch.
  void pin_prefix(const IndexLock& lock, PinnedWalk& w, std::span<const Chunk> chunks,
                  std::span<const Slot> slots, RecordLookups* lookups = nullptr) const;
  /// End: drops the orphan (KV gone: a coupled eviction) and failed copies, touches the prefix
  /// in reverse order (chunk 0 ends most recent). `touch_from`: the chunks before it are touched
  /// again later in the same locked section (a batch's later read of the same list), so touching
  /// them here would not change the order. Never throws.
  void end_walk(const IndexLock& lock, const PinnedWalk& w, RecordLookups* lookups = nullptr,
                int64_t touch_from = 0) noexcept;
  /// Takes the index mutex: the only way to (the token every function above asks for).
  [[nodiscard]] IndexLock lock_index() const { return IndexLock(mutex_); }
  /// Ends the export leases past their deadline (no lock held by the caller).
  void expire_leases() noexcept { leases.expire(LeaseTable::Clock::now()); }
  /// The first chunk at or after `from` whose KV is gone (chunks.size() when none is, or when no
  /// KV side is bound). Asks the storage manager outside every lock; through `kv_answers` when
  /// given (the call's answers, shared with its walk).
  [[nodiscard]] size_t kv_prefix_end(std::span<const Chunk> chunks, size_t from,
                                     KvAnswers* kv_answers = nullptr) const;

  // ---- the pools, read-only (geometry, addresses), and new entries
  /// The host pool: its geometry and its granules' addresses. Granules are taken through the
  /// write transaction only (grant_blocks, reserve, a stash from new_stash).
  [[nodiscard]] const BlockPool& pool() const noexcept { return pool_; }
  /// A new PENDING entry homed in the host pool, room reserved for its granule ids (`granules`,
  /// when the caller counted them: pool().blocks_for(payload_bytes())). May throw
  /// std::bad_alloc. Any thread, no lock.
  [[nodiscard]] EntryRef new_entry(int64_t rows, int64_t cols, RowFormat format, Slot slot,
                                   std::optional<size_t> granules = std::nullopt) {
    EntryRef entry = entries_.make(pool_, rows, cols, format, slot);
    entry->blocks.reserve(granules ? *granules : pool_.blocks_for(entry->payload_bytes()));
    return entry;
  }
  /// A new device copy of such an entry, homed in the device-resident tier (which must be on).
  [[nodiscard]] EntryRef new_device_copy(int64_t rows, int64_t cols, RowFormat format, Slot slot) {
    EntryRef copy = entries_.make(*device_tier_, rows, cols, format, slot);
    copy->blocks.reserve(device_tier_->pool().blocks_for(copy->payload_bytes()));
    return copy;
  }
  /// A batch's granules from the host pool in one pool lock (GranuleStash: the same grants as
  /// grant_blocks without it, fewer pool locks). Under the index lock, so the ids it holds go
  /// back before anyone else's grant. May throw std::bad_alloc (nothing taken).
  GranuleStash& new_stash(const IndexLock& lock, std::optional<GranuleStash>& stash,
                          size_t granules) {
    (void)lock;
    return stash.emplace(pool_, granules);
  }
  /// Entry nodes in use (check_invariants).
  [[nodiscard]] size_t entry_nodes_in_use() const { return entries_.nodes_in_use(); }

  // ---- the device-resident tier (store_state.cpp)
  /// The address of granule `id` of `entry`'s home (the host pool or the device tier).
  [[nodiscard]] std::byte* block_address(const Entry& entry, uint32_t id) const {
    return home_pool(entry).block_address(id);
  }
  /// The pool `entry`'s granules are in. Asked once per entry in the planners' loops, not once
  /// per granule: without a device tier it is the host pool with no virtual call (the residency
  /// is the home's, behind GranuleHome).
  [[nodiscard]] const BlockPool& home_pool(const Entry& entry) const {
    return device_tier_ && entry.residency() == Residency::kDevicePool ? device_tier_->pool()
                                                                       : pool_;
  }
  /// True when a store from a tensor on `device_index` keeps device copies (the tier is on and
  /// lives on that device).
  [[nodiscard]] bool keeps_device_copies(Device device, int device_index) const {
    return device_tier_ && device == Device::kCuda && device_index == device_tier_->device();
  }
  /// True when the device-resident tier is on.
  [[nodiscard]] bool has_device_tier() const noexcept { return device_tier_ != nullptr; }
  /// The device the tier lives on (the tier must be on).
  [[nodiscard]] int device_tier_device() const noexcept { return device_tier_->device(); }
  /// The tier's counters: restores served from it, device copies lost to a failure.
  void count_device_hits(uint64_t n) const noexcept {
    device_tier_->hits.fetch_add(n, std::memory_order_relaxed);
  }
  void count_device_errors(uint64_t n) const noexcept {
    device_tier_->errors.fetch_add(n, std::memory_order_relaxed);
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

 private:
  // The catalog: the entries, the pools and the index with its mutex, reached through the
  // functions above only (the pool read-only through pool()). Private members are declared
  // here, among the public ones, because member order is construction and destruction order.
  // Every entry's node (entry_pool.hpp): declared before the pool, so it outlives every entry.
  EntryPool entries_;
  BlockPool pool_;
  // Granules of dropped entries whose copies were in flight: returned after the device path
  // drained and before the pool goes.
  DeferredRelease deferred_{pool_};
  // The device-resident tier (hidden_state_device_cache_size; null: off, or its allocation at
  // construction failed: device_tier_failed_) and where its granules wait for in-flight kernels.
  std::unique_ptr<DeviceTier> device_tier_;
  std::unique_ptr<DeferredRelease> device_deferred_;
  bool device_tier_failed_ = false;

  /// open_record's insertion: `key`'s record, empty and outside the LRU (no eviction takes it,
  /// no walk finds an entry in it), with room for `slots` slots.
  KeyRecord& insert_empty_record(const IndexLock& lock, const CacheEngineKey& key, size_t slots);
  /// Where `entry`'s granules wait for a fence before going back to its home pool.
  [[nodiscard]] DeferredRelease* release_after_fence(const Entry& entry) noexcept {
    return device_tier_ && entry.residency() == Residency::kDevicePool ? device_deferred_.get()
                                                                       : &deferred_;
  }

 public:
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
  /// The index read-only, for a holder of the lock only (its token): lookups, sizes, totals.
  /// Every change goes through the named operations of this class.
  [[nodiscard]] const StoreIndex& index(const IndexLock& lock) const {
    (void)lock;
    return index_;
  }
  /// `key`'s record to change (its guard, a write's plan mark; for open_record and touch), or
  /// null. Through `lookups` (chunk `chunk` of their list) when given.
  [[nodiscard]] KeyRecord* find_record(const IndexLock& lock, const CacheEngineKey& key,
                                       RecordLookups* lookups = nullptr, size_t chunk = 0) {
    (void)lock;
    return lookups != nullptr ? lookups->find(index_, chunk, key) : index_.find(key);
  }
  /// The keys of `chunks` that are held become off limits to the evictions of store call
  /// `guard` (its own inserts must not evict the prefix it reads or extends).
  void guard_keys(const IndexLock& lock, std::span<const Chunk> chunks, uint64_t guard) {
    for (const Chunk& chunk : chunks) {
      if (KeyRecord* record = find_record(lock, chunk.key)) record->guard = guard;
    }
  }
  /// `record` becomes the most recently used key.
  void touch(const IndexLock& lock, KeyRecord& record) noexcept {
    (void)lock;
    index_.touch(record);
  }
  /// Every slot of `key` dropped (drop_key): false when it was not held.
  bool drop_key(const IndexLock& lock, const CacheEngineKey& key) noexcept {
    (void)lock;
    return index_.erase(key) > 0;
  }
  /// Every key dropped (close).
  void drop_all(const IndexLock& lock) noexcept {
    (void)lock;
    index_.clear();
  }
  /// Room for `keys` more keys: a batch's inserts never rehash the map (std::bad_alloc).
  void reserve_keys(const IndexLock& lock, size_t keys) {
    (void)lock;
    index_.reserve_keys(keys);
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
