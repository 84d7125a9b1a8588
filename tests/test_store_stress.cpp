// Many threads store, retrieve, drop and evict KV at once on a small pool; every row a reader gets
// is checked against the function it was made from, so a read of a slot reused by a concurrent
// eviction, a torn copy or a wrong prefix shows up as a value mismatch.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "hss/hss.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 64;

TEST(StoreStress, ConcurrentReadersOnlyEverSeeCorrectRows) {
  Config config;
  config.chunk_size = kChunk;
  config.enable_hidden_state_cache = true;
  config.max_hidden_state_cpu_size = static_cast<double>(40 * kChunk * kCols * 4) / (1ULL << 30);
  config.max_local_cpu_size = static_cast<double>(60 * kChunk * 8 * 2) / (1ULL << 30);
  auto engine = Engine::create(config);
  HiddenStateStore& store = *engine->hidden_state_store();

  std::vector<std::vector<int32_t>> bases;
  for (uint64_t s = 0; s < 8; ++s) bases.push_back(test::make_tokens(10 * kChunk, 500 + s));

  constexpr int kThreads = 4;
  constexpr int kOps = 3000;
  std::atomic<int64_t> rows_checked{0}, mismatches{0}, failures{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(static_cast<uint64_t>(id) * 7919 + 1);
    try {
      for (int op = 0; op < kOps; ++op) {
        const auto& base = bases[rng() % bases.size()];
        const auto len = static_cast<int64_t>(kChunk * (1 + rng() % 10));
        const std::vector<int32_t> tokens(base.begin(), base.begin() + len);
        const int64_t layer = static_cast<int64_t>(rng() % 2) - 1;  // -1 or 0
        const int kind = static_cast<int>(rng() % 10);
        if (kind < 4) {
          std::vector<uint16_t> kv(static_cast<size_t>(len * 8), static_cast<uint16_t>(len));
          (void)engine->store(tokens, test::view_of(kv, 8, DType::kBFloat16));
          const auto rows = test::make_rows(tokens, 0, layer, kCols);
          (void)store.store_hidden_states(tokens, test::view_of(rows, kCols), {layer, 0});
        } else if (kind < 9) {
          const int64_t row_begin = (rng() % 3 == 0) ? static_cast<int64_t>(rng() % len) : 0;
          auto out = store.retrieve_hidden_states(tokens, {layer, row_begin});
          if (!out) continue;
          const auto expected = test::make_rows(tokens, 0, layer, kCols);
          if (out->rows() + row_begin > len ||
              std::memcmp(out->data(), expected.data() + row_begin * kCols, out->bytes()) != 0) {
            mismatches.fetch_add(1);
          }
          rows_checked.fetch_add(out->rows());
        } else {
          const auto chunks = engine->token_database().process_tokens(tokens);
          (void)store.drop_key(chunks[rng() % chunks.size()].key);
        }
      }
    } catch (const std::exception& e) {
      failures.fetch_add(1);
      ADD_FAILURE() << "thread " << id << ": " << e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();

  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(rows_checked.load(), 0);
  const HiddenStateStats s = store.stats();
  EXPECT_GT(s.hs_evictions, 0u);
  EXPECT_GT(s.coupled_evictions + engine->kv_backend().stats().evictions, 0u);
  // Accounting stayed consistent: what the index says it holds fits the pool.
  EXPECT_LE(s.blocks_held * s.granule_bytes, s.pool_capacity_bytes);
  EXPECT_EQ(s.keys_held, store.num_cached_chunks());
}

}  // namespace
}  // namespace hss
