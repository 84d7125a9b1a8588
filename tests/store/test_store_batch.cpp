// Batch calls against single calls in item order where the batch shares work between items:
// one index lookup per chunk of each distinct token list (detail::RecordLookups), reused until a
// key is erased. Pressure, replacements and coupled evictions in the middle of a batch must give
// the results, the LRU order and the counters of the single calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hss/hss.hpp"
#include "index/store_index.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using test::make_rows;
using test::make_tokens;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 8;

TEST(RecordLookups, ReuseARecordUntilAKeyIsErasedAndNeverCacheAMiss) {
  detail::StoreIndex index;
  ChunkedTokenDatabase db(kChunk, false);
  const auto tokens = make_tokens(2 * kChunk, 1);
  const auto chunks = db.process_tokens(tokens);
  detail::RecordLookups lookups(chunks.size());

  EXPECT_EQ(lookups.find(index, 0, chunks[0].key), nullptr);
  detail::KeyRecord& first = index.insert_empty(chunks[0].key, 1);
  // A miss is not cached: the key inserted since is found.
  EXPECT_EQ(lookups.find(index, 0, chunks[0].key), &first);
  detail::KeyRecord& second = index.insert_empty(chunks[1].key, 1);
  lookups.remember(index, 1, second);
  EXPECT_EQ(lookups.find(index, 1, chunks[1].key), &second);

  const uint64_t before = index.erasures();
  EXPECT_EQ(index.erase(chunks[0].key), 0u);
  EXPECT_EQ(index.erasures(), before + 1);
  // Both cached records are dropped on the erase; the surviving key is found again.
  EXPECT_EQ(lookups.find(index, 0, chunks[0].key), nullptr);
  EXPECT_EQ(lookups.find(index, 1, chunks[1].key), &second);
  index.clear();
  EXPECT_EQ(index.erasures(), before + 2);
  EXPECT_EQ(lookups.find(index, 1, chunks[1].key), nullptr);
}

TEST(RecordLookups, LongListsSpillToTheHeapAndSurviveAMove) {
  detail::StoreIndex index;
  ChunkedTokenDatabase db(kChunk, false);
  const auto chunks = db.process_tokens(make_tokens(12 * kChunk, 2));
  detail::KeyRecord& last = index.insert_empty(chunks[11].key, 1);
  for (size_t n : {size_t{2}, chunks.size()}) {
    detail::RecordLookups lookups(n);
    const size_t i = n - 1;
    const CacheEngineKey& key = n == chunks.size() ? chunks[11].key : chunks[0].key;
    (void)lookups.find(index, i, key);
    detail::RecordLookups moved = std::move(lookups);
    EXPECT_EQ(moved.find(index, i, key), n == chunks.size() ? &last : nullptr) << n;
  }
}

/// A twin pair of stores: one fed batches, one the same items as single calls.
class BatchVsSingles : public ::testing::Test {
 protected:
  void make(int64_t pool_chunks) {
    const Config config = test::store_config(kChunk, kCols, pool_chunks);
    batch_ = std::make_unique<HiddenStateStore>(config, db_);
    single_ = std::make_unique<HiddenStateStore>(config, db_);
    batch_->bind_storage_manager(&kv_);
    single_->bind_storage_manager(&kv_);
  }
  /// An item storing rows [offset, end) of `tokens` for `layer` (the rows stay alive in rows_).
  StoreItem item(const std::vector<int64_t>& tokens, int64_t layer, int64_t offset = 0) {
    const std::vector<int32_t> narrow(tokens.begin(), tokens.end());
    rows_.push_back(std::make_unique<std::vector<float>>(make_rows(narrow, offset, layer, kCols)));
    StoreOptions o;
    o.layer_idx = layer;
    o.token_offset = offset;
    return {tokens,
            {rows_.back()->data(), DType::kFloat32, static_cast<int64_t>(tokens.size()) - offset,
             kCols},
            o};
  }
  static std::vector<int64_t> wide(const std::vector<int32_t>& t) { return {t.begin(), t.end()}; }

