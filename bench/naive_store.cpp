#include "naive_store.hpp"

#include <algorithm>
#include <cstring>

#include "hss/kernels/convert.hpp"

namespace hss::bench {

int64_t NaiveStore::store(std::span<const int32_t> tokens, const TensorView& hidden, int64_t layer,
                          int64_t token_offset) {
  int64_t written = 0;
  for (const Chunk& chunk : db_.process_tokens(tokens)) {
    if (chunk.start < token_offset) continue;
    const Key key{chunk.key.chunk_hash, layer};
    if (auto it = map_.find(key); it != map_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      continue;
    }
    // hidden_states[start:end].to(torch.float32).clone(): a new tensor per chunk.
    const int64_t n = chunk.size() * hidden.cols;
    Node node;
    node.cols = hidden.cols;
    node.start = chunk.start;
    node.values.resize(static_cast<size_t>(n));
    const int64_t row0 = chunk.start - token_offset;
    for (int64_t r = 0; r < chunk.size(); ++r) {
      const auto* src =
          static_cast<const std::byte*>(hidden.data) +
          (row0 + r) * hidden.stride() * static_cast<int64_t>(element_size(hidden.dtype));
      float* dst = node.values.data() + r * hidden.cols;
      if (hidden.dtype == DType::kFloat32) {
        std::memcpy(dst, src, static_cast<size_t>(hidden.cols) * sizeof(float));
      } else {
        const auto* in = reinterpret_cast<const uint16_t*>(src);
        for (int64_t c = 0; c < hidden.cols; ++c) {
          dst[c] = hidden.dtype == DType::kBFloat16 ? kernels::bf16_to_float(in[c])
                                                    : kernels::f16_to_float(in[c]);
        }
      }
    }
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    while (!lru_.empty() && bytes_held_ + bytes > capacity_bytes_) {
      auto victim = map_.find(lru_.back());
      bytes_held_ -= victim->second.values.size() * sizeof(float);
      map_.erase(victim);
      lru_.pop_back();
    }
    if (bytes_held_ + bytes > capacity_bytes_) break;
    lru_.push_front(key);
    node.lru = lru_.begin();
    map_.emplace(key, std::move(node));
    bytes_held_ += bytes;
    ++written;
  }
  return written;
}

NaiveStore::Result NaiveStore::retrieve(std::span<const int32_t> tokens, int64_t layer,
                                        int64_t row_begin) {
  std::vector<const Node*> hits;
  int64_t rows = 0;
  for (const Chunk& chunk : db_.process_tokens(tokens)) {
    auto it = map_.find({chunk.key.chunk_hash, layer});
    if (it == map_.end()) break;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    hits.push_back(&it->second);
    rows += chunk.size();
  }
  Result result;
  if (hits.empty() || row_begin >= rows) return result;
  // torch.cat: one new output, filled chunk by chunk.
  const int64_t cols = hits.front()->cols;
  result.values.reserve(static_cast<size_t>((rows - row_begin) * cols));
  for (const Node* node : hits) {
    const int64_t skip = std::max<int64_t>(0, row_begin - node->start) * cols;
    if (skip >= static_cast<int64_t>(node->values.size())) continue;
    result.values.insert(result.values.end(), node->values.begin() + skip, node->values.end());
  }
  result.rows = rows - row_begin;
  return result;
}

void NaiveStore::clear() {
  map_.clear();
  lru_.clear();
  bytes_held_ = 0;
}

}  // namespace hss::bench
