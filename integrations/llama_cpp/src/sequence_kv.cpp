#include "hss_llama/sequence_kv.hpp"

#include <string>

#include "hss/error.hpp"

namespace hss::llama_cpp {

SequenceKv::SequenceKv(int n_sequences) {
  if (n_sequences <= 0) {
    throw InvalidArgument("n_sequences: must be > 0, got " + std::to_string(n_sequences));
  }
  held_.resize(static_cast<size_t>(n_sequences));
}

bool SequenceKv::contains(const CacheEngineKey& key) const {
  const std::lock_guard lock(mutex_);
  return counts_.contains(key);
}

std::span<const Chunk> SequenceKv::chunks(int seq) const { return held_.at(seq).chunks; }
std::span<const int32_t> SequenceKv::tokens(int seq) const { return held_.at(seq).tokens; }

void SequenceKv::assign(int seq, std::span<const Chunk> chunks, std::span<const int32_t> tokens) {
  clear(seq);
  Held& held = held_.at(seq);
  for (const Chunk& chunk : chunks) {
    held.chunks.push_back(chunk);
    add_key(chunk.key);
  }
  held.tokens.assign(tokens.begin(), tokens.end());
}

void SequenceKv::append(int seq, const Chunk& chunk, std::span<const int32_t> chunk_tokens) {
  Held& held = held_.at(seq);
  held.chunks.push_back(chunk);
  held.tokens.insert(held.tokens.end(), chunk_tokens.begin(), chunk_tokens.end());
  add_key(chunk.key);
}

void SequenceKv::clear(int seq) {
  Held& held = held_.at(seq);
  for (const Chunk& chunk : held.chunks) remove_key(chunk.key);
  held.chunks.clear();
  held.tokens.clear();
}

void SequenceKv::add_key(const CacheEngineKey& key) {
  const std::lock_guard lock(mutex_);
  ++counts_[key];
}

void SequenceKv::remove_key(const CacheEngineKey& key) {
  const std::lock_guard lock(mutex_);
  auto it = counts_.find(key);
  if (it != counts_.end() && --it->second == 0) counts_.erase(it);
}

}  // namespace hss::llama_cpp
