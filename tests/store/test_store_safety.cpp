// Failure and boundary behaviour of the store (issue "Nothing lost, nothing corrupted"): a store
// never evicts its own prefix, close() is final under concurrency, coverage == retrieve, bad
// arguments change nothing, stats included.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>

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

class Safety : public ::testing::Test {
 protected:
  explicit Safety(int64_t pool_chunks = 4)
      : config_(test::store_config(kChunk, kCols, pool_chunks)), db_(kChunk, false) {
    store_ = std::make_unique<HiddenStateStore>(config_, db_);
    store_->bind_storage_manager(&kv_);
  }
  StoreResult put(const std::vector<int32_t>& t, int64_t offset = 0, int64_t cols = kCols) {
    const auto rows = make_rows(t, offset, 0, cols);
    return store_->store_hidden_states(t, view_of(rows, cols), {.token_offset = offset});
  }
  static bool same(const HiddenStateStats& a, const HiddenStateStats& b) {
    return a.stores == b.stores && a.retrieves == b.retrieves && a.hit_tokens == b.hit_tokens &&
           a.miss_tokens == b.miss_tokens && a.entries_held == b.entries_held &&
           a.keys_held == b.keys_held && a.coupled_evictions == b.coupled_evictions &&
           a.hs_evictions == b.hs_evictions && a.pool_free_bytes == b.pool_free_bytes &&
           a.chunks_written == b.chunks_written;
  }

  Config config_;
  ChunkedTokenDatabase db_;
  FakeKv kv_;
  std::unique_ptr<HiddenStateStore> store_;
};

TEST_F(Safety, AStoreNeverEvictsItsOwnPrefixAndReportsHonestly) {
  const auto longer = make_tokens(6 * kChunk, 1);
  const std::vector<int32_t> four(longer.begin(), longer.begin() + 4 * kChunk);
  ASSERT_EQ(put(four), (StoreResult{4, 4}));  // the pool is full
  // Extending the prefix needs room, but the only keys are the call's own: it stops, keeps them.
  EXPECT_EQ(put(longer), (StoreResult{0, 4}));
  EXPECT_EQ(store_->stats().allocation_failures, 1u);
  EXPECT_EQ(store_->stats().hs_evictions, 0u);
  auto out = store_->retrieve_hidden_states(longer);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->rows(), 4 * kChunk);
  // Chunks before token_offset are protected too (they are the prefix the caller's KV covers).
  EXPECT_EQ(put(longer, 4 * kChunk), (StoreResult{0, 0}));
  EXPECT_EQ(store_->retrieve_hidden_states(longer)->rows(), 4 * kChunk);
}

TEST_F(Safety, PressureEvictsOtherKeysFirst) {
  const auto other = make_tokens(2 * kChunk, 2);
  const auto mine = make_tokens(4 * kChunk, 3);
  ASSERT_EQ(put(other).written, 2);
  EXPECT_EQ(put(mine), (StoreResult{4, 4}));
  EXPECT_EQ(store_->stats().hs_evictions, 2u);
  EXPECT_FALSE(store_->retrieve_hidden_states(other).has_value());
  EXPECT_EQ(store_->retrieve_hidden_states(mine)->rows(), 4 * kChunk);
}

TEST_F(Safety, ReStoringWithAnotherHiddenDimReplacesTheChunk) {
  const auto t = make_tokens(kChunk, 4);
  ASSERT_EQ(put(t).written, 1);
  EXPECT_EQ(put(t, 0, 2 * kCols), (StoreResult{1, 1}));
  auto out = store_->retrieve_hidden_states(t);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->cols(), 2 * kCols);
  const auto want = make_rows(t, 0, 0, 2 * kCols);
  EXPECT_EQ(0, std::memcmp(out->data(), want.data(), out->bytes()));
  EXPECT_EQ(store_->num_entries(), 1u);
  store_->check_invariants();
}

