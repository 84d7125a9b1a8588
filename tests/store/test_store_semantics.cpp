// LMCache 0.5.6 semantics the store matches (issue: "Faithful to LMCache where it matters"), and
// the activation-kind axis. Each test names the LMCache behaviour it pins down.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "hss/hss.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using test::make_rows;
using test::make_tokens;
using test::view_of;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;

using FakeKv = test::ControlledKv;

class Semantics : public ::testing::Test {
 protected:
  Semantics() : config_(test::store_config(kChunk, kCols, 64)), db_(kChunk, false) {}
  void SetUp() override { reset(); }
  void reset() {
    store_ = std::make_unique<HiddenStateStore>(config_, db_);
    store_->bind_storage_manager(&kv_);
  }
  StoreResult put(const std::vector<int32_t>& tokens, int64_t layer = 0, int64_t offset = 0,
                  ActivationKind kind = ActivationKind::kHidden) {
    const auto rows = make_rows(tokens, offset, layer + 1000 * static_cast<int>(kind), kCols);
    StoreOptions o;
    o.layer_idx = layer;
    o.token_offset = offset;
    o.kind = kind;
    return store_->store_hidden_states(tokens, view_of(rows, kCols), o);
  }

  Config config_;
  ChunkedTokenDatabase db_;
  FakeKv kv_;
  std::unique_ptr<HiddenStateStore> store_;
};

TEST_F(Semantics, StoreReturnsChunksNewlyWrittenAsLmcacheDoes) {
  const auto tokens = make_tokens(3 * kChunk, 1);
  EXPECT_EQ(put(tokens), (StoreResult{3, 3}));
  // The whole range already cached: LMCache returns 0; `cached` still says 3.
  EXPECT_EQ(put(tokens), (StoreResult{0, 3}));
  // Extending the prefix by one chunk writes one.
  const auto longer = make_tokens(4 * kChunk, 1);
  ASSERT_TRUE(std::equal(tokens.begin(), tokens.end(), longer.begin()));
  EXPECT_EQ(put(longer), (StoreResult{1, 4}));
  // token_offset: chunks before it are neither written nor counted.
  EXPECT_EQ(put(longer, 1, 2 * kChunk), (StoreResult{2, 2}));
  EXPECT_EQ(store_->stats().chunks_written, 6u);
}

TEST_F(Semantics, NumCachedChunksCountsDistinctKeysAndNumEntriesCountsSlots) {
  const auto tokens = make_tokens(2 * kChunk, 2);
  (void)put(tokens, 0);
  (void)put(tokens, 5);
  (void)put(tokens, 0, 0, ActivationKind::kQuery);
  EXPECT_EQ(store_->num_cached_chunks(), 2u);  // LMCache: len(self._chunks)
  EXPECT_EQ(store_->num_entries(), 6u);
  const HiddenStateStats s = store_->stats();
  EXPECT_EQ(s.keys_held, 2u);
  EXPECT_EQ(s.entries_held, 6u);
}

TEST_F(Semantics, WalkAsksKvFirstSoAnOrphanWithTheSlotMissingIsStillDropped) {
  const auto tokens = make_tokens(3 * kChunk, 3);
  (void)put(tokens, 0);
  const std::vector<int32_t> two(tokens.begin(), tokens.begin() + 2 * kChunk);
  (void)put(two, 7);  // layer 7 only on chunks 0 and 1
  const auto chunks = db_.process_tokens(tokens);
  // Chunk 2 holds layer 0 but not layer 7, and its KV is gone. A retrieve of layer 7 stops at
  // chunk 2 for the missing slot; LMCache asks KV first there, so the key is dropped anyway.
  kv_.evicted.insert(chunks[2].key.chunk_hash);
  auto out = store_->retrieve_hidden_states(tokens, {.layer_idx = 7});
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), 2 * kChunk);
  EXPECT_FALSE(store_->has_chunk(chunks[2].key, 0));
  EXPECT_EQ(store_->stats().coupled_evictions, 1u);
  EXPECT_EQ(store_->num_cached_chunks(), 2u);
}

