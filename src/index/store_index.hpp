#pragma once
// The hidden-state store's index: entries per (key, kind, layer), per-key LRU. Not synchronised:
// the store guards it with its index mutex and keeps every copy outside that lock.
//
// Exception safety: every mutating method here is noexcept once its inputs exist. Allocation (map
// nodes, slot vectors) happens in insert_empty() and the callers' slot reserves, before a store
// applies anything: a new key's record goes into the map empty and outside the LRU, so no
// eviction, walk or total sees it, and the call that inserted it either fills it (add_pending)
// or erases it again (erase_if_empty) before its locked section ends. So a store reserves
// everything first and then applies its plan without a throw in the middle, and outside a
// store's locked section no record is empty. The LRU is intrusive (links in each KeyRecord,
// which never moves: map nodes are stable, rehash included), so it allocates nothing and finding
// a victim needs no map lookup.
//
// Map nodes and slot vectors come from the index's own NodePool (node_pool.hpp), not the heap: a
// new key costs two free-list pops instead of two mallocs. The pool is unsynchronised like the
// rest of the index: the map and every slot vector are filled, emptied and destroyed with the
// index mutex held.
//
// Every change of an entry's state (EntryState, below) is one StoreIndex method: add_pending,
// publish, withdraw, erase, erase_slot, detach_slot, clear. The store, the remote tier's
// read-through and the pool-transfer import all go through them.

#include <algorithm>
#include <array>
#include <cassert>
#include <cstdint>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "datapath/data_path.hpp"
#include "format/row_format.hpp"
#include "hss/activation.hpp"
#include "hss/cache_key.hpp"
#include "index/node_pool.hpp"
#include "pool/block_pool.hpp"
#include "pool/deferred_release.hpp"

namespace hss::detail {

// clang-format off: the diagram is drawn to the column.
/// The state of one entry, one (key, kind, layer) slot. Guarded by the index mutex; changed only
/// by the StoreIndex methods named on the arrows.
///
///              add_pending                  publish
///   (made) -------------------> PENDING -------------------> READY
///                                  |                            |
///                                  | withdraw                   | erase / erase_slot /
///                                  | (copy failed, import       | detach_slot / clear
///                                  |  rejected or abandoned,    | (pool pressure, KV gone,
///                                  |  erase of its key)         |  drop_key, another shape, a
///                                  |                            |  failed device copy seen by a
///                                  |                            |  walk, close)
///                                  v                            v
///                               DETACHED <----------------------+
///                                  |
///                                  | the last reference drops (pins: retrieves, device restores,
///                                  v  leases, the write-behind queue) and its fence has settled
///                          granules back to the pool (~Entry, or DeferredRelease)
///
///   PENDING   in its key's record but invisible to walks and never an eviction victim: its bytes
///             are being written (a host store's copy, an import's transfer, a fetched remote
///             value). Not counted in the index totals.
///   READY     visible to walks and counted. A device store publishes as soon as its copies are
///             enqueued, so a READY entry may carry a fence that has not settled
///             (copy_in_flight()): it is then busy (no eviction); a host reader waits for the
///             fence, a device reader orders itself after it on the device, coverage() counts it;
///             a fence that failed makes the next walk erase the key (never served).
///   DETACHED  out of the index, for good: nothing makes it PENDING or READY again.
enum class EntryState : uint8_t { kPending, kReady, kDetached };
// clang-format on

/// One (key, kind, layer) of activations: rows x cols in `format` over granules of `home`.
/// Shared ownership is the pin: the index holds one reference, each retrieve copying it holds
/// another, and the granules return to their home with the last reference (after any copy into
/// them landed). Where the bytes are is the home's residency(); how they are encoded is
/// `format` (element type, scales): nothing about an entry assumes the host pool or a 16/32-bit
/// float.
struct Entry {
  Entry(GranuleHome& home_, int64_t rows_, int64_t cols_, RowFormat format_, Slot slot_)
      : home(home_), rows(rows_), cols(cols_), format(format_), slot(slot_) {}
  /// Never waits for a copy still landing in the blocks: they go to `deferred` and return to the
  /// pool once the fence is seen landed (only the cached flag is read here: this may run under
  /// the index lock). Without `deferred` (or out of memory) it waits, as a last resort.
  ~Entry() {
    if (fence && !fence->settled()) {
      if (deferred != nullptr && deferred->defer(blocks, fence)) return;
      (void)fence->wait();  // never hand back blocks a DMA may still write
    }
    home.release(blocks);
  }
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;