TEST_F(Safety, CoverageEqualsWhatRetrieveReturns) {
  config_ = test::store_config(kChunk, kCols, 16);
  store_ = std::make_unique<HiddenStateStore>(config_, db_);
  store_->bind_storage_manager(&kv_);
  const auto t = make_tokens(4 * kChunk, 5);
  ASSERT_EQ(put(t).written, 4);
  // A hidden dim that changes part-way: coverage must stop where retrieve stops.
  const auto longer = make_tokens(6 * kChunk, 5);
  ASSERT_EQ(put(longer, 4 * kChunk, 2 * kCols).written, 2);
  const auto chunks = db_.process_tokens(longer);
  const std::vector<int64_t> layer0{0};
  auto out = store_->retrieve_hidden_states(longer);
  ASSERT_TRUE(out);
  EXPECT_EQ(store_->coverage(chunks, layer0), out->rows());
  EXPECT_EQ(out->rows(), 4 * kChunk);
  kv_.evicted.insert(chunks[1].key.chunk_hash);
  const int64_t covered = store_->coverage(chunks, layer0);
  EXPECT_EQ(covered, kChunk);
  EXPECT_EQ(store_->retrieve_hidden_states(longer)->rows(), covered);
  // An empty slot list is rejected by both.
  EXPECT_THROW((void)store_->coverage(chunks, std::span<const int64_t>()), InvalidArgument);
  EXPECT_THROW((void)store_->retrieve_layers(longer, std::span<const int64_t>()), InvalidArgument);
}

TEST_F(Safety, RetrieveIntoValidatesBeforeDroppingOrCounting) {
  const auto t = make_tokens(3 * kChunk, 6);
  ASSERT_EQ(put(t).written, 3);
  const auto chunks = db_.process_tokens(t);
  kv_.evicted.insert(chunks[2].key.chunk_hash);  // an orphan the walk would drop
  std::vector<float> small(static_cast<size_t>(kChunk * kCols));
  const HiddenStateStats before = store_->stats();
  EXPECT_THROW(
      (void)store_->retrieve_hidden_states_into(t, {small.data(), DType::kFloat32, kChunk, kCols}),
      InvalidArgument);
  EXPECT_THROW((void)store_->retrieve_hidden_states_into(
                   t, {small.data(), DType::kFloat32, kChunk, kCols + 1}),
               InvalidArgument);
  EXPECT_TRUE(same(before, store_->stats()));
  EXPECT_TRUE(store_->has_chunk(chunks[2].key));  // not dropped by the failed call
}

TEST_F(Safety, EnumValuesOutsideTheirRangeAreInvalidArgument) {
  const auto t = make_tokens(kChunk, 7);
  const auto rows = make_rows(t, 0, 0, kCols);
  TensorView bad_dtype = view_of(rows, kCols);
  bad_dtype.dtype = static_cast<DType>(7);
  TensorView bad_device = view_of(rows, kCols);
  bad_device.device = static_cast<Device>(5);
  const HiddenStateStats before = store_->stats();
  EXPECT_THROW((void)store_->store_hidden_states(t, bad_dtype), InvalidArgument);
  EXPECT_THROW((void)store_->store_hidden_states(t, bad_device), InvalidArgument);
  std::vector<float> out(rows.size());
  MutableTensorView out_view{out.data(), DType::kFloat32, kChunk, kCols};
  out_view.device = static_cast<Device>(9);
  EXPECT_THROW((void)store_->retrieve_hidden_states_into(t, out_view), InvalidArgument);
  EXPECT_TRUE(same(before, store_->stats()));
}

TEST_F(Safety, BadArgumentsLeaveStatsUnchanged) {
  const auto t = make_tokens(2 * kChunk, 8);
  ASSERT_EQ(put(t).written, 2);
  const auto rows = make_rows(t, 0, 0, kCols);
  const HiddenStateStats before = store_->stats();
  EXPECT_THROW((void)store_->store_hidden_states(t, view_of(rows, kCols), {.token_offset = -1}),
               InvalidArgument);
  EXPECT_THROW((void)store_->store_hidden_states(t, view_of(rows, kCols), {.token_offset = 1}),
               InvalidArgument);
  const std::vector<int64_t> bad_tokens{1, -5};
  EXPECT_THROW((void)store_->store_hidden_states(std::span<const int64_t>(bad_tokens),
                                                 {rows.data(), DType::kFloat32, 2, kCols}),
               InvalidArgument);
  EXPECT_THROW((void)store_->retrieve_hidden_states(t, {.row_begin = -1}), InvalidArgument);
  EXPECT_TRUE(same(before, store_->stats()));
}

