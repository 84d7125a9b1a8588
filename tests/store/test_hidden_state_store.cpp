// Behaviour of hss::HiddenStateStore on the host path, one behaviour per test.
#include <gtest/gtest.h>

#include <algorithm>
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

class StoreTest : public ::testing::Test {
 protected:
  explicit StoreTest(int64_t pool_chunks = 64)
      : config_(test::store_config(kChunk, kCols, pool_chunks)), db_(kChunk, false) {}

  void SetUp() override {
    store_ = std::make_unique<HiddenStateStore>(config_, db_);
    store_->bind_storage_manager(&kv_);
  }

  int64_t store_rows(const std::vector<int32_t>& tokens, int64_t layer = 0, int64_t offset = 0) {
    const auto rows = make_rows(tokens, offset, layer, kCols);
    return store_->store_hidden_states(tokens, view_of(rows, kCols), {layer, offset}).cached;
  }

  /// Asserts `t` holds rows [row_begin, row_begin + t.rows()) of (tokens, layer) exactly.
  static void expect_rows(const HostTensor& t, const std::vector<int32_t>& tokens, int64_t layer,
                          int64_t row_begin = 0) {
    const auto expected = make_rows(tokens, 0, layer, kCols);
    ASSERT_EQ(t.cols(), kCols);
    ASSERT_LE(row_begin + t.rows(), static_cast<int64_t>(tokens.size()));
    ASSERT_EQ(0, std::memcmp(t.data(), expected.data() + row_begin * kCols, t.bytes()))
        << "restored rows differ from the stored ones";
  }

  Config config_;
  ChunkedTokenDatabase db_;
  FakeKv kv_;
  std::unique_ptr<HiddenStateStore> store_;
};

TEST_F(StoreTest, RoundTripFloat32IsBitExact) {
  const auto tokens = make_tokens(4 * kChunk, 1);
  EXPECT_EQ(store_rows(tokens), 4);
  auto out = store_->retrieve_hidden_states(tokens);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->rows(), 4 * kChunk);
  expect_rows(*out, tokens, 0);
}

TEST_F(StoreTest, RoundTripBFloat16AndFloat16AreBitExact) {
  const auto tokens = make_tokens(3 * kChunk, 2);
  const auto rows = make_rows(tokens, 0, 0, kCols);
  const auto bf16 = test::to_bf16(rows);
  EXPECT_EQ(
      store_->store_hidden_states(tokens, view_of(bf16, kCols, DType::kBFloat16), {0, 0}).cached,
      3);
  const auto f16 = test::to_f16(rows);
  EXPECT_EQ(
      store_->store_hidden_states(tokens, view_of(f16, kCols, DType::kFloat16), {1, 0}).cached, 3);
  auto out_bf = store_->retrieve_hidden_states(tokens, {0, 0});
  auto out_h = store_->retrieve_hidden_states(tokens, {1, 0});
  ASSERT_TRUE(out_bf && out_h);
  // Test values are exact in both 16-bit formats, so the widened rows equal the float32 ones.
  EXPECT_EQ(0, std::memcmp(out_bf->data(), rows.data(), out_bf->bytes()));
  EXPECT_EQ(0, std::memcmp(out_h->data(), rows.data(), out_h->bytes()));
}

TEST_F(StoreTest, StridedViewStoresOnlyTheViewedColumns) {
  const auto tokens = make_tokens(2 * kChunk, 3);
  const auto rows = make_rows(tokens, 0, 0, kCols);
  const int64_t stride = kCols + 7;
  std::vector<float> padded(static_cast<size_t>(2 * kChunk * stride), -999.0f);
  for (int64_t r = 0; r < 2 * kChunk; ++r) {
    std::memcpy(&padded[static_cast<size_t>(r * stride)], &rows[static_cast<size_t>(r * kCols)],
                kCols * 4);
  }
  TensorView view{padded.data(), DType::kFloat32, 2 * kChunk, kCols, stride, Device::kHost, 0};
  EXPECT_EQ(store_->store_hidden_states(tokens, view, {}).cached, 2);
  auto out = store_->retrieve_hidden_states(tokens);
  ASSERT_TRUE(out);
  expect_rows(*out, tokens, 0);
}