  /// Runs `items` as one batch and as single calls; results, LRU, counters and entries agree.
  std::vector<StoreResult> store_both(const std::vector<StoreItem>& items) {
    const auto results = batch_->store_batch(items);
    for (size_t i = 0; i < items.size(); ++i) {
      EXPECT_EQ(single_->store_hidden_states(items[i].token_ids, items[i].hidden_states,
                                             items[i].options),
                results[i])
          << "item " << i;
    }
    expect_same_state();
    return results;
  }
  /// Runs `reads` as one batch on batch_ (into `got`) and as single calls on single_ (into
  /// `want`, filled like `got` first): the rows and the outputs agree. Returns the batch's rows.
  /// `between` runs after the batch, before the single calls.
  std::vector<int64_t> retrieve_both(
      const std::vector<RetrieveItem>& reads, std::vector<std::vector<float>>& got,
      std::vector<std::vector<float>>& want, const std::function<void()>& between = [] {}) {
    want = got;
    const auto rows = batch_->retrieve_batch_into(reads);
    between();
    for (size_t i = 0; i < reads.size(); ++i) {
      MutableTensorView out = reads[i].out;
      out.data = want[i].data();
      EXPECT_EQ(single_->retrieve_hidden_states_into(reads[i].token_ids, out, reads[i].options),
                rows[i])
          << i;
      EXPECT_EQ(got[i], want[i]) << i;
    }
    return rows;
  }
  void expect_same_state() {
    EXPECT_EQ(batch_->lru_keys(), single_->lru_keys());
    const HiddenStateStats b = batch_->stats(), s = single_->stats();
    EXPECT_EQ(b.entries_held, s.entries_held);
    EXPECT_EQ(b.keys_held, s.keys_held);
    EXPECT_EQ(b.blocks_held, s.blocks_held);
    EXPECT_EQ(b.stores, s.stores);
    EXPECT_EQ(b.chunks_written, s.chunks_written);
    EXPECT_EQ(b.retrieves, s.retrieves);
    EXPECT_EQ(b.hit_tokens, s.hit_tokens);
    EXPECT_EQ(b.miss_tokens, s.miss_tokens);
    EXPECT_EQ(b.hs_evictions, s.hs_evictions);
    EXPECT_EQ(b.coupled_evictions, s.coupled_evictions);
    EXPECT_EQ(b.allocation_failures, s.allocation_failures);
    batch_->check_invariants();
    single_->check_invariants();
  }

  ChunkedTokenDatabase db_{kChunk, false};
  test::ControlledKv kv_;
  std::unique_ptr<HiddenStateStore> batch_, single_;
  std::vector<std::unique_ptr<std::vector<float>>> rows_;
};

TEST_F(BatchVsSingles, LayersOfOneRequestShareLookupsAndEndInTheSameLruOrder) {
  make(64);
  const auto a = wide(make_tokens(3 * kChunk, 10)), b = wide(make_tokens(2 * kChunk, 11));
  std::vector<StoreItem> items;
  for (int64_t layer = 0; layer < 3; ++layer) {
    items.push_back(item(a, layer));
    items.push_back(item(b, layer));
  }
  items.push_back(item(a, 0));              // cached: touches only
  items.push_back(item(b, 1, kChunk));      // token_offset: chunk 0 skipped, chunk 1 cached
  items.push_back(item(a, 3, 2 * kChunk));  // a new layer for the last chunk only
  const auto results = store_both(items);
  EXPECT_EQ(results[0], (StoreResult{3, 3}));
  EXPECT_EQ(results[6], (StoreResult{0, 3}));
  EXPECT_EQ(results[7], (StoreResult{0, 1}));
  EXPECT_EQ(results[8], (StoreResult{1, 1}));
}