TEST_F(Semantics, WalkStopsAtTheFirstKvMissEvenWhenLaterChunksHaveIt) {
  const auto tokens = make_tokens(4 * kChunk, 4);
  (void)put(tokens);
  const auto chunks = db_.process_tokens(tokens);
  kv_.evicted.insert(chunks[1].key.chunk_hash);
  kv_.calls = 0;
  auto out = store_->retrieve_hidden_states(tokens);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), kChunk);
  EXPECT_EQ(kv_.calls.load(), 2);  // chunk 0 (present), chunk 1 (gone): nothing after the stop
  EXPECT_TRUE(store_->has_chunk(chunks[2].key));
  EXPECT_FALSE(store_->has_chunk(chunks[1].key));
}

TEST_F(Semantics, NoKvQuestionBeyondTheChunkWhereTheSlotIsMissing) {
  const auto tokens = make_tokens(4 * kChunk, 5);
  const std::vector<int32_t> one(tokens.begin(), tokens.begin() + kChunk);
  (void)put(one);
  kv_.calls = 0;
  auto out = store_->retrieve_hidden_states(tokens);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), kChunk);
  EXPECT_EQ(kv_.calls.load(), 2);  // chunk 0, then chunk 1 where the slot is missing
}

TEST_F(Semantics, RetrieveTouchesHitsInReverseOrder) {
  const auto tokens = make_tokens(3 * kChunk, 6);
  (void)put(tokens);
  const auto chunks = db_.process_tokens(tokens);
  ASSERT_TRUE(store_->retrieve_hidden_states(tokens).has_value());
  const auto lru = store_->lru_keys();
  ASSERT_EQ(lru.size(), 3u);
  // Chunk 0 ends most recently used, so pressure evicts the suffix first.
  EXPECT_EQ(lru[0].chunk_hash, chunks[2].key.chunk_hash);
  EXPECT_EQ(lru[1].chunk_hash, chunks[1].key.chunk_hash);
  EXPECT_EQ(lru[2].chunk_hash, chunks[0].key.chunk_hash);
}

TEST_F(Semantics, KindsAreSeparateSlotsOfOneKeyWithOneLru) {
  const auto tokens = make_tokens(2 * kChunk, 7);
  EXPECT_EQ(put(tokens, 3, 0, ActivationKind::kHidden).written, 2);
  EXPECT_EQ(put(tokens, 3, 0, ActivationKind::kKey).written, 2);
  EXPECT_EQ(put(tokens, 3, 0, ActivationKind::kMlpIntermediate).written, 2);
  const auto chunks = db_.process_tokens(tokens);
  EXPECT_TRUE(store_->has_chunk(chunks[0].key, 3, ActivationKind::kKey));
  EXPECT_FALSE(store_->has_chunk(chunks[0].key, 3, ActivationKind::kValue));
  EXPECT_EQ(store_->num_cached_chunks(), 2u);
  EXPECT_EQ(store_->num_entries(), 6u);

  // Each kind restores its own rows.
  for (ActivationKind kind :
       {ActivationKind::kHidden, ActivationKind::kKey, ActivationKind::kMlpIntermediate}) {
    auto out = store_->retrieve_hidden_states(tokens, {.layer_idx = 3, .kind = kind});
    ASSERT_TRUE(out);
    const auto want = make_rows(tokens, 0, 3 + 1000 * static_cast<int>(kind), kCols);
    EXPECT_EQ(0, std::memcmp(out->data(), want.data(), out->bytes())) << to_string(kind);
  }
  EXPECT_FALSE(
      store_->retrieve_hidden_states(tokens, {.layer_idx = 3, .kind = ActivationKind::kQuery}));
  // Multi-slot restore across kinds, and coverage with the same slots.
  const std::vector<Slot> slots{{ActivationKind::kKey, 3}, {ActivationKind::kHidden, 3}};
  const auto both = store_->retrieve_layers(tokens, std::span<const Slot>(slots));
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].rows(), 2 * kChunk);
  EXPECT_EQ(store_->coverage(chunks, std::span<const Slot>(slots)), 2 * kChunk);

  // Per-kind stats; dropping the key drops every kind.
  const HiddenStateStats s = store_->stats();
  EXPECT_EQ(s.per_kind[static_cast<size_t>(ActivationKind::kKey)].entries_held, 2u);
  EXPECT_EQ(s.per_kind[static_cast<size_t>(ActivationKind::kQuery)].entries_held, 0u);
  EXPECT_EQ(s.per_kind[static_cast<size_t>(ActivationKind::kHidden)].chunks_written, 2u);
  EXPECT_TRUE(store_->drop_key(chunks[0].key));
  EXPECT_FALSE(store_->has_chunk(chunks[0].key, 3, ActivationKind::kMlpIntermediate));
  EXPECT_EQ(store_->num_entries(), 3u);
}