TEST_F(StoreTest, KeysAlignWithKvChunkKeys) {
  Config c = config_;
  c.max_local_cpu_size = 0.01;
  auto engine = Engine::create(c);
  const auto tokens = make_tokens(3 * kChunk, 4);
  std::vector<uint16_t> kv(static_cast<size_t>(3 * kChunk * 8), 7);
  EXPECT_EQ(engine->store(tokens, view_of(kv, 8, DType::kBFloat16)), 3);
  const auto rows = make_rows(tokens, 0, 0, kCols);
  EXPECT_EQ(engine->hidden_state_store()->store_hidden_states(tokens, view_of(rows, kCols)).cached,
            3);
  for (const Chunk& chunk : engine->token_database().process_tokens(tokens)) {
    EXPECT_TRUE(engine->kv_backend().contains(chunk.key));
    EXPECT_TRUE(engine->hidden_state_store()->has_chunk(chunk.key, 0));
  }
}

TEST_F(StoreTest, KvEvictionTruncatesThePrefixAndDropsTheOrphan) {
  const auto tokens = make_tokens(4 * kChunk, 5);
  ASSERT_EQ(store_rows(tokens, 0), 4);
  ASSERT_EQ(store_rows(tokens, 1), 4);
  const auto chunks = db_.process_tokens(tokens);
  kv_.evict(chunks[2].key);
  auto out = store_->retrieve_hidden_states(tokens);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), 2 * kChunk);
  expect_rows(*out, tokens, 0);
  // KV evicted => every layer of that key dropped; the later chunk stays (it was not reached).
  EXPECT_FALSE(store_->has_chunk(chunks[2].key, 0));
  EXPECT_FALSE(store_->has_chunk(chunks[2].key, 1));
  EXPECT_TRUE(store_->has_chunk(chunks[3].key, 0));
  EXPECT_EQ(store_->stats().coupled_evictions, 1u);
  EXPECT_EQ(store_->num_cached_chunks(), 3u);  // distinct keys, as LMCache counts
  EXPECT_EQ(store_->num_entries(), 6u);
}

TEST_F(StoreTest, KvEvictedAtFirstChunkIsAFullMiss) {
  const auto tokens = make_tokens(2 * kChunk, 6);
  ASSERT_EQ(store_rows(tokens), 2);
  kv_.evict(db_.process_tokens(tokens)[0].key);
  EXPECT_FALSE(store_->retrieve_hidden_states(tokens).has_value());
}

TEST_F(StoreTest, HoleInTheMiddleStopsThePrefix) {
  const auto tokens = make_tokens(4 * kChunk, 7);
  ASSERT_EQ(store_rows(tokens), 4);
  const auto chunks = db_.process_tokens(tokens);
  ASSERT_TRUE(store_->drop_key(chunks[1].key));
  auto out = store_->retrieve_hidden_states(tokens);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), kChunk);
  expect_rows(*out, tokens, 0);
  EXPECT_TRUE(store_->has_chunk(chunks[3].key, 0));  // HS holes never drop later chunks
}

TEST_F(StoreTest, LayersAreIndependentIncludingNegativeIndices) {
  const auto tokens = make_tokens(3 * kChunk, 8);
  ASSERT_EQ(store_rows(tokens, -1), 3);
  ASSERT_EQ(store_rows(std::vector<int32_t>(tokens.begin(), tokens.begin() + 2 * kChunk), 5), 2);
  auto final_state = store_->retrieve_hidden_states(tokens, {-1, 0});
  auto tap = store_->retrieve_hidden_states(tokens, {5, 0});
  ASSERT_TRUE(final_state && tap);
  EXPECT_EQ(final_state->rows(), 3 * kChunk);
  EXPECT_EQ(tap->rows(), 2 * kChunk);
  expect_rows(*final_state, tokens, -1);
  expect_rows(*tap, tokens, 5);
  EXPECT_FALSE(store_->retrieve_hidden_states(tokens, {3, 0}).has_value());
}