TEST_F(BatchVsSingles, Int32AndInt64TokenIdsInOneBatchKeepTheirWidthAndMatchSingles) {
  // StoreItem/RetrieveItem take hss::TokenIds: an engine's int32 ids go in without a copy. The
  // same ids at both widths are the same keys: the int64 items of a list find the chunks the
  // int32 items stored (two lists, one per width, same results as the single calls).
  make(64);
  const std::vector<int32_t> narrow = make_tokens(3 * kChunk, 21);
  const std::vector<int64_t> widened = wide(narrow);
  std::vector<StoreItem> items;
  for (int64_t layer = 0; layer < 2; ++layer) {
    StoreItem i32 = item(widened, layer);
    i32.token_ids = narrow;  // the same rows, the ids at 32 bits
    EXPECT_TRUE(i32.token_ids.is_int32());
    items.push_back(i32);
  }
  items.push_back(item(widened, 0));  // already stored by the int32 item: touches only
  items.push_back(item(widened, 2));
  const auto results = store_both(items);
  EXPECT_EQ(results[0], (StoreResult{3, 3}));
  EXPECT_EQ(results[1], (StoreResult{3, 3}));
  EXPECT_EQ(results[2], (StoreResult{0, 3}));
  EXPECT_EQ(results[3], (StoreResult{3, 3}));
  EXPECT_EQ(batch_->num_entries(), 9u);

  // Retrieves at both widths read the same rows.
  std::vector<std::vector<float>> outs(4, std::vector<float>(3 * kChunk * kCols, -1.0f));
  std::vector<RetrieveItem> reads;
  for (size_t r = 0; r < outs.size(); ++r) {
    RetrieveOptions o;
    o.layer_idx = static_cast<int64_t>(r % 3);
    const TokenIds ids = r % 2 == 0 ? TokenIds(narrow) : TokenIds(widened);
    reads.push_back({ids, {outs[r].data(), DType::kFloat32, 3 * kChunk, kCols}, o});
  }
  const auto rows = batch_->retrieve_batch_into(reads);
  for (size_t r = 0; r < outs.size(); ++r) {
    EXPECT_EQ(rows[r], 3 * kChunk) << r;
    EXPECT_EQ(outs[r], make_rows(narrow, 0, static_cast<int64_t>(r % 3), kCols)) << r;
  }
}

TEST(StoreConfig, IsTheConfigInEffect) {
  // HiddenStateStore::config(): the given config with the HSS_* debugging variables applied.
  ChunkedTokenDatabase db(kChunk, false);
  Config given = test::store_config(kChunk, kCols, 8);
  given.hidden_state_layers = std::vector<int64_t>{0, 2};
  ::setenv("HSS_OUTPUT_CACHE_MB", "3", 1);
  HiddenStateStore store(given, db);
  ::unsetenv("HSS_OUTPUT_CACHE_MB");
  EXPECT_EQ(store.config().chunk_size, kChunk);
  EXPECT_EQ(store.config().hidden_state_layers, given.hidden_state_layers);
  // (The test environment may set other HSS_* variables too: HSS_LOG_LEVEL, the streaming run.)
  const auto& applied = store.config().env_overrides;
  EXPECT_NE(std::find(applied.begin(), applied.end(), "HSS_OUTPUT_CACHE_MB"), applied.end());
  EXPECT_EQ(store.config().tuning.output_cache_bytes, int64_t{3} << 20);
  EXPECT_NE(given.tuning.output_cache_bytes, int64_t{3} << 20);
  EXPECT_TRUE(given.env_overrides.empty());
  EXPECT_NE(store.config().to_yaml(), given.to_yaml()) << "to_yaml shows the override";
  store.close();
  EXPECT_EQ(store.config().chunk_size, kChunk) << "readable after close";
}