TEST_F(Semantics, KindAllowlistAndLayerAllowlistFilterEveryKind) {
  config_.hidden_state_kinds =
      std::vector<ActivationKind>{ActivationKind::kHidden, ActivationKind::kValue};
  config_.hidden_state_layers = std::vector<int64_t>{1};
  reset();
  const auto tokens = make_tokens(kChunk, 8);
  EXPECT_EQ(put(tokens, 1, 0, ActivationKind::kValue), (StoreResult{1, 1}));
  EXPECT_EQ(put(tokens, 1, 0, ActivationKind::kQuery), (StoreResult{0, 0}));
  EXPECT_EQ(put(tokens, 2, 0, ActivationKind::kValue), (StoreResult{0, 0}));
  EXPECT_EQ(store_->num_entries(), 1u);
}

TEST_F(Semantics, KindOutsideTheEnumIsInvalidArgumentWithNothingChanged) {
  const auto tokens = make_tokens(kChunk, 9);
  const auto rows = make_rows(tokens, 0, 0, kCols);
  StoreOptions o;
  o.kind = static_cast<ActivationKind>(9);
  const HiddenStateStats before = store_->stats();
  EXPECT_THROW((void)store_->store_hidden_states(tokens, view_of(rows, kCols), o), InvalidArgument);
  EXPECT_THROW(
      (void)store_->retrieve_hidden_states(tokens, {.kind = static_cast<ActivationKind>(7)}),
      InvalidArgument);
  EXPECT_EQ(store_->stats().stores, before.stores);
  EXPECT_EQ(store_->stats().retrieves, before.retrieves);
}

TEST_F(Semantics, CallerComputedChunksStoreAndRetrieveLikeTokens) {
  // An engine with its own block hashes: process_hashes with LMCache's token counts.
  const std::vector<uint64_t> hashes{101, 202, 303};
  const auto chunks = db_.process_hashes(hashes, std::vector<int64_t>{kChunk, kChunk, kChunk});
  std::vector<float> rows(static_cast<size_t>(3 * kChunk * kCols));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 977) / 4.0f;
  EXPECT_EQ(store_->store_chunks(chunks, view_of(rows, kCols)), (StoreResult{3, 3}));
  kv_.evicted.insert(202);
  auto out = store_->retrieve_chunks(chunks);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), kChunk);
  EXPECT_EQ(0, std::memcmp(out->data(), rows.data(), out->bytes()));
  // Chunks that are not contiguous from 0 are rejected with nothing written.
  std::vector<Chunk> gap{chunks[0], chunks[2]};
  std::vector<float> two(static_cast<size_t>(2 * kChunk * kCols));
  EXPECT_THROW((void)store_->store_chunks(gap, view_of(two, kCols)), InvalidArgument);
  EXPECT_THROW((void)store_->retrieve_chunks(gap), InvalidArgument);
}