  [[nodiscard]] uint64_t payload_bytes() const { return format.payload_bytes(rows, cols); }
  [[nodiscard]] Residency residency() const noexcept { return home.residency(); }
  /// True while a device-to-host copy into the blocks may still be in flight, as last seen (the
  /// cached flag: no device query under the index lock; DevicePath::poll() refreshes it).
  [[nodiscard]] bool copy_in_flight() const { return fence && !fence->settled(); }
  /// True when the copy into the blocks failed, as last seen: the rows must never be served.
  [[nodiscard]] bool copy_failed() const { return fence && fence->failed(); }

  GranuleHome& home;  ///< the pool that lent the granules and takes them back
  BlockList blocks;   ///< empty until the home granted them (so a dropped plan releases nothing)
  const int64_t rows, cols;
  const RowFormat format;
  const Slot slot;
  std::shared_ptr<CopyFence> fence;     ///< set by device-path stores
  DeferredRelease* deferred = nullptr;  ///< where blocks wait for an in-flight copy (device path)
  /// The device-resident tier's copy of this entry (pool/device_tier.hpp; null: none): same
  /// rows, cols and format over granules of device memory, with the fence of the kernel that
  /// wrote it. Dropped with this entry, or alone for device-pool pressure. Guarded by the index
  /// mutex; a reader pins it as it pins the entry.
  std::shared_ptr<Entry> device_copy;
  EntryState state = EntryState::kPending;  ///< guarded by the index mutex (StoreIndex only)

  /// Published to walks (READY). Read under the index mutex.
  [[nodiscard]] bool ready() const { return state == EntryState::kReady; }

  /// The payload's xxHash3 and keyed MAC, computed once, when the entry is first exported (a
  /// READY entry's bytes never change; pool_transfer.hpp).
  struct Digest {
    uint64_t hash = 0;
    std::optional<std::array<std::byte, 32>> mac;
  };
  mutable std::once_flag digest_once;
  mutable Digest digest;
};
using EntryRef = std::shared_ptr<Entry>;

/// Every slot of one key plus its LRU links. Made in its map node, with the index's allocator
/// (uses-allocator construction), and never copied or moved: its node is stable.
struct KeyRecord {
  using allocator_type = std::pmr::polymorphic_allocator<std::byte>;
  explicit KeyRecord(const allocator_type& memory) : slots(memory) {}
  KeyRecord(const KeyRecord&) = delete;
  KeyRecord& operator=(const KeyRecord&) = delete;

  std::pmr::vector<EntryRef> slots;
  // StoreIndex's LRU list (front = least recently used), linked while the record is in the map.
  KeyRecord* lru_prev = nullptr;
  KeyRecord* lru_next = nullptr;
  const CacheEngineKey* key = nullptr;  ///< the map's key of this record (set when inserted)
  uint64_t guard = 0;        ///< id of the store call that may not evict this key (see StoreIndex)
  uint64_t planned = 0;      ///< id of the last store call that planned a write into it
  uint32_t ready_slots = 0;  ///< slots published (the key counts as cached when > 0)

  [[nodiscard]] EntryRef* find(Slot slot) {
    for (EntryRef& entry : slots) {
      if (entry->slot == slot) return &entry;
    }
    return nullptr;
  }
  [[nodiscard]] const EntryRef* find(Slot slot) const {
    for (const EntryRef& entry : slots) {
      if (entry->slot == slot) return &entry;
    }
    return nullptr;
  }
  /// True when `slot` holds a published entry of exactly `rows` rows (a tier read-through or a
  /// transfer export takes nothing less).
  [[nodiscard]] bool holds_ready(Slot slot, int64_t rows) const {
    const EntryRef* entry = find(slot);
    return entry != nullptr && (*entry)->ready() && (*entry)->rows == rows;
  }
  /// True when no slot may be evicted now (a copy into it is pending or in flight).
  [[nodiscard]] bool busy() const {
    for (const EntryRef& entry : slots) {
      if (!entry->ready() || entry->copy_in_flight()) return true;
    }
    return false;
  }
  /// True when evicting the key would return its granules to the pool now (nobody pins them).
  [[nodiscard]] bool freeable() const {
    for (const EntryRef& entry : slots) {
      if (entry.use_count() != 1) return false;
    }
    return true;
  }
};

/// Index + LRU (front = least recently used) + accounting of the READY entries.
class StoreIndex {
 public:
  using Map = std::pmr::unordered_map<CacheEngineKey, KeyRecord>;

