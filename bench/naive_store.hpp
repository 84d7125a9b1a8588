#pragma once
// The naive store every figure can be held against: the shape of LMCache's Python hidden-state
// store without the interpreter. A hash map from (chunk hash, layer) to a per-chunk
// std::vector<float> allocated on store, a std::list LRU, and a retrieve that concatenates the
// chunks into a new vector (torch.cat). Keys come from the same ChunkedTokenDatabase as hsstore's,
// so the contrast is the storage design alone.
//
// Not thread-safe (the Python store runs under the GIL).

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "hss/tensor.hpp"
#include "hss/token_database.hpp"

namespace hss::bench {

class NaiveStore {
 public:
  NaiveStore(const TokenDatabase& db, size_t capacity_bytes)
      : db_(db), capacity_bytes_(capacity_bytes) {}

  /// Stores the full chunks starting at or after token_offset (hidden has len - offset rows),
  /// widening to float32; evicts LRU entries beyond the capacity. Returns chunks written.
  int64_t store(std::span<const int32_t> tokens, const TensorView& hidden, int64_t layer,
                int64_t token_offset = 0);
  /// Rows [row_begin, end) of the longest cached prefix of the layer, concatenated into a new
  /// vector (rows x cols); rows = 0 on a miss or row_begin past the prefix.
  struct Result {
    std::vector<float> values;
    int64_t rows = 0;
  };
  [[nodiscard]] Result retrieve(std::span<const int32_t> tokens, int64_t layer,
                                int64_t row_begin = 0);
  void clear();
  [[nodiscard]] size_t bytes_held() const { return bytes_held_; }

 private:
  struct Key {
    uint64_t hash;
    int64_t layer;
    friend bool operator==(const Key&, const Key&) = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const noexcept {
      return static_cast<size_t>(k.hash ^ (static_cast<uint64_t>(k.layer) * 0x9E3779B97F4A7C15ULL));
    }
  };
  struct Node {
    std::vector<float> values;
    int64_t start = 0;  // first token of the chunk
    int64_t cols = 0;
    std::list<Key>::iterator lru;
  };

  const TokenDatabase& db_;
  size_t capacity_bytes_;
  size_t bytes_held_ = 0;
  std::unordered_map<Key, Node, KeyHash> map_;
  std::list<Key> lru_;  // front = most recently used
};

}  // namespace hss::bench
