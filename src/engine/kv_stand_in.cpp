#include "hss/local_cpu_backend.hpp"

#include <cstring>
#include <iterator>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "hss/error.hpp"

namespace hss {

namespace {

// One chunk's bytes. Shared so a reader can keep them alive after dropping the index lock: an
// eviction racing with the copy then only detaches the entry from the index, and the last owner
// frees the memory.
using Payload = std::shared_ptr<std::byte[]>;

struct Entry {
  CacheEngineKey key;
  Payload data;
  size_t size = 0;
};

}  // namespace

class LocalCpuBackend::Impl {
 public:
  explicit Impl(uint64_t capacity_bytes) : capacity_(capacity_bytes) {
    stats_.capacity_bytes = capacity_bytes;
  }

  bool put(const CacheEngineKey& key, std::span<const std::byte> bytes) {
    if (bytes.size() > capacity_) {
      std::lock_guard lock(mutex_);
      ++stats_.put_failures;
      return false;
    }
    // Allocate and copy before taking the lock, so a large put does not stall every reader. The
    // list node is staged too: under the lock only splices (which cannot throw) move entries.
    std::list<Entry> staged;
    staged.push_back(
        Entry{key, std::make_shared_for_overwrite<std::byte[]>(bytes.size()), bytes.size()});
    if (!bytes.empty()) std::memcpy(staged.front().data.get(), bytes.data(), bytes.size());

    // Replaced and evicted entries end here and are freed after the lock is released: returning
    // big buffers to the allocator is not index work.
    std::list<Entry> released;
    {
      std::lock_guard lock(mutex_);
      // The only step that may throw, and it comes before anything is changed.
      const auto [it, inserted] = index_.try_emplace(key);
      if (!inserted) {
        // The old version goes first so that replacing a chunk with one of the same size never
        // evicts a neighbour.
        stats_.bytes_held -= it->second->size;
        released.splice(released.end(), lru_, it->second);
      }
      while (stats_.bytes_held + bytes.size() > capacity_) {
        // Cannot run dry: bytes.size() <= capacity_, and an empty list holds zero bytes.
        const auto victim = lru_.begin();
        index_.erase(victim->key);
        stats_.bytes_held -= victim->size;
        released.splice(released.end(), lru_, victim);
        ++stats_.evictions;
      }
      lru_.splice(lru_.end(), staged);
      it->second = std::prev(lru_.end());
      stats_.bytes_held += bytes.size();
      ++stats_.puts;
    }
    return true;
  }

  std::optional<size_t> get(const CacheEngineKey& key, std::span<std::byte> out) {
    Payload pinned;
    size_t size = 0;
    {
      std::lock_guard lock(mutex_);
      const auto it = index_.find(key);
      if (it == index_.end()) {
        ++stats_.misses;
        return std::nullopt;
      }
      size = it->second->size;
      if (out.size() < size) {
        // Checked before touching LRU or counters: a call that throws changes nothing.
        throw InvalidArgument("LocalCpuBackend::get: out must hold at least " +
                              std::to_string(size) +
                              " bytes, got out.size() = " + std::to_string(out.size()));
      }
      lru_.splice(lru_.end(), lru_, it->second);
      ++stats_.hits;
      pinned = it->second->data;
    }
    if (size != 0) std::memcpy(out.data(), pinned.get(), size);
    return size;
  }

  std::optional<size_t> size_of(const CacheEngineKey& key) const {
    std::lock_guard lock(mutex_);
    const auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    return it->second->size;
  }

  bool remove(const CacheEngineKey& key) {
    // Declared before the lock, so the bytes are freed after unlocking.
    std::list<Entry> released;
    std::lock_guard lock(mutex_);
    const auto it = index_.find(key);
    if (it == index_.end()) return false;
    stats_.bytes_held -= it->second->size;
    released.splice(released.end(), lru_, it->second);
    index_.erase(it);
    return true;
  }

  bool contains(const CacheEngineKey& key) const {
    std::lock_guard lock(mutex_);
    return index_.contains(key);
  }

  std::vector<CacheEngineKey> keys_lru_order() const {
    std::lock_guard lock(mutex_);
    std::vector<CacheEngineKey> keys;
    keys.reserve(lru_.size());
    for (const Entry& entry : lru_) keys.push_back(entry.key);
    return keys;
  }

  KvStats stats() const {
    std::lock_guard lock(mutex_);
    KvStats snapshot = stats_;
    snapshot.chunks_held = lru_.size();
    return snapshot;
  }

 private:
  using Index = std::unordered_map<CacheEngineKey, std::list<Entry>::iterator>;

  const uint64_t capacity_;  // read without the lock: it never changes
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // least recently used first
  Index index_;
  KvStats stats_;  // chunks_held is derived from lru_ when a snapshot is taken
};

LocalCpuBackend::LocalCpuBackend(uint64_t capacity_bytes) {
  if (capacity_bytes == 0) {
    throw InvalidArgument("LocalCpuBackend: capacity_bytes must be > 0, got " +
                          std::to_string(capacity_bytes));
  }
  impl_ = std::make_unique<Impl>(capacity_bytes);
}

LocalCpuBackend::~LocalCpuBackend() = default;

bool LocalCpuBackend::put(const CacheEngineKey& key, std::span<const std::byte> bytes) {
  return impl_->put(key, bytes);
}

std::optional<size_t> LocalCpuBackend::get(const CacheEngineKey& key, std::span<std::byte> out) {
  return impl_->get(key, out);
}

std::optional<size_t> LocalCpuBackend::size_of(const CacheEngineKey& key) const {
  return impl_->size_of(key);
}

bool LocalCpuBackend::remove(const CacheEngineKey& key) { return impl_->remove(key); }

bool LocalCpuBackend::contains(const CacheEngineKey& key) const { return impl_->contains(key); }

std::vector<CacheEngineKey> LocalCpuBackend::keys_lru_order() const {
  return impl_->keys_lru_order();
}

KvStats LocalCpuBackend::stats() const { return impl_->stats(); }

}  // namespace hss