TEST_F(StoreTest, RetrieveLayersIsAllOrNothingPerChunk) {
  const auto tokens = make_tokens(4 * kChunk, 9);
  ASSERT_EQ(store_rows(tokens, -1), 4);
  ASSERT_EQ(store_rows(std::vector<int32_t>(tokens.begin(), tokens.begin() + 3 * kChunk), 2), 3);
  const std::vector<int64_t> layers{-1, 2};
  auto out = store_->retrieve_layers(tokens, layers);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].rows(), 3 * kChunk);
  EXPECT_EQ(out[1].rows(), 3 * kChunk);
  expect_rows(out[0], tokens, -1);
  expect_rows(out[1], tokens, 2);
  const std::vector<int64_t> missing{-1, 99};
  EXPECT_TRUE(store_->retrieve_layers(tokens, missing).empty());
  auto tail = store_->retrieve_layers(tokens, layers, 3 * kChunk - 4);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].rows(), 4);
  expect_rows(tail[1], tokens, 2, 3 * kChunk - 4);
}

TEST_F(StoreTest, CoverageCountsTokensWithKvAndEveryLayerAndChangesNothing) {
  const auto tokens = make_tokens(4 * kChunk, 10);
  ASSERT_EQ(store_rows(tokens, 0), 4);
  ASSERT_EQ(store_rows(std::vector<int32_t>(tokens.begin(), tokens.begin() + 3 * kChunk), 1), 3);
  const auto chunks = db_.process_tokens(tokens);
  const std::vector<int64_t> both{0, 1}, first{0};
  EXPECT_EQ(store_->coverage(chunks, both), 3 * kChunk);
  EXPECT_EQ(store_->coverage(chunks, first), 4 * kChunk);
  kv_.evict(chunks[1].key);
  EXPECT_EQ(store_->coverage(chunks, first), kChunk);
  EXPECT_TRUE(store_->has_chunk(chunks[1].key, 0)) << "coverage must not drop orphans";
  EXPECT_EQ(store_->stats().retrieves, 0u);
}

TEST_F(StoreTest, RowBeginCopiesOnlyTheTailButChecksTheWholePrefix) {
  const auto tokens = make_tokens(4 * kChunk, 11);
  ASSERT_EQ(store_rows(tokens), 4);
  auto tail = store_->retrieve_hidden_states(tokens, {0, 4 * kChunk - 8});
  ASSERT_TRUE(tail);
  EXPECT_EQ(tail->rows(), 8);
  expect_rows(*tail, tokens, 0, 4 * kChunk - 8);
  kv_.evict(db_.process_tokens(tokens)[1].key);
  auto after = store_->retrieve_hidden_states(tokens, {0, kChunk - 3});
  ASSERT_TRUE(after);
  EXPECT_EQ(after->rows(), 3);
  expect_rows(*after, tokens, 0, kChunk - 3);
  EXPECT_FALSE(store_->retrieve_hidden_states(tokens, {0, kChunk}).has_value());
}

TEST_F(StoreTest, AllowlistSilentlySkipsOtherLayers) {
  config_.hidden_state_layers = std::vector<int64_t>{-1, 3};
  store_ = std::make_unique<HiddenStateStore>(config_, db_);
  const auto tokens = make_tokens(2 * kChunk, 12);
  EXPECT_EQ(store_rows(tokens, 0), 0);
  EXPECT_EQ(store_rows(tokens, -1), 2);
  EXPECT_EQ(store_rows(tokens, 3), 2);
  EXPECT_EQ(store_->num_cached_chunks(), 2u);
  EXPECT_EQ(store_->num_entries(), 4u);
  EXPECT_FALSE(store_->retrieve_hidden_states(tokens, {0, 0}).has_value());
}

