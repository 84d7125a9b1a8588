#pragma once
// SequenceKv: the hidden-state store's StorageManager for a llama.cpp context. It answers "is KV
// still held for this chunk?" from the llama.cpp sequences themselves: a chunk key is present
// while some sequence holds that chunk's tokens in its KV cells. The Thinker tells it every change
// it makes to a sequence (cells copied, removed, decoded), right after llama.cpp made it, so a
// prefix llama.cpp no longer holds is never served from the store (the store drops its rows
// lazily, counted in stats().coupled_evictions).
//
// Thread safety: contains() may be called from any thread (the store calls it outside its locks);
// the writers are the engine thread's. One mutex guards the key counts only.

#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "hss/cache_key.hpp"
#include "hss/storage_manager.hpp"

namespace hss::llama_cpp {

class SequenceKv final : public StorageManager {
 public:
  explicit SequenceKv(int n_sequences);

  [[nodiscard]] bool contains(const CacheEngineKey& key) const override;

  /// The chunks sequence `seq` holds, in order (tokens [0, chunks.back().end)). Engine thread.
  [[nodiscard]] std::span<const Chunk> chunks(int seq) const;
  /// The tokens sequence `seq` holds. Engine thread.
  [[nodiscard]] std::span<const int32_t> tokens(int seq) const;

  /// Sequence `seq` now holds `chunks` of `tokens` (its old chunks are gone).
  void assign(int seq, std::span<const Chunk> chunks, std::span<const int32_t> tokens);
  /// Sequence `seq` now also holds `chunk` (decoded after its last one), whose tokens are these.
  void append(int seq, const Chunk& chunk, std::span<const int32_t> chunk_tokens);
  /// Sequence `seq` holds nothing (llama.cpp dropped it).
  void clear(int seq);

 private:
  void add_key(const CacheEngineKey& key);
  void remove_key(const CacheEngineKey& key);

  struct Held {
    std::vector<Chunk> chunks;
    std::vector<int32_t> tokens;
  };
  std::vector<Held> held_;
  mutable std::mutex mutex_;  // guards counts_ only
  std::unordered_map<CacheEngineKey, int> counts_;
};

}  // namespace hss::llama_cpp