  StoreIndex() = default;
  StoreIndex(const StoreIndex&) = delete;  // the map's nodes live in this index's pool
  StoreIndex& operator=(const StoreIndex&) = delete;

  [[nodiscard]] KeyRecord* find(const CacheEngineKey& key) {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }
  [[nodiscard]] const KeyRecord* find(const CacheEngineKey& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }

  /// Makes sure the map can take `extra` more keys without rehashing (may throw; the rehash
  /// itself is invisible): a batch sizes the map once for all its new keys.
  void reserve_keys(size_t extra) { map_.reserve(map_.size() + extra); }

  /// The record of `key`, which find() did not find: inserted with no slot, room for `slots`,
  /// and outside the LRU (so no eviction picks it and no walk finds a slot in it). May throw
  /// std::bad_alloc (then nothing was inserted). The caller fills it with add_pending or erases
  /// it with erase_if_empty before its locked section ends.
  KeyRecord& insert_empty(const CacheEngineKey& key, size_t slots) {
    auto [it, inserted] = map_.try_emplace(key);
    assert(inserted && it->second.slots.empty());
    (void)inserted;
    try {
      it->second.slots.reserve(slots);
    } catch (...) {
      map_.erase(it);
      throw;
    }
    it->second.key = &it->first;
    return it->second;
  }

  /// Erases `record` when it has no slot (left by insert_empty, or by detach_slot of its last
  /// slot, and not filled after all); nothing otherwise.
  void erase_if_empty(KeyRecord& record) noexcept {
    if (!record.slots.empty()) return;
    if (linked(record)) unlink(record);
    map_.erase(map_.find(*record.key));  // by iterator: the key lives in the node erased
    ++erasures_;
  }

  /// (made) -> PENDING: `entry` (granules granted, state kPending) joins `record` (found since
  /// the last erasure, or from insert_empty), which is touched (linked at the MRU end when new)
  /// and guarded by `guard`. Requires room in its slot vector; then it does not throw.
  void add_pending(KeyRecord& record, EntryRef entry, uint64_t guard) noexcept {
    assert(record.slots.size() < record.slots.capacity());
    record.guard = guard;
    touch(record);
    entry->state = EntryState::kPending;
    record.slots.push_back(std::move(entry));  // capacity reserved by the caller
  }

  /// PENDING -> READY, when `entry` is still `key`'s entry for its slot (an erase meanwhile left
  /// it DETACHED: then nothing happens and false is returned). `hint`: the key's record as the
  /// caller found it, valid when no key was erased since (erasures()); nullptr to look it up.
  bool publish(const CacheEngineKey& key, Entry& entry, KeyRecord* hint = nullptr) noexcept {
    if (entry.state != EntryState::kPending) return false;
    KeyRecord* record = hint != nullptr ? hint : find(key);
    if (record == nullptr) return false;
    const EntryRef* held = record->find(entry.slot);
    if (held == nullptr || held->get() != &entry) return false;
    entry.state = EntryState::kReady;
    if (record->ready_slots++ == 0) ++ready_keys_;
    ++ready_entries_;
    bytes_held_ += entry.payload_bytes();
    blocks_held_ += entry.blocks.size();
    auto& kind = per_kind_[static_cast<size_t>(entry.slot.kind)];
    ++kind.entries;
    kind.bytes += entry.payload_bytes();
    return true;
  }

  /// PENDING -> DETACHED: a store whose copy failed, an import rejected or abandoned. Nothing
  /// happens when the entry is no longer the key's (already DETACHED).
  void withdraw(const CacheEngineKey& key, const Entry& entry) noexcept { erase_slot(key, &entry); }

  /// Moves the record to the MRU end (a record from insert_empty joins the LRU there).
  void touch(KeyRecord& record) noexcept {
    if (lru_tail_ == &record) return;
    if (linked(record)) unlink(record);
    link_back(record);
  }