TEST_F(StoreTest, IncrementalThinkerPatternWithTokenOffset) {
  const auto full = make_tokens(3 * kChunk + 5, 13);
  const std::vector<int32_t> first(full.begin(), full.begin() + kChunk);
  // Step 1: the first chunk, offset 0.
  EXPECT_EQ(store_rows(first, 0, 0), 1);
  // Step 2: the full prefix, rows only from the stored boundary on.
  EXPECT_EQ(store_rows(full, 0, kChunk), 2);  // chunks 1 and 2: the call's range
  auto out = store_->retrieve_hidden_states(full);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), 3 * kChunk);  // the trailing 5 tokens are an unfull chunk: not saved
  expect_rows(*out, full, 0);
  EXPECT_EQ(store_->stats().chunks_written, 3u);
}

TEST_F(StoreTest, ChunkStartingBeforeTokenOffsetIsSkipped) {
  const auto tokens = make_tokens(3 * kChunk, 14);
  EXPECT_EQ(store_rows(tokens, 0, kChunk + 3), 1);  // only chunk 2 starts at/after the offset
  const auto chunks = db_.process_tokens(tokens);
  EXPECT_FALSE(store_->has_chunk(chunks[0].key));
  EXPECT_FALSE(store_->has_chunk(chunks[1].key));
  EXPECT_TRUE(store_->has_chunk(chunks[2].key));
  EXPECT_FALSE(store_->retrieve_hidden_states(tokens).has_value());
}

TEST_F(StoreTest, RestoringCountsAlreadyCachedChunksAndDoesNotCopyAgain) {
  const auto tokens = make_tokens(3 * kChunk, 15);
  EXPECT_EQ(store_rows(tokens), 3);
  EXPECT_EQ(store_rows(tokens), 3);
  EXPECT_EQ(store_->stats().chunks_written, 3u);
  EXPECT_EQ(store_->stats().stores, 2u);
}

TEST_F(StoreTest, BadArgumentsThrowAndWriteNothing) {
  const auto tokens = make_tokens(2 * kChunk, 16);
  const auto rows = make_rows(tokens, 0, 0, kCols);
  auto expect_invalid = [&](const TensorView& v, StoreOptions o, const char* needle) {
    try {
      (void)store_->store_hidden_states(tokens, v, o);
      ADD_FAILURE() << "expected InvalidArgument mentioning " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid(view_of(rows, kCols), {0, -1}, "token_offset = -1");
  expect_invalid(view_of(rows, kCols), {0, 2 * kChunk + 1}, "token_offset = 33");
  expect_invalid(view_of(rows, kCols), {0, 1}, "hidden_states.rows = 32");
  TensorView no_cols{rows.data(), DType::kFloat32, 2 * kChunk, 0, 0, Device::kHost, 0};
  expect_invalid(no_cols, {}, "hidden_states.cols = 0");
  TensorView bad_stride{rows.data(), DType::kFloat32, 2 * kChunk, kCols, 3, Device::kHost, 0};
  expect_invalid(bad_stride, {}, "row_stride = 3");
  TensorView null_data{nullptr, DType::kFloat32, 2 * kChunk, kCols, 0, Device::kHost, 0};
  expect_invalid(null_data, {}, "data is null");
  std::vector<int32_t> negative = tokens;
  negative[5] = -4;
  EXPECT_THROW((void)store_->store_hidden_states(negative, view_of(rows, kCols)), InvalidArgument);
  EXPECT_EQ(store_->num_cached_chunks(), 0u);
  EXPECT_EQ(store_->stats().chunks_written, 0u);
  EXPECT_EQ(store_->stats().blocks_held, 0u);
}

TEST_F(StoreTest, WithoutStorageManagerKvCountsAsPresent) {
  store_->bind_storage_manager(nullptr);
  const auto tokens = make_tokens(2 * kChunk, 17);
  kv_.evict(db_.process_tokens(tokens)[0].key);
  ASSERT_EQ(store_rows(tokens), 2);
  auto out = store_->retrieve_hidden_states(tokens);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), 2 * kChunk);
}

