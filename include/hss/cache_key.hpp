#pragma once
// Chunk keys shared by KV and hidden states. Plain values: safe to copy and read from any thread.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace hss {

/// Identity of the worker whose cache this is; every key carries it.
struct Metadata {
  std::string fmt = "vllm";
  std::string model_name;
  int64_t world_size = 1;
  int64_t worker_id = 0;
  std::string kv_dtype = "bfloat16";
};

/// The key of one chunk, identical for its KV and its hidden states (LMCache's CacheEngineKey).
struct CacheEngineKey {
  std::string fmt = "vllm";
  std::string model_name;
  int64_t world_size = 1;
  int64_t worker_id = 0;
  uint64_t chunk_hash = 0;
  std::string kv_dtype = "bfloat16";

  /// Field-wise equality, the cheap and most distinguishing fields first: keys of one store
  /// almost always share the strings, so comparing them first would cost a memcmp per probe.
  friend bool operator==(const CacheEngineKey& a, const CacheEngineKey& b) noexcept {
    return a.chunk_hash == b.chunk_hash && a.worker_id == b.worker_id &&
           a.world_size == b.world_size && a.model_name == b.model_name && a.fmt == b.fmt &&
           a.kv_dtype == b.kv_dtype;
  }

  /// "fmt@model_name@world_size@worker_id@<16 hex digits>@kv_dtype".
  [[nodiscard]] std::string to_string() const;
};

/// One chunk of a token sequence: tokens [start, end) and its key.
struct Chunk {
  int64_t start = 0;
  int64_t end = 0;
  CacheEngineKey key;

  [[nodiscard]] int64_t size() const { return end - start; }
};

}  // namespace hss

template <>
struct std::hash<hss::CacheEngineKey> {
  size_t operator()(const hss::CacheEngineKey& key) const noexcept {
    // chunk_hash is already a strong 64-bit hash; mix in the identity cheaply so keys of two
    // workers that share a store do not collide on one bucket.
    size_t h = static_cast<size_t>(key.chunk_hash);
    h ^= std::hash<int64_t>{}(key.worker_id) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};
