// Randomised model-based test: thousands of random operations (store, retrieve, multi-layer
// retrieve, coverage, KV eviction, drop, pool pressure) against a small reference model of the
// documented semantics; every result is compared.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <map>
#include <random>
#include <set>

#include "hss/hss.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

constexpr int64_t kChunk = 8;
constexpr int64_t kCols = 8;
constexpr int64_t kPoolChunks = 24;
const std::vector<int64_t> kLayers{-1, 0, 1};

class ControlledKv final : public StorageManager {
 public:
  bool contains(const CacheEngineKey& key) const override { return !gone.count(key.chunk_hash); }
  std::set<uint64_t> gone;
};

/// The reference: what the documentation says, in the plainest code.
class Model {
 public:
  explicit Model(const ControlledKv& kv) : kv_(kv) {}

  /// {written, cached}: LMCache's count of new chunks, and chunks of the range held after.
  StoreResult store(const std::vector<Chunk>& chunks, int64_t layer, int64_t offset) {
    StoreResult result;
    std::set<uint64_t> own;  // a store never evicts keys of its own token list
    for (const Chunk& c : chunks) own.insert(c.key.chunk_hash);
    for (const Chunk& c : chunks) {
      if (c.start < offset) continue;
      const uint64_t k = c.key.chunk_hash;
      if (held_.count({k, layer})) {
        touch(k);
        ++result.cached;
        continue;
      }
      if (entries() == kPoolChunks && !evict_lru_except(own)) break;
      held_.insert({k, layer});
      touch(k);
      ++result.written;
      ++result.cached;
    }
    return result;
  }

  /// Prefix chunks hit for all `layers`; applies coupled eviction and reverse touches. KV is
  /// asked first, per chunk, as LMCache does.
  int64_t retrieve(const std::vector<Chunk>& chunks, const std::vector<int64_t>& layers) {
    int64_t hit = 0;
    for (const Chunk& c : chunks) {
      const uint64_t k = c.key.chunk_hash;
      if (!kv_.contains(c.key)) {
        drop(k);
        break;
      }
      const bool all = std::all_of(layers.begin(), layers.end(), [&](int64_t l) {
        return held_.count({k, l}) > 0;
      });
      if (!all) break;
      ++hit;
    }
    for (int64_t i = hit - 1; i >= 0; --i) touch(chunks[static_cast<size_t>(i)].key.chunk_hash);
    return hit;
  }

  int64_t coverage(const std::vector<Chunk>& chunks, const std::vector<int64_t>& layers) const {
    int64_t hit = 0;
    for (const Chunk& c : chunks) {
      const bool all = std::all_of(layers.begin(), layers.end(), [&](int64_t l) {
        return held_.count({c.key.chunk_hash, l}) > 0;
      });
      if (!all || !kv_.contains(c.key)) break;
      ++hit;
    }
    return hit;
  }

  bool drop(uint64_t k) {
    bool any = false;
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->first == k) {
        it = held_.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    lru_.remove(k);
    return any;
  }

  [[nodiscard]] size_t entries() const { return held_.size(); }
  [[nodiscard]] size_t keys() const { return lru_.size(); }
  [[nodiscard]] std::vector<uint64_t> lru() const { return {lru_.begin(), lru_.end()}; }
  [[nodiscard]] bool has(uint64_t k, int64_t l) const { return held_.count({k, l}) > 0; }

 private:
  void touch(uint64_t k) {
    lru_.remove(k);
    lru_.push_back(k);
  }
  bool evict_lru_except(const std::set<uint64_t>& protect) {
    for (uint64_t k : lru_) {
      if (!protect.count(k)) {
        drop(k);
        return true;
      }
    }
    return false;
  }

  const ControlledKv& kv_;
  std::set<std::pair<uint64_t, int64_t>> held_;
  std::list<uint64_t> lru_;  // front = least recent
};