TEST_F(BatchVsSingles, EvictionOfALookedUpKeyInTheMiddleOfAStoreBatch) {
  // Pool of 7 chunks. b and c fill four; the batch looks c up (item 0, touching it), stores a
  // and d (d evicts b0), then e evicts b1 and c0, whose record item 0 had looked up: item 4
  // extends c past its first chunk and must find c0 gone, not use the erased record.
  make(7);
  const auto b = wide(make_tokens(2 * kChunk, 20)), c = wide(make_tokens(2 * kChunk, 21));
  const auto a = wide(make_tokens(2 * kChunk, 22)), d = wide(make_tokens(2 * kChunk, 23));
  const auto e = wide(make_tokens(2 * kChunk, 24));
  (void)store_both({item(b, 0), item(c, 0)});
  const auto results =
      store_both({item(c, 0), item(a, 0), item(d, 0), item(e, 0), item(c, 0, kChunk)});
  EXPECT_EQ(results[0], (StoreResult{0, 2}));
  EXPECT_EQ(results[3], (StoreResult{2, 2}));
  EXPECT_EQ(results[4], (StoreResult{0, 1}));
  EXPECT_EQ(batch_->stats().hs_evictions, 3u);
  EXPECT_FALSE(batch_->has_chunk(db_.process_tokens(std::span<const int64_t>(c))[0].key, 0));
}

TEST_F(BatchVsSingles, ReplacementOfTheLastSlotInTheMiddleOfAStoreBatch) {
  // A hidden dim change replaces a key's only entry (the record is erased and made again) while
  // later items of the batch share that key's lookups.
  make(64);
  const auto a = wide(make_tokens(2 * kChunk, 30));
  (void)store_both({item(a, 0)});
  std::vector<StoreItem> items{item(a, 0), item(a, 1), item(a, 0)};
  std::vector<float> wider(a.size() * 2 * kCols, 0.5f);
  items[0].hidden_states = {wider.data(), DType::kFloat32, static_cast<int64_t>(a.size()),
                            2 * kCols};
  const auto results = store_both(items);
  EXPECT_EQ(results[0], (StoreResult{2, 2}));
  EXPECT_EQ(results[1], (StoreResult{2, 2}));
  EXPECT_EQ(results[2], (StoreResult{2, 2}));  // back to kCols: replaced again
}

TEST_F(BatchVsSingles, RetrieveBatchWithCoupledEvictionsMatchesSingles) {
  make(64);
  const auto a = wide(make_tokens(3 * kChunk, 40)), b = wide(make_tokens(2 * kChunk, 41));
  std::vector<StoreItem> stores;
  for (int64_t layer = 0; layer < 3; ++layer) {
    stores.push_back(item(a, layer));
    stores.push_back(item(b, layer));
  }
  (void)store_both(stores);
  // a's second chunk loses its KV: every read of a stops there and the first drops the key.
  kv_.evict(db_.process_tokens(std::span<const int64_t>(a))[1].key);
  std::vector<std::vector<float>> got(6), want(6);
  std::vector<RetrieveItem> reads;
  for (size_t i = 0; i < 6; ++i) {
    const auto& t = i % 2 == 0 ? a : b;
    got[i].assign(t.size() * kCols, -1.0f);
    RetrieveOptions o;
    o.layer_idx = static_cast<int64_t>(i / 2);
    o.row_begin = static_cast<int64_t>(i % 3);
    reads.push_back(
        {t, {got[i].data(), DType::kFloat32, static_cast<int64_t>(t.size()), kCols}, o});
  }
  const auto rows = retrieve_both(reads, got, want);
  EXPECT_EQ(rows[0], kChunk);
  EXPECT_EQ(rows[1], 2 * kChunk - 1);
  EXPECT_EQ(batch_->stats().coupled_evictions, 1u);
  expect_same_state();
}