// One view validator for every entry point (hss/detail/checked.hpp): the limits of check_view_shape
// and a byte span of at most 2^48, so no loop or kernel indexes past int64_t. A store view of 2^19
// rows at a row stride of 2^30 elements spans 2^51 bytes: refused, naming the argument, with
// nothing read and nothing changed; a retrieve output of the same shape too.
TEST_F(Safety, AViewSpanningMoreThan2To48BytesIsInvalidArgumentNamingIt) {
  const int64_t rows = int64_t{1} << 19;
  const auto t = make_tokens(rows, 12);
  std::vector<float> tiny(kCols);
  const TensorView huge{tiny.data(), DType::kFloat32, rows, kCols, int64_t{1} << 30};
  const HiddenStateStats before = store_->stats();
  try {
    (void)store_->store_hidden_states(t, huge);
    ADD_FAILURE() << "a 2^51-byte view was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_states"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2^48"), std::string::npos) << e.what();
  }
  MutableTensorView out{tiny.data(), DType::kFloat32, rows, kCols, int64_t{1} << 30};
  EXPECT_THROW((void)store_->retrieve_hidden_states_into(t, out), InvalidArgument);
  // The row stride limit is the documented 2^32 elements (hss::limits), for every entry point.
  const TensorView too_strided{tiny.data(), DType::kFloat32, 1, kCols, (int64_t{1} << 32) + 1};
  EXPECT_THROW((void)store_->store_hidden_states(std::span<const int32_t>(t).first(1), too_strided),
               InvalidArgument);
  EXPECT_TRUE(same(before, store_->stats()));
}

TEST_F(Safety, AStoreThatStoresNothingChangesNothingInThePool) {
  config_.hidden_state_layers = std::vector<int64_t>{};  // empty allowlist: no layer
  store_ = std::make_unique<HiddenStateStore>(config_, db_);
  const auto t = make_tokens(kChunk, 9);
  const auto rows = make_rows(t, 0, 0, 4096);
  const HiddenStateStats before = store_->stats();
  EXPECT_EQ(store_->store_hidden_states(t, view_of(rows, 4096)), (StoreResult{0, 0}));
  const HiddenStateStats after = store_->stats();
  EXPECT_EQ(after.pool_free_bytes, before.pool_free_bytes);
  EXPECT_EQ(after.granule_bytes, before.granule_bytes);
}

TEST_F(Safety, CloseIsFinalEvenAgainstConcurrentStores) {
  for (int round = 0; round < 20; ++round) {
    store_ = std::make_unique<HiddenStateStore>(config_, db_);
    std::atomic<bool> go{true};
    std::thread writer([&] {
      for (uint64_t i = 0; go.load(); ++i) {
        try {
          (void)put(make_tokens(kChunk, 100 + i % 8));
        } catch (const Error&) {  // closed
          return;
        }
      }
    });
    std::this_thread::sleep_for(std::chrono::microseconds(200 * (round % 5)));
    store_->close();
    // Once close() returned the store holds nothing, now and later.
    EXPECT_EQ(store_->num_entries(), 0u);
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    EXPECT_EQ(store_->num_entries(), 0u);
    EXPECT_EQ(store_->num_cached_chunks(), 0u);
    EXPECT_TRUE(store_->lru_keys().empty());
    go = false;
    writer.join();
    const HiddenStateStats s = store_->stats();
    EXPECT_TRUE(s.closed);
    EXPECT_EQ(s.entries_held, 0u);
    EXPECT_EQ(s.pool_free_bytes, s.pool_capacity_bytes);
    EXPECT_THROW((void)put(make_tokens(kChunk, 1)), Error);
    EXPECT_THROW((void)store_->retrieve_hidden_states(make_tokens(kChunk, 1)), Error);
    EXPECT_FALSE(store_->has_chunk(db_.process_tokens(make_tokens(kChunk, 100))[0].key));
    EXPECT_NO_THROW(store_->flush());
    EXPECT_NO_THROW(store_->close());
  }
}

}  // namespace
}  // namespace hss