TEST(StoreModel, RandomOperationsMatchTheReferenceModel) {
  Config config = test::store_config(kChunk, kCols, kPoolChunks);
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(config, db);
  ControlledKv kv;
  store.bind_storage_manager(&kv);
  Model model(kv);

  // Conversations: prompts are prefixes of a few long sequences, so prefixes are shared.
  std::vector<std::vector<int32_t>> bases;
  for (uint64_t s = 0; s < 6; ++s) bases.push_back(test::make_tokens(12 * kChunk + 5, 900 + s));
  std::mt19937_64 rng(20261130);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };

  for (int op = 0; op < 4000; ++op) {
    const auto& base = bases[static_cast<size_t>(pick(6))];
    const int64_t len = 1 + pick(static_cast<int64_t>(base.size()));
    const std::vector<int32_t> tokens(base.begin(), base.begin() + len);
    const auto chunks = db.process_tokens(tokens);
    const int64_t layer = kLayers[static_cast<size_t>(pick(3))];
    const int kind = static_cast<int>(pick(100));
    SCOPED_TRACE("op " + std::to_string(op) + " kind " + std::to_string(kind));

    if (kind < 40) {  // store, sometimes incremental
      const int64_t offset = pick(3) == 0 ? pick(len + 1) : 0;
      const auto rows = test::make_rows(tokens, offset, layer, kCols);
      const StoreResult got = store.store_hidden_states(
          tokens, {rows.data(), DType::kFloat32, len - offset, kCols, 0, Device::kHost, 0},
          {layer, offset});
      const StoreResult want = model.store(chunks, layer, offset);
      ASSERT_EQ(got.written, want.written);
      ASSERT_EQ(got.cached, want.cached);
    } else if (kind < 65) {  // single-layer retrieve, sometimes only the tail
      const int64_t row_begin = pick(2) == 0 ? pick(len + 1) : 0;
      auto out = store.retrieve_hidden_states(tokens, {layer, row_begin});
      const int64_t hit = model.retrieve(chunks, {layer});
      const int64_t prefix = hit * kChunk;
      if (row_begin >= prefix) {
        ASSERT_FALSE(out.has_value());
      } else {
        ASSERT_TRUE(out.has_value());
        ASSERT_EQ(out->rows(), prefix - row_begin);
        const auto expected = test::make_rows(tokens, 0, layer, kCols);
        ASSERT_EQ(0, std::memcmp(out->data(), expected.data() + row_begin * kCols, out->bytes()));
      }
    } else if (kind < 75) {  // multi-layer retrieve
      const std::vector<int64_t> layers{-1, 1};
      auto out = store.retrieve_layers(tokens, layers);
      const int64_t hit = model.retrieve(chunks, layers);
      if (hit == 0) {
        ASSERT_TRUE(out.empty());
      } else {
        ASSERT_EQ(out.size(), 2u);
        for (size_t i = 0; i < 2; ++i) {
          ASSERT_EQ(out[i].rows(), hit * kChunk);
          const auto expected = test::make_rows(tokens, 0, layers[i], kCols);
          ASSERT_EQ(0, std::memcmp(out[i].data(), expected.data(), out[i].bytes()));
        }
      }
    } else if (kind < 82) {  // coverage
      const std::vector<int64_t> layers{layer};
      ASSERT_EQ(store.coverage(chunks, layers), model.coverage(chunks, layers) * kChunk);
    } else if (kind < 92) {  // KV evicted behind the store's back
      if (!chunks.empty())
        kv.gone.insert(
            chunks[static_cast<size_t>(pick(static_cast<int64_t>(chunks.size())))].key.chunk_hash);
    } else if (kind < 96) {  // KV comes back (re-prefill)
      if (!chunks.empty()) kv.gone.erase(chunks.front().key.chunk_hash);
    } else {  // drop
      if (!chunks.empty()) {
        const Chunk& c = chunks[static_cast<size_t>(pick(static_cast<int64_t>(chunks.size())))];
        ASSERT_EQ(store.drop_key(c.key), model.drop(c.key.chunk_hash));
      }
    }
    ASSERT_EQ(store.num_entries(), model.entries());
    ASSERT_EQ(store.num_cached_chunks(), model.keys());
    std::vector<uint64_t> lru;
    for (const CacheEngineKey& key : store.lru_keys()) lru.push_back(key.chunk_hash);
    ASSERT_EQ(lru, model.lru());
    ASSERT_NO_THROW(store.check_invariants());
    if (!chunks.empty()) {
      ASSERT_EQ(store.has_chunk(chunks.front().key, layer),
                model.has(chunks.front().key.chunk_hash, layer));
    }
  }
  const HiddenStateStats s = store.stats();
  EXPECT_GT(s.hs_evictions, 0u) << "the run never put the pool under pressure";
  EXPECT_GT(s.coupled_evictions, 0u) << "the run never dropped an orphan";
  EXPECT_GT(s.hit_tokens, 0u);
}

}  // namespace
}  // namespace hss