TEST_F(BatchVsSingles, RetrieveBatchTouchesEachKeyOnceYetEndsInTheSingleCallsLruOrder) {
  make(64);
  const auto a = wide(make_tokens(3 * kChunk, 50)), b = wide(make_tokens(2 * kChunk, 51));
  const std::vector<int64_t> a_head(a.begin(), a.begin() + kChunk);
  // a: layer 0 on three chunks, layer 1 on the first only (items of one list with other hits).
  (void)store_both({item(a, 0), item(b, 0), item(a_head, 1), item(b, 1)});
  std::vector<float> sink(3 * kChunk * kCols);
  auto read = [&](const std::vector<int64_t>& t, int64_t layer) {
    RetrieveOptions o;
    o.layer_idx = layer;
    return RetrieveItem{t, {sink.data(), DType::kFloat32, 3 * kChunk, kCols}, o};
  };
  for (const std::vector<RetrieveItem>& reads :
       {std::vector<RetrieveItem>{read(a, 0), read(b, 1), read(a, 1), read(b, 0)},
        std::vector<RetrieveItem>{read(a, 1), read(b, 0), read(a, 0), read(b, 1), read(b, 0)},
        std::vector<RetrieveItem>{read(b, 0), read(a, 0), read(a, 1), read(a, 0)}}) {
    const auto rows = batch_->retrieve_batch_into(reads);
    for (size_t i = 0; i < reads.size(); ++i) {
      EXPECT_EQ(
          single_->retrieve_hidden_states_into(reads[i].token_ids, reads[i].out, reads[i].options),
          rows[i])
          << i;
    }
    expect_same_state();
  }
}

TEST_F(BatchVsSingles, RetrieveBatchAsksKvOncePerChunkOfAListAndMatchesSingles) {
  make(64);
  const auto a = wide(make_tokens(3 * kChunk, 60)), b = wide(make_tokens(2 * kChunk, 61));
  const std::vector<int64_t> a_head(a.begin(), a.begin() + kChunk);
  // Layers 0 and 1 of both lists on every chunk, layer 2 of a on its first chunk only.
  (void)store_both({item(a, 0), item(b, 0), item(a, 1), item(b, 1), item(a_head, 2), item(b, 2)});
  std::vector<std::vector<float>> got(6), want(6);
  std::vector<RetrieveItem> reads;
  for (size_t i = 0; i < 6; ++i) {  // layer-major, as an engine step hands them over
    const auto& t = i % 2 == 0 ? a : b;
    got[i].assign(t.size() * kCols, -1.0f);
    RetrieveOptions o;
    o.layer_idx = static_cast<int64_t>(i / 2);
    reads.push_back(
        {t, {got[i].data(), DType::kFloat32, static_cast<int64_t>(t.size()), kCols}, o});
  }
  // Each item asks KV for its prefix and the chunk that ended it (a's layer 2: chunks 0 and 1);
  // singles ask 3 + 3 + 2 for a and 2 x 3 for b, the batch each chunk of a list once.
  const auto both = [&](int want_batch_calls, int want_single_calls) {
    for (auto& g : got) std::fill(g.begin(), g.end(), -1.0f);
    kv_.calls = 0;
    int batch_calls = 0;  // the batch's questions, read before the single calls ask theirs
    const auto rows = retrieve_both(reads, got, want, [&] { batch_calls = kv_.calls.exchange(0); });
    EXPECT_EQ(batch_calls, want_batch_calls);
    EXPECT_EQ(kv_.calls.load(), want_single_calls);
    expect_same_state();
    return rows;
  };
  auto rows = both(3 + 2, 3 + 3 + 2 + 2 * 3);
  EXPECT_EQ(rows, (std::vector<int64_t>{3 * kChunk, 2 * kChunk, 3 * kChunk, 2 * kChunk, kChunk,
                                        2 * kChunk}));
  // a's second chunk loses its KV: the first read of a drops the key (one coupled eviction), the
  // others of its list stop there on the answer it got; singles ask again and find it gone.
  kv_.evict(db_.process_tokens(std::span<const int64_t>(a))[1].key);
  rows = both(2 + 2, 2 * 3 + 2 * 3);
  EXPECT_EQ(rows,
            (std::vector<int64_t>{kChunk, 2 * kChunk, kChunk, 2 * kChunk, kChunk, 2 * kChunk}));
  EXPECT_EQ(batch_->stats().coupled_evictions, 1u);
}

}  // namespace
}  // namespace hss
