#pragma once
// hss::LocalCpuBackend: the KV chunk store, on a host pool of its own (max_local_cpu_size GiB).
//
// Copies happen outside the index lock on entries pinned by reference count, so an eviction never
// reuses bytes in use. Thread safety and blocking: docs/design.md, "What may run concurrently and
// what may block the host".

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "hss/cache_key.hpp"
#include "hss/storage_manager.hpp"

namespace hss {

struct KvStats {
  uint64_t chunks_held = 0;
  uint64_t bytes_held = 0;
  uint64_t capacity_bytes = 0;
  uint64_t puts = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t put_failures = 0;  ///< chunk larger than the whole pool
};

class LocalCpuBackend final : public StorageManager {
 public:
  /// capacity_bytes > 0, else InvalidArgument. Chunks are allocated individually, counted
  /// against capacity_bytes.
  explicit LocalCpuBackend(uint64_t capacity_bytes);
  ~LocalCpuBackend() override;

  /// Stores a copy of `bytes` under key, evicting least-recently-used chunks as needed. Replaces an
  /// existing entry. False when it cannot fit (nothing changed then).
  bool put(const CacheEngineKey& key, std::span<const std::byte> bytes);
  /// Copies the chunk into `out` and refreshes its LRU position. Returns its size, or nullopt
  /// when absent. `out` smaller than the chunk: InvalidArgument, nothing changed.
  std::optional<size_t> get(const CacheEngineKey& key, std::span<std::byte> out);
  /// Size of the held chunk, without touching LRU.
  [[nodiscard]] std::optional<size_t> size_of(const CacheEngineKey& key) const;
  bool remove(const CacheEngineKey& key);
  [[nodiscard]] bool contains(const CacheEngineKey& key) const override;
  /// Keys in LRU order, least recent first (tests, tools).
  [[nodiscard]] std::vector<CacheEngineKey> keys_lru_order() const;
  [[nodiscard]] KvStats stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hss
