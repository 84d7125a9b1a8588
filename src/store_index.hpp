#pragma once
// The hidden-state store's index: entries per (key, layer), per-key LRU. Not synchronised: the
// store guards it with its index mutex and keeps every copy outside that lock.

#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "block_pool.hpp"
#include "data_path.hpp"
#include "hss/cache_key.hpp"

namespace hss::detail {

/// One (key, layer) of hidden states: rows x cols of `storage` over pool blocks. Shared
/// ownership is the pin: the index holds one reference, each retrieve copying it holds another,
/// and the blocks return to the pool with the last reference (after any copy into them landed).
struct Entry {
  Entry(BlockPool& pool_, int64_t rows_, int64_t cols_, kernels::ElemType storage_)
      : pool(pool_), rows(rows_), cols(cols_), storage(storage_) {}
  ~Entry() {
    if (fence) (void)fence->wait();  // never hand back blocks a DMA may still write
    pool.release(blocks);
  }
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;

  [[nodiscard]] uint64_t payload_bytes() const {
    return static_cast<uint64_t>(rows * cols) * kernels::elem_bytes(storage);
  }
  /// True while a device-to-host copy into the blocks may still be in flight.
  [[nodiscard]] bool copy_in_flight() const { return fence && !fence->ready(); }

  BlockPool& pool;
  BlockList blocks;
  const int64_t rows, cols;
  const kernels::ElemType storage;
  std::shared_ptr<CopyFence> fence;  ///< set by device-path stores
  bool ready = false;                ///< published to retrieve (guarded by the index mutex)
};
using EntryRef = std::shared_ptr<Entry>;

/// All layers of one key plus its LRU position.
struct KeyRecord {
  std::vector<std::pair<int64_t, EntryRef>> layers;
  std::list<const CacheEngineKey*>::iterator lru;

  [[nodiscard]] EntryRef* find(int64_t layer) {
    for (auto& [idx, entry] : layers) {
      if (idx == layer) return &entry;
    }
    return nullptr;
  }
  /// True when no layer may be evicted now (a copy into it is pending or in flight).
  [[nodiscard]] bool busy() const {
    for (const auto& [idx, entry] : layers) {
      if (!entry->ready || entry->copy_in_flight()) return true;
    }
    return false;
  }
};

/// Index + LRU (front = least recently used). Removed entries are moved to a graveyard so the
/// caller can destroy them after releasing its lock.
class StoreIndex {
 public:
  using Map = std::unordered_map<CacheEngineKey, KeyRecord>;

  [[nodiscard]] KeyRecord* find(const CacheEngineKey& key) {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }
  [[nodiscard]] const KeyRecord* find(const CacheEngineKey& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }

  /// The record of key, created at the MRU end when absent.
  KeyRecord& find_or_insert(const CacheEngineKey& key) {
    auto [it, inserted] = map_.try_emplace(key);
    if (inserted) it->second.lru = lru_.insert(lru_.end(), &it->first);
    return it->second;
  }

  void touch(KeyRecord& record) { lru_.splice(lru_.end(), lru_, record.lru); }

  /// Removes the key; its entries go to `graveyard`. Returns the number of ready entries removed.
  size_t erase(const CacheEngineKey& key, std::vector<EntryRef>& graveyard) {
    auto it = map_.find(key);
    if (it == map_.end()) return 0;
    size_t ready = 0;
    for (auto& [idx, entry] : it->second.layers) {
      ready += entry->ready ? 1 : 0;
      account_remove(*entry);
      graveyard.push_back(std::move(entry));
    }
    lru_.erase(it->second.lru);
    map_.erase(it);
    return ready;
  }

  /// Least recently used key that is not busy, or nullptr.
  [[nodiscard]] const CacheEngineKey* eviction_candidate() {
    for (const CacheEngineKey* key : lru_) {
      if (!map_.at(*key).busy()) return key;
    }
    return nullptr;
  }

  void account_publish(const Entry& entry) {
    ++ready_entries_;
    bytes_held_ += entry.payload_bytes();
    blocks_held_ += entry.blocks.size();
  }
  void account_remove(const Entry& entry) {
    if (!entry.ready) return;
    --ready_entries_;
    bytes_held_ -= entry.payload_bytes();
    blocks_held_ -= entry.blocks.size();
  }

  void clear(std::vector<EntryRef>& graveyard) {
    for (auto& [key, record] : map_) {
      for (auto& [idx, entry] : record.layers) graveyard.push_back(std::move(entry));
    }
    map_.clear();
    lru_.clear();
    ready_entries_ = bytes_held_ = blocks_held_ = 0;
  }

  [[nodiscard]] size_t keys() const { return map_.size(); }
  [[nodiscard]] uint64_t ready_entries() const { return ready_entries_; }
  [[nodiscard]] uint64_t bytes_held() const { return bytes_held_; }
  [[nodiscard]] uint64_t blocks_held() const { return blocks_held_; }

 private:
  Map map_;
  std::list<const CacheEngineKey*> lru_;
  uint64_t ready_entries_ = 0;
  uint64_t bytes_held_ = 0;
  uint64_t blocks_held_ = 0;
};

}  // namespace hss::detail