TEST_F(StoreTest, Int64TokenOverloadsMatchInt32) {
  const auto tokens = make_tokens(2 * kChunk, 18);
  const std::vector<int64_t> wide(tokens.begin(), tokens.end());
  ASSERT_EQ(store_rows(tokens), 2);
  auto out = store_->retrieve_hidden_states(std::span<const int64_t>(wide));
  ASSERT_TRUE(out);
  expect_rows(*out, tokens, 0);
}

TEST_F(StoreTest, RetrieveIntoHostBufferWritesRowsAndChecksSize) {
  const auto tokens = make_tokens(3 * kChunk, 19);
  ASSERT_EQ(store_rows(tokens), 3);
  HostTensor out(3 * kChunk, kCols);
  EXPECT_EQ(store_->retrieve_hidden_states_into(tokens, out.mutable_view()), 3 * kChunk);
  expect_rows(out, tokens, 0);
  HostTensor small(3 * kChunk - 1, kCols);
  EXPECT_THROW((void)store_->retrieve_hidden_states_into(tokens, small.mutable_view()),
               InvalidArgument);
  HostTensor wrong_cols(3 * kChunk, kCols + 1);
  EXPECT_THROW((void)store_->retrieve_hidden_states_into(tokens, wrong_cols.mutable_view()),
               InvalidArgument);
}

TEST_F(StoreTest, CloseReleasesEverythingAndLaterCallsThrow) {
  const auto tokens = make_tokens(2 * kChunk, 20);
  ASSERT_EQ(store_rows(tokens), 2);
  store_->close();
  EXPECT_EQ(store_->num_cached_chunks(), 0u);
  EXPECT_THROW((void)store_->retrieve_hidden_states(tokens), Error);
  EXPECT_THROW((void)store_rows(tokens), Error);
  store_->close();  // idempotent
}

TEST_F(StoreTest, HiddenDimChangingPartWayEndsThePrefix) {
  const auto tokens = make_tokens(3 * kChunk, 29);
  const std::vector<int32_t> first(tokens.begin(), tokens.begin() + kChunk);
  ASSERT_EQ(store_rows(first), 1);
  const auto wide = make_rows(tokens, kChunk, 0, 2 * kCols);  // a caller bug: another width
  ASSERT_EQ(store_->store_hidden_states(tokens, view_of(wide, 2 * kCols), {0, kChunk}).cached, 2);
  auto out = store_->retrieve_hidden_states(tokens);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), kChunk);
  EXPECT_EQ(out->cols(), kCols);
  expect_rows(*out, tokens, 0);
}

TEST(StoreConstruction, PoolSizeMustBePositive) {
  Config c;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = 0;
  ChunkedTokenDatabase db(16, false);
  EXPECT_THROW(HiddenStateStore(c, db), ConfigError);
}

// ---- pool pressure ------------------------------------------------------------------------

class SmallPoolTest : public StoreTest {
 protected:
  SmallPoolTest() : StoreTest(4) {}
};

TEST_F(SmallPoolTest, PoolOfExactlyNChunksHoldsN) {
  const auto tokens = make_tokens(4 * kChunk, 21);
  EXPECT_EQ(store_rows(tokens), 4);
  const HiddenStateStats s = store_->stats();
  EXPECT_EQ(s.entries_held, 4u);
  EXPECT_EQ(s.hs_evictions, 0u);
  EXPECT_EQ((kChunk * kCols * 4) % static_cast<int64_t>(s.granule_bytes), 0);
  EXPECT_EQ(s.bytes_held, s.pool_capacity_bytes);
}