  /// Counts the keys removed so far (erase, erase_slot of a last slot, clear). A KeyRecord
  /// pointer found while erasures() had a value stays valid as long as it keeps that value (map
  /// nodes never move, rehash included): callers cache lookups across the phases of a call and
  /// across the items of a batch, and look up again only when this changed.
  [[nodiscard]] uint64_t erasures() const noexcept { return erasures_; }

  /// Removes the key. Entries nobody else pins die here (their granules go back to the pool);
  /// pinned ones when their last reader lets go. Returns the number of READY entries removed.
  size_t erase(const CacheEngineKey& key) noexcept {
    auto it = map_.find(key);
    if (it == map_.end()) return 0;
    size_t ready = 0;
    for (const EntryRef& entry : it->second.slots) {
      ready += entry->ready() ? 1 : 0;
      detach(it->second, *entry);
    }
    if (linked(it->second)) unlink(it->second);
    map_.erase(it);
    ++erasures_;
    return ready;
  }

  /// Removes one slot's entry (READY or PENDING -> DETACHED: a withdrawal); drops the key when it
  /// was the last.
  void erase_slot(const CacheEngineKey& key, const Entry* entry) noexcept {
    auto it = map_.find(key);
    if (it == map_.end()) return;
    detach_slot(it->second, entry);
    erase_if_empty(it->second);
  }

  /// Removes `entry` from `record` (READY or PENDING -> DETACHED: an entry another shape
  /// replaces), keeping the record, even with no slot left: the replacing entry joins it with
  /// add_pending, or the caller erases it with erase_if_empty. Nothing when `entry` is not there.
  void detach_slot(KeyRecord& record, const Entry* entry) noexcept {
    auto& slots = record.slots;
    for (auto s = slots.begin(); s != slots.end(); ++s) {
      if (s->get() == entry) {
        detach(record, **s);
        slots.erase(s);
        return;
      }
    }
  }

  /// The least recently used key that is not busy, not guarded by store call `guard`, and (when
  /// `freeable_only`) pinned by nobody; nullptr if none.
  [[nodiscard]] const CacheEngineKey* eviction_candidate(uint64_t guard,
                                                         bool freeable_only) const noexcept {
    for (const KeyRecord* record = lru_head_; record != nullptr; record = record->lru_next) {
      if (guard != 0 && record->guard == guard) continue;
      if (record->busy() || (freeable_only && !record->freeable())) continue;
      return record->key;
    }
    return nullptr;
  }

  /// Every entry -> DETACHED (close()).
  void clear() noexcept {
    for (auto& [key, record] : map_) {
      for (const EntryRef& entry : record.slots) entry->state = EntryState::kDetached;
    }
    map_.clear();
    lru_head_ = lru_tail_ = nullptr;
    lru_size_ = 0;
    ++erasures_;
    ready_entries_ = bytes_held_ = blocks_held_ = ready_keys_ = 0;
    per_kind_ = {};
  }

  /// The least recently used key's record (nullptr: none); lru_next walks on.
  [[nodiscard]] const KeyRecord* lru_front() const noexcept { return lru_head_; }

  template <typename Fn>
  void for_each_lru(Fn&& fn) const {
    for (const KeyRecord* record = lru_head_; record != nullptr; record = record->lru_next) {
      fn(*record->key, *record);
    }
  }

  struct KindTotals {
    uint64_t entries = 0;
    uint64_t bytes = 0;
  };
  [[nodiscard]] size_t keys() const { return map_.size(); }
  /// Keys with at least one READY slot (LMCache's num_cached_chunks).
  [[nodiscard]] uint64_t ready_keys() const { return ready_keys_; }
  [[nodiscard]] size_t lru_size() const { return lru_size_; }
  [[nodiscard]] uint64_t ready_entries() const { return ready_entries_; }
  [[nodiscard]] uint64_t bytes_held() const { return bytes_held_; }
  [[nodiscard]] uint64_t blocks_held() const { return blocks_held_; }
  /// The pool of the map's nodes and the records' slot vectors (tests, check_invariants).
  [[nodiscard]] const NodePool& node_memory() const { return node_memory_; }
  [[nodiscard]] const KindTotals& kind_totals(ActivationKind kind) const {
    return per_kind_[static_cast<size_t>(kind)];
  }