TEST_F(Semantics, AListNamingAKeyTwiceWritesItOnceAtItsFirstChunkAsLmcacheDoes) {
  // LMCache's store loop finds the key stored by the list's first chunk when it reaches the
  // second and only bumps its LRU: one write, both chunks cached, the first chunk's rows kept.
  const auto chunks = db_.process_hashes(std::vector<uint64_t>{101, 101, 303},
                                         std::vector<int64_t>{kChunk, kChunk, kChunk});
  std::vector<float> rows(static_cast<size_t>(3 * kChunk * kCols));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i % 977) / 4.0f;
  EXPECT_EQ(store_->store_chunks(chunks, view_of(rows, kCols)), (StoreResult{2, 3}));
  EXPECT_EQ(store_->stats().chunks_written, 2u);
  EXPECT_EQ(store_->num_cached_chunks(), 2u);
  EXPECT_EQ(store_->num_entries(), 2u);
  store_->check_invariants();
  auto out = store_->retrieve_chunks(chunks);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->rows(), 3 * kChunk);
  const size_t chunk_bytes = static_cast<size_t>(kChunk * kCols) * sizeof(float);
  const auto* got = reinterpret_cast<const std::byte*>(out->data());
  const auto* want = reinterpret_cast<const std::byte*>(rows.data());
  EXPECT_EQ(0, std::memcmp(got, want, chunk_bytes));                // chunk 0
  EXPECT_EQ(0, std::memcmp(got + chunk_bytes, want, chunk_bytes));  // key 101 again
  EXPECT_EQ(0, std::memcmp(got + 2 * chunk_bytes, want + 2 * chunk_bytes, chunk_bytes));
  // A first occurrence before token_offset is not written: the second one is, with its rows.
  reset();
  StoreOptions o;
  o.token_offset = kChunk;
  const std::span<const float> tail(rows.data() + kChunk * kCols, 2 * kChunk * kCols);
  EXPECT_EQ(store_->store_chunks(chunks, {tail.data(), DType::kFloat32, 2 * kChunk, kCols}, o),
            (StoreResult{2, 2}));
  store_->check_invariants();
  out = store_->retrieve_chunks(std::span<const Chunk>(chunks.data(), 1));
  ASSERT_TRUE(out);
  EXPECT_EQ(0, std::memcmp(out->data(), want + chunk_bytes, chunk_bytes));
}

TEST_F(Semantics, AKeyHeldWithAnotherRowCountIsReplacedNotCountedCached) {
  // No walk serves an entry whose rows differ from its chunk's: a chunk list giving a key
  // another length replaces the entry (as another hidden dim does) rather than reporting a
  // chunk cached that no retrieve would return.
  const std::vector<Chunk> full =
      db_.process_hashes(std::vector<uint64_t>{505}, std::vector<int64_t>{kChunk});
  const std::vector<Chunk> shorter =
      db_.process_hashes(std::vector<uint64_t>{505}, std::vector<int64_t>{5});
  std::vector<float> rows(static_cast<size_t>(kChunk * kCols), 1.5f);
  std::vector<float> five(static_cast<size_t>(5 * kCols));
  for (size_t i = 0; i < five.size(); ++i) five[i] = static_cast<float>(i) + 0.25f;
  EXPECT_EQ(store_->store_chunks(full, view_of(rows, kCols)), (StoreResult{1, 1}));
  EXPECT_EQ(store_->store_chunks(shorter, view_of(five, kCols)), (StoreResult{1, 1}));
  EXPECT_EQ(store_->num_entries(), 1u);
  store_->check_invariants();
  auto out = store_->retrieve_chunks(shorter);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->rows(), 5);
  EXPECT_EQ(0, std::memcmp(out->data(), five.data(), five.size() * sizeof(float)));
  EXPECT_EQ(store_->coverage(shorter, std::vector<Slot>{Slot{}}), 5);
  // The full-length chunk is no longer served (its key holds five rows now) until stored again.
  EXPECT_FALSE(store_->retrieve_chunks(full));
  EXPECT_EQ(store_->store_chunks(full, view_of(rows, kCols)), (StoreResult{1, 1}));
  ASSERT_TRUE(store_->retrieve_chunks(full));
}

}  // namespace
}  // namespace hss
