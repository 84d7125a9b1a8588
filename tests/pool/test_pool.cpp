// The hidden-state pool never loses capacity to shape: fixed granules, no first-shape rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>

#include "base/huge_pages.hpp"
#include "pool/block_pool.hpp"
#include "hss/hss.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using test::make_tokens;

TEST(BlockPool, GranuleIs64KiBForLargePoolsAndSmallerForSmallOnes) {
  using detail::BlockPool;
  EXPECT_EQ(BlockPool::granule_for_pool(uint64_t{1} << 30), 64u << 10);
  EXPECT_EQ(BlockPool::granule_for_pool(uint64_t{64} << 20), 64u << 10);
  EXPECT_EQ(BlockPool::granule_for_pool(uint64_t{1} << 20), 1024u);
  EXPECT_EQ(BlockPool::granule_for_pool(4096), 64u);
  EXPECT_EQ(BlockPool::granule_for_pool(100), 64u);
}

TEST(BlockPool, GrantsAscendingIdsAndTakesNothingWhenShort) {
  detail::BlockPool pool(64 * 10, 64, false, false);
  ASSERT_EQ(pool.num_blocks(), 10u);
  std::vector<uint32_t> a(4), b(7);
  ASSERT_TRUE(pool.allocate(a));
  EXPECT_EQ(a, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_FALSE(pool.allocate(b));
  EXPECT_EQ(pool.free_blocks(), 6u);
  pool.release(a);
  EXPECT_EQ(pool.free_blocks(), 10u);
  ASSERT_TRUE(pool.allocate(b));
  EXPECT_EQ(b, (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(BlockPool, AnUnpinnedArenaStartsOnAHugePage) {
  // Only whole, aligned 2 MiB ranges get huge pages: an arena off the boundary would lose its
  // first and last (kernels before 6.7 did not align large mappings).
  for (const bool prefault : {false, true}) {
    detail::BlockPool pool((uint64_t{8} << 20) + 4096, 0, /*try_pinned=*/false, prefault);
    ASSERT_FALSE(pool.pinned());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.block_address(0)) % detail::kHugePageBytes, 0U);
    // Every granule is the pool's to write.
    std::memset(pool.block_address(0), 0x3C, pool.capacity_bytes());
  }
}

TEST(BlockPool, RejectsABadGranuleAndAPoolLargerThanMemory) {
  EXPECT_THROW(detail::BlockPool(4096, 100, false, false), InvalidArgument);
  EXPECT_THROW(detail::BlockPool(4096, uint64_t{128} << 20, false, false), InvalidArgument);
  EXPECT_THROW(detail::BlockPool(32, 0, false, false), InvalidArgument);
  // 2^50 bytes can never be populated here: an error naming the size, not an OOM kill.
  try {
    detail::BlockPool pool(uint64_t{1} << 50, 0, false, /*prefault=*/true);
    FAIL() << "a 1 PiB pool was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(uint64_t{1} << 50)), std::string::npos);
  }
}

/// A store whose pool is `pool_bytes`, float32 or native storage, hidden dims varying per call.
class PoolCapacity : public ::testing::Test {
 protected:
  static constexpr int64_t kChunk = 64;
  PoolCapacity() : db_(kChunk, true) {}

  void make(uint64_t pool_bytes, StorageDType storage = StorageDType::kFloat32) {
    Config c;
    c.chunk_size = kChunk;
    c.save_unfull_chunk = true;
    c.enable_hidden_state_cache = true;
    c.max_hidden_state_cpu_size = static_cast<double>(pool_bytes) / static_cast<double>(1 << 30);
    c.hidden_state_storage_dtype = storage;
    store_ = std::make_unique<HiddenStateStore>(c, db_);
  }

  StoreResult put(int64_t tokens, int64_t cols, uint64_t seed, int64_t layer = 0,
                  DType dtype = DType::kFloat32, ActivationKind kind = ActivationKind::kHidden) {
    const auto t = make_tokens(tokens, seed);
    std::vector<uint16_t> half(static_cast<size_t>(tokens * cols), 0x3f80);
    std::vector<float> full(static_cast<size_t>(tokens * cols), 1.0f);
    const TensorView view = dtype == DType::kFloat32 ? TensorView{full.data(), dtype, tokens, cols}
                                                     : TensorView{half.data(), dtype, tokens, cols};
    StoreOptions o;
    o.layer_idx = layer;
    o.kind = kind;
    return store_->store_hidden_states(t, view, o);
  }

  /// Drops every key, then checks the pool is whole again.
  void empty_and_check() {
    for (const CacheEngineKey& key : store_->lru_keys()) (void)store_->drop_key(key);
    const HiddenStateStats s = store_->stats();
    ASSERT_EQ(s.entries_held, 0u);
    ASSERT_EQ(s.pool_free_bytes, s.pool_capacity_bytes);
    store_->check_invariants();
  }

  ChunkedTokenDatabase db_;
  std::unique_ptr<HiddenStateStore> store_;
};

TEST_F(PoolCapacity, FirstShapeNoLongerFixesTheGranule) {
  // The old pool: a first store of hidden dim 384 made 4096-dim chunks take 11 blocks (7 of 8 fit).
  const uint64_t chunk_bytes = kChunk * 4096 * 4;  // 1 MiB, a multiple of 64 KiB
  make(8 * chunk_bytes);
  EXPECT_EQ(put(kChunk, 384, 1).written, 1);
  empty_and_check();
  EXPECT_EQ(put(8 * kChunk, 4096, 2), (StoreResult{8, 8}));
  EXPECT_EQ(store_->stats().hs_evictions, 0u);
}

TEST_F(PoolCapacity, WasteIsBelowOneGranulePerEntry) {
  make(uint64_t{64} << 20);
  ASSERT_EQ(store_->stats().granule_bytes, 64u << 10);
  (void)put(kChunk + 3, 100, 3);  // 25.6 KB + 1.2 KB: two entries, each under one granule
  const HiddenStateStats s = store_->stats();
  EXPECT_EQ(s.blocks_held, 2u);
  for (int64_t cols : {1, 63, 1000, 4097}) {
    const uint64_t bytes = static_cast<uint64_t>(kChunk * cols * 4);
    const uint64_t taken = (bytes + s.granule_bytes - 1) / s.granule_bytes * s.granule_bytes;
    EXPECT_LE(taken - bytes, std::max<uint64_t>(64 << 10, bytes / 64));
  }
}

// After any sequence (mixed dims, partial chunks, layers, kinds, float32 and native storage,
// evictions, drops), an empty pool takes floor(pool / chunk_bytes) chunks of any uniform shape
// whose bytes are a multiple of 64 KiB, in one call; the invariants hold after every operation.
TEST_F(PoolCapacity, RandomOperationsNeverFragmentThePool) {
  const uint64_t pool = uint64_t{24} << 20;  // 384 granules of 64 KiB
  for (StorageDType storage : {StorageDType::kFloat32, StorageDType::kNative}) {
    make(pool, storage);
    std::mt19937_64 rng(42 + static_cast<int>(storage));
    auto pick = [&](uint64_t n) { return rng() % n; };
    const int64_t dims[] = {64, 100, 384, 1000, 1024, 2048, 4096, 5120};
    const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
    const int ops = 1500;
    for (int op = 0; op < ops; ++op) {
      const uint64_t what = pick(10);
      if (what < 6) {
        const int64_t tokens = 1 + static_cast<int64_t>(pick(6 * kChunk));
        (void)put(tokens, dims[pick(8)], pick(40), static_cast<int64_t>(pick(4)), dtypes[pick(3)],
                  static_cast<ActivationKind>(pick(kNumActivationKinds)));
      } else if (what < 8) {
        const auto keys = store_->lru_keys();
        if (!keys.empty()) (void)store_->drop_key(keys[pick(keys.size())]);
      } else {
        (void)store_->evict_one_lru();
      }
      ASSERT_NO_THROW(store_->check_invariants()) << "op " << op;
      const HiddenStateStats s = store_->stats();
      ASSERT_EQ(s.pool_free_bytes + s.blocks_held * s.granule_bytes, s.pool_capacity_bytes)
          << "op " << op;
    }
    empty_and_check();
    for (int64_t cols : {256, 1024, 4096}) {  // chunk bytes 64 KiB, 256 KiB, 1 MiB
      const int64_t chunks = static_cast<int64_t>(pool / static_cast<uint64_t>(kChunk * cols * 4));
      EXPECT_EQ(put(chunks * kChunk, cols, 1000 + static_cast<uint64_t>(cols)),
                (StoreResult{chunks, chunks}))
          << "cols " << cols;
      empty_and_check();
    }
  }
}

// 10^5 store-level operations on a small pool (64-byte granules), invariants after every one,
// then the exact capacity for uniform chunks whose bytes are a multiple of the granule.
TEST(PoolCapacitySmall, HundredThousandStoreOperationsKeepExactCapacity) {
  constexpr int64_t kChunk = 4;
  ChunkedTokenDatabase db(kChunk, true);
  Config c;
  c.chunk_size = kChunk;
  c.save_unfull_chunk = true;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = 65536.0 / static_cast<double>(1 << 30);  // 1024 granules of 64 B
  HiddenStateStore store(c, db);
  ASSERT_EQ(store.stats().granule_bytes, 64u);
  std::mt19937_64 rng(11);
  std::vector<float> rows(static_cast<size_t>(64 * 48), 0.5f);
  for (int op = 0; op < 100000; ++op) {
    const uint64_t what = rng() % 10;
    if (what < 6) {
      const int64_t tokens = 1 + static_cast<int64_t>(rng() % 48);
      const int64_t cols = 1 + static_cast<int64_t>(rng() % 64);
      const auto t = make_tokens(tokens, rng() % 64);
      StoreOptions o;
      o.layer_idx = static_cast<int64_t>(rng() % 3);
      o.kind = static_cast<ActivationKind>(rng() % kNumActivationKinds);
      (void)store.store_hidden_states(t, {rows.data(), DType::kFloat32, tokens, cols}, o);
    } else if (what < 8) {
      const auto keys = store.lru_keys();
      if (!keys.empty()) (void)store.drop_key(keys[rng() % keys.size()]);
    } else {
      (void)store.evict_one_lru();
    }
    if (op % 16 == 0 || op > 99000) {
      ASSERT_NO_THROW(store.check_invariants()) << "op " << op;
    }
    const HiddenStateStats s = store.stats();
    ASSERT_EQ(s.pool_free_bytes + s.blocks_held * s.granule_bytes, s.pool_capacity_bytes)
        << "op " << op;
  }
  while (store.evict_one_lru()) {
  }
  ASSERT_EQ(store.stats().pool_free_bytes, store.stats().pool_capacity_bytes);
  // 16 columns x 4 rows x 4 bytes = 256 bytes: 256 such chunks fill 64 KiB exactly.
  const auto t = make_tokens(256 * kChunk, 999);
  std::vector<float> big(static_cast<size_t>(256 * kChunk * 16), 1.0f);
  EXPECT_EQ(store.store_hidden_states(t, {big.data(), DType::kFloat32, 256 * kChunk, 16}),
            (StoreResult{256, 256}));
}

// The 10^5-operation variant on the pool itself (alloc/free of random sizes, checked each time).
TEST(BlockPool, HundredThousandRandomOperationsKeepExactCapacity) {
  detail::BlockPool pool(uint64_t{4} << 20, 0, false, false);  // 1024 granules of 4 KiB
  const uint64_t n = pool.num_blocks();
  std::mt19937_64 rng(7);
  std::vector<std::vector<uint32_t>> held;
  std::vector<uint8_t> owned(n, 0);
  uint64_t in_use = 0;
  for (int op = 0; op < 100000; ++op) {
    if (held.empty() || rng() % 2 == 0) {
      std::vector<uint32_t> ids(1 + rng() % 40);
      if (pool.allocate(ids)) {
        for (uint32_t id : ids) ASSERT_EQ(owned[id]++, 0) << "granule handed out twice";
        in_use += ids.size();
        held.push_back(std::move(ids));
      } else {
        ASSERT_LT(pool.free_blocks(), ids.size());
      }
    } else {
      const size_t i = rng() % held.size();
      for (uint32_t id : held[i]) owned[id] = 0;
      in_use -= held[i].size();
      pool.release(held[i]);
      held.erase(held.begin() + static_cast<ptrdiff_t>(i));
    }
    ASSERT_EQ(pool.free_blocks() + in_use, n);
  }
  for (const auto& ids : held) pool.release(ids);
  std::vector<uint32_t> all(n);
  EXPECT_TRUE(pool.allocate(all));
}

// A batch's GranuleStash is the pool's allocate with fewer locks. Driven by the same random
// grants and releases as a twin pool allocating directly (a failed grant releases the oldest
// holder, as an eviction would, and retries), every grant succeeds or fails alike, no id is
// handed out twice, and the free sets agree once the stashes died; estimates too small, exact
// and too large alike. Ids may differ only where a release came between two grants of a stash
// (the stash serves its own first): with no release in between they are the same ids.
TEST(BlockPool, AGranuleStashGrantsExactlyWhenThePoolWould) {
  for (const size_t expected : {size_t{0}, size_t{7}, size_t{200}, size_t{5000}}) {
    for (const bool releases : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "expected " << expected << " releases " << releases);
      detail::BlockPool direct(64 * 300, 64, false, false);
      detail::BlockPool stashed(64 * 300, 64, false, false);
      std::vector<uint8_t> owned(300, 0);
      std::mt19937_64 rng(11 + expected);
      std::vector<std::vector<uint32_t>> held_direct, held_stashed;  // the same grants
      const auto release = [&](size_t i) {
        direct.release(held_direct[i]);
        for (const uint32_t id : held_stashed[i]) owned[id] = 0;
        stashed.release(held_stashed[i]);
        held_direct.erase(held_direct.begin() + static_cast<ptrdiff_t>(i));
        held_stashed.erase(held_stashed.begin() + static_cast<ptrdiff_t>(i));
      };
      for (int round = 0; round < 20; ++round) {
        // Between stashes (the batch calls), releases in both modes.
        while (held_direct.size() > 20) release(rng() % held_direct.size());
        detail::GranuleStash stash(stashed, expected);
        for (int op = 0; op < 60; ++op) {
          if (releases && !held_direct.empty() && rng() % 4 == 0) {
            release(rng() % held_direct.size());
            continue;
          }
          std::vector<uint32_t> a(1 + rng() % 9), b(a.size());
          bool ok_a = direct.allocate(a);
          bool ok_b = stash.allocate(b);
          ASSERT_EQ(ok_a, ok_b) << "round " << round << " op " << op;
          while (!ok_a && !held_direct.empty()) {  // "evict" the oldest holder and retry
            release(0);
            ok_a = direct.allocate(a);
            ok_b = stash.allocate(b);
            ASSERT_EQ(ok_a, ok_b) << "round " << round << " op " << op;
          }
          if (!ok_a) continue;
          if (!releases) {
            ASSERT_EQ(a, b) << "round " << round << " op " << op;
          }
          for (const uint32_t id : b) ASSERT_EQ(owned[id]++, 0) << "granule handed out twice";
          held_direct.push_back(std::move(a));
          held_stashed.push_back(std::move(b));
        }
      }
      std::vector<uint32_t> free_direct, free_stashed;
      direct.free_ids(free_direct);
      stashed.free_ids(free_stashed);
      if (!releases) {
        EXPECT_EQ(free_direct, free_stashed);  // the same stack, id for id
      }
      std::sort(free_direct.begin(), free_direct.end());
      std::sort(free_stashed.begin(), free_stashed.end());
      std::vector<uint32_t> free_expected;
      for (uint32_t id = 0; id < 300; ++id) {
        if (owned[id] == 0) free_expected.push_back(id);
      }
      EXPECT_EQ(free_stashed, free_expected);
      EXPECT_EQ(free_direct.size(), free_stashed.size());
    }
  }
}

}  // namespace
}  // namespace hss