 private:
  void link_back(KeyRecord& record) noexcept {
    record.lru_prev = lru_tail_;
    record.lru_next = nullptr;
    (lru_tail_ != nullptr ? lru_tail_->lru_next : lru_head_) = &record;
    lru_tail_ = &record;
    ++lru_size_;
  }
  /// True when `record` is in the LRU (every record but one from insert_empty not filled yet).
  [[nodiscard]] bool linked(const KeyRecord& record) const noexcept {
    return record.lru_prev != nullptr || lru_head_ == &record;
  }
  void unlink(KeyRecord& record) noexcept {
    (record.lru_prev != nullptr ? record.lru_prev->lru_next : lru_head_) = record.lru_next;
    (record.lru_next != nullptr ? record.lru_next->lru_prev : lru_tail_) = record.lru_prev;
    record.lru_prev = record.lru_next = nullptr;
    --lru_size_;
  }

  /// READY or PENDING -> DETACHED; a READY entry leaves the totals. The caller removes it from
  /// the record.
  void detach(KeyRecord& record, Entry& entry) noexcept {
    const bool was_ready = entry.ready();
    entry.state = EntryState::kDetached;
    if (!was_ready) return;
    if (--record.ready_slots == 0) --ready_keys_;
    --ready_entries_;
    bytes_held_ -= entry.payload_bytes();
    blocks_held_ -= entry.blocks.size();
    auto& kind = per_kind_[static_cast<size_t>(entry.slot.kind)];
    --kind.entries;
    kind.bytes -= entry.payload_bytes();
  }

  NodePool node_memory_;  // before map_: it outlives every node and slot vector
  Map map_{&node_memory_};
  KeyRecord* lru_head_ = nullptr;  // least recently used
  KeyRecord* lru_tail_ = nullptr;  // most recently used
  size_t lru_size_ = 0;
  uint64_t ready_entries_ = 0;
  uint64_t bytes_held_ = 0;
  uint64_t blocks_held_ = 0;
  uint64_t ready_keys_ = 0;
  uint64_t erasures_ = 0;
  std::array<KindTotals, kNumActivationKinds> per_kind_{};
};

/// The KeyRecords of one chunk list, each looked up once and reused while no key was erased
/// (StoreIndex::erasures): the phases of a store, and the items of a batch that share a token
/// list (the layers of a request), share one lookup per chunk. Only hits are cached, so a key
/// inserted meanwhile is found. Used under the index lock only.
class RecordLookups {
 public:
  explicit RecordLookups(size_t chunks = 0) : size_(chunks) {
    if (chunks > kInline) heap_.assign(chunks, nullptr);
  }

  [[nodiscard]] KeyRecord* find(StoreIndex& index, size_t chunk,
                                const CacheEngineKey& key) noexcept {
    sync(index);
    KeyRecord*& cached = records()[chunk];
    if (cached == nullptr) cached = index.find(key);
    return cached;
  }
  [[nodiscard]] const KeyRecord* find(const StoreIndex& index, size_t chunk,
                                      const CacheEngineKey& key) noexcept {
    sync(index);
    KeyRecord*& cached = records()[chunk];
    // The cache holds what a non-const caller may modify; a const caller only reads through it.
    if (cached == nullptr) cached = const_cast<KeyRecord*>(index.find(key));
    return cached;
  }
  /// Records `record` as chunk `chunk`'s (just inserted, or found by the caller).
  void remember(const StoreIndex& index, size_t chunk, KeyRecord& record) noexcept {
    sync(index);
    records()[chunk] = &record;
  }

 private:
  static constexpr size_t kInline = 8;  // a short prompt's chunks: no allocation

  // Computed, not stored: a moved RecordLookups must not point into its old inline array.
  [[nodiscard]] KeyRecord** records() noexcept {
    return size_ > kInline ? heap_.data() : inline_.data();
  }
  void sync(const StoreIndex& index) noexcept {
    if (epoch_ == index.erasures()) return;
    std::fill_n(records(), size_, nullptr);
    epoch_ = index.erasures();
  }

  size_t size_;
  std::array<KeyRecord*, kInline> inline_{};
  std::vector<KeyRecord*> heap_;
  uint64_t epoch_ = 0;
};

}  // namespace hss::detail