TEST_F(SmallPoolTest, PressureEvictsLeastRecentlyUsedKeysNeverKv) {
  const auto a = make_tokens(2 * kChunk, 22);
  const auto b = make_tokens(2 * kChunk, 23);
  const auto c = make_tokens(2 * kChunk, 24);
  ASSERT_EQ(store_rows(a), 2);
  ASSERT_EQ(store_rows(b), 2);
  ASSERT_TRUE(store_->retrieve_hidden_states(a));  // a becomes most recent
  ASSERT_EQ(store_rows(c), 2);                     // evicts b, not a
  EXPECT_TRUE(store_->retrieve_hidden_states(a).has_value());
  EXPECT_FALSE(store_->retrieve_hidden_states(b).has_value());
  EXPECT_TRUE(store_->retrieve_hidden_states(c).has_value());
  EXPECT_EQ(store_->stats().hs_evictions, 2u);
  EXPECT_EQ(store_->stats().coupled_evictions, 0u);
}

TEST_F(SmallPoolTest, RetrieveTouchesInReverseSoTheSuffixIsEvictedFirst) {
  const auto a = make_tokens(4 * kChunk, 25);
  ASSERT_EQ(store_rows(a), 4);
  ASSERT_TRUE(store_->retrieve_hidden_states(a));
  // One new chunk evicts the least recent key: a's last chunk, since chunk 0 was touched last.
  const auto b = make_tokens(kChunk, 26);
  ASSERT_EQ(store_rows(b), 1);
  const auto chunks = db_.process_tokens(a);
  EXPECT_TRUE(store_->has_chunk(chunks[0].key));
  EXPECT_TRUE(store_->has_chunk(chunks[1].key));
  EXPECT_TRUE(store_->has_chunk(chunks[2].key));
  EXPECT_FALSE(store_->has_chunk(chunks[3].key));
  auto out = store_->retrieve_hidden_states(a);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), 3 * kChunk);
}

TEST_F(SmallPoolTest, StoreLargerThanThePoolKeepsItsOwnPrefix) {
  const auto a = make_tokens(6 * kChunk, 27);
  // The call cannot evict its own chunks: it stops when the pool is full of them.
  EXPECT_EQ(store_rows(a), 4);
  EXPECT_GE(store_->stats().allocation_failures, 1u);
  auto out = store_->retrieve_hidden_states(a);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), 4 * kChunk);
  expect_rows(*out, a, 0);
}

TEST_F(SmallPoolTest, ChunkLargerThanTheWholePoolStoresNothing) {
  const auto tokens = make_tokens(kChunk, 28);
  const auto rows = make_rows(tokens, 0, 0, 5 * kCols);  // 5x the pool's block, 1.25x the pool
  EXPECT_EQ(store_->store_hidden_states(tokens, view_of(rows, 5 * kCols)).cached, 0);
  EXPECT_EQ(store_->num_cached_chunks(), 0u);
  EXPECT_EQ(store_->stats().allocation_failures, 1u);
}

TEST_F(SmallPoolTest, MixedShapesShareTheBlocksWithoutFragmenting) {
  // Fix the granule with a full chunk, then store entries needing 2 blocks and partial chunks.
  config_.save_unfull_chunk = true;
  ChunkedTokenDatabase unfull(kChunk, true);
  store_ = std::make_unique<HiddenStateStore>(config_, unfull);
  for (int round = 0; round < 50; ++round) {
    const auto t = make_tokens(kChunk + 1 + round % 5, 100 + static_cast<uint64_t>(round));
    const int64_t cols = (round % 3 == 1) ? 2 * kCols : kCols;
    const auto rows = make_rows(t, 0, 0, cols);
    EXPECT_GE(store_->store_hidden_states(t, view_of(rows, cols)).cached, 1);
    auto out = store_->retrieve_hidden_states(t);
    ASSERT_TRUE(out) << "round " << round;
    EXPECT_EQ(out->rows(), static_cast<int64_t>(t.size()));
    EXPECT_EQ(0, std::memcmp(out->data(), rows.data(), out->bytes()));
  }
  const HiddenStateStats s = store_->stats();
  EXPECT_LE(s.blocks_held * s.granule_bytes, s.pool_capacity_bytes);
  EXPECT_NO_THROW(store_->check_invariants());
}

}  // namespace
}  // namespace hss
