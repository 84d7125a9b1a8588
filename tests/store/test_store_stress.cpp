// Many threads store, retrieve, drop and evict KV at once on a small pool; every row a reader gets
// is checked against the function it was made from, so a read of a slot reused by a concurrent
// eviction, a torn copy or a wrong prefix shows up as a value mismatch. A phase with the local
// disk tier on adds its writers, the read pipeline's reader threads and promotions to the mix.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "hss/hss.hpp"
#include "test_util.hpp"
#include "tier_test_dir.hpp"

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

// --- Issue 14: 8 threads, both kinds of eviction, every row validated, close() under load. -----
// Run under ThreadSanitizer by `make tsan` (HSS_STRESS_SECONDS=N runs each phase for N seconds
// instead of a fixed number of operations; the checks do not depend on timing).
namespace hss {
namespace {

constexpr int kStressThreads = 8;
constexpr int64_t kStressLayers[] = {-1, 0, 3};
constexpr ActivationKind kStressKinds[] = {ActivationKind::kHidden, ActivationKind::kKey};

// Rows of (tokens, kind, layer): the value function of test_util.hpp with the kind folded in.
std::vector<float> stress_rows(std::span<const int32_t> tokens, ActivationKind kind,
                               int64_t layer) {
  return test::make_rows(tokens, 0, layer + 1000 * static_cast<int64_t>(kind), kCols);
}

double stress_seconds() {
  const char* value = std::getenv("HSS_STRESS_SECONDS");
  return value != nullptr ? std::atof(value) : 0.0;
}

// Stops after `ops` operations, or after HSS_STRESS_SECONDS when that is set.
class StressBudget {
 public:
  explicit StressBudget(int ops)
      : ops_(ops), seconds_(stress_seconds()), start_(std::chrono::steady_clock::now()) {}
  [[nodiscard]] bool more(int done) const {
    if (seconds_ <= 0) return done < ops_;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() <
           seconds_;
  }

 private:
  int ops_;
  double seconds_;
  std::chrono::steady_clock::time_point start_;
};

struct StressWorld {
  /// `disk_dir`: the local disk tier's directory, none when empty.
  explicit StressWorld(const std::string& disk_dir = "") {
    Config config;
    config.chunk_size = kChunk;
    config.enable_hidden_state_cache = true;
    // 48 chunk entries of 16 x 64 float32 and 40 KV chunks: both sides evict all the time.
    config.max_hidden_state_cpu_size = static_cast<double>(48 * kChunk * kCols * 4) / (1ULL << 30);
    config.max_local_cpu_size = static_cast<double>(40 * kChunk * 8 * 2) / (1ULL << 30);
    if (!disk_dir.empty()) {
      config.local_disk = disk_dir;
      config.max_local_disk_size = 0.0625;  // 64 MiB: every value fits, eviction by KV only
    }
    engine = Engine::create(config);
    for (uint64_t s = 0; s < 6; ++s) bases.push_back(test::make_tokens(8 * kChunk, 900 + s));
  }
  HiddenStateStore& store() { return *engine->hidden_state_store(); }
  std::unique_ptr<Engine> engine;
  std::vector<std::vector<int32_t>> bases;
  std::atomic<int64_t> rows_checked{0}, mismatches{0};
};

// One random operation; every row a read returns is compared with the value function.
void stress_op(StressWorld& w, std::mt19937_64& rng) {
  HiddenStateStore& store = w.store();
  const auto& base = w.bases[rng() % w.bases.size()];
  const auto len = static_cast<int64_t>(kChunk * (1 + rng() % 8));
  const std::vector<int32_t> tokens(base.begin(), base.begin() + len);
  const int64_t layer = kStressLayers[rng() % 3];
  const ActivationKind kind = kStressKinds[rng() % 2];
  const auto check = [&](const float* data, int64_t rows, int64_t row_begin, int64_t stride,
                         ActivationKind k, int64_t l) {
    const auto expected = stress_rows(tokens, k, l);
    bool ok = rows % kChunk == (kChunk - row_begin % kChunk) % kChunk && row_begin + rows <= len;
    for (int64_t r = 0; ok && r < rows; ++r) {
      ok = std::memcmp(data + r * stride, expected.data() + (row_begin + r) * kCols,
                       kCols * sizeof(float)) == 0;
    }
    if (!ok) w.mismatches.fetch_add(1);
    w.rows_checked.fetch_add(rows);
  };
  switch (rng() % 11) {
    case 0:
    case 1: {
      std::vector<uint16_t> kv(static_cast<size_t>(len * 8), static_cast<uint16_t>(len));
      (void)w.engine->store(tokens, test::view_of(kv, 8, DType::kBFloat16));
      const auto rows = stress_rows(tokens, kind, layer);
      StoreOptions opt;
      opt.layer_idx = layer;
      opt.kind = kind;
      (void)store.store_hidden_states(tokens, test::view_of(rows, kCols), opt);
      break;
    }
    case 2:
    case 3: {
      RetrieveOptions opt;
      opt.layer_idx = layer;
      opt.kind = kind;
      opt.row_begin = rng() % 3 == 0 ? static_cast<int64_t>(rng() % len) : 0;
      if (auto out = store.retrieve_hidden_states(tokens, opt)) {
        check(out->data(), out->rows(), opt.row_begin, kCols, kind, layer);
      }
      break;
    }
    case 4: {  // into a strided buffer with a guard row below and guard columns
      const int64_t stride = kCols + 5;
      std::vector<float> buffer(static_cast<size_t>((len + 1) * stride), -7.0f);
      RetrieveOptions opt;
      opt.layer_idx = layer;
      opt.kind = kind;
      const MutableTensorView out{buffer.data(), DType::kFloat32, len, kCols,
                                  stride,        Device::kHost,   0};
      const int64_t rows = store.retrieve_hidden_states_into(tokens, out, opt);
      check(buffer.data(), rows, 0, stride, kind, layer);
      for (int64_t r = 0; r <= len; ++r) {
        for (int64_t c = r < rows ? kCols : 0; c < stride; ++c) {
          if (buffer[static_cast<size_t>(r * stride + c)] != -7.0f) w.mismatches.fetch_add(1);
        }
      }
      break;
    }
    case 5: {
      const std::vector<Slot> slots{{kind, layer}, {ActivationKind::kHidden, -1}};
      const auto chunks = w.engine->token_database().process_tokens(tokens);
      (void)store.coverage(chunks, slots);  // may differ from the retrieve: threads race
      const auto out = store.retrieve_layers(tokens, slots, 0);
      for (size_t s = 0; s < out.size(); ++s) {
        check(out[s].data(), out[s].rows(), 0, kCols, slots[s].kind, slots[s].layer_idx);
      }
      break;
    }
    case 6: {
      const auto chunks = w.engine->token_database().process_tokens(tokens);
      (void)store.drop_key(chunks[rng() % chunks.size()].key);
      break;
    }
    case 7:
      (void)store.evict_one_lru();
      break;
    case 8: {  // a batch: the three layers of the prefix, one token list
      std::vector<uint16_t> kv(static_cast<size_t>(len * 8), static_cast<uint16_t>(len));
      (void)w.engine->store(tokens, test::view_of(kv, 8, DType::kBFloat16));
      const std::vector<int64_t> ids(tokens.begin(), tokens.end());
      std::vector<std::vector<float>> rows;
      std::vector<StoreItem> items;
      for (const int64_t l : kStressLayers) rows.push_back(stress_rows(tokens, kind, l));
      for (size_t i = 0; i < rows.size(); ++i) {
        StoreOptions opt;
        opt.layer_idx = kStressLayers[i];
        opt.kind = kind;
        items.push_back({ids, test::view_of(rows[i], kCols), opt});
      }
      (void)store.store_batch(items);
      break;
    }
    case 9: {  // a batch of reads: every layer of the prefix, each checked
      const std::vector<int64_t> ids(tokens.begin(), tokens.end());
      std::vector<std::vector<float>> outs;
      outs.reserve(std::size(kStressLayers));  // items point into them
      std::vector<RetrieveItem> items;
      for (const int64_t l : kStressLayers) {
        outs.emplace_back(static_cast<size_t>(len * kCols), -7.0f);
        RetrieveOptions opt;
        opt.layer_idx = l;
        opt.kind = kind;
        items.push_back(
            {ids, {outs.back().data(), DType::kFloat32, len, kCols, 0, Device::kHost, 0}, opt});
      }
      const std::vector<int64_t> rows = store.retrieve_batch_into(items);
      for (size_t i = 0; i < items.size(); ++i) {
        check(outs[i].data(), rows[i], 0, kCols, kind, kStressLayers[i]);
      }
      break;
    }
    default:
      (void)store.has_chunk(w.engine->token_database().process_tokens(tokens)[0].key, layer, kind);
      (void)store.stats();
      break;
  }
}

/// kStressThreads threads run stress_op on `w` while `more(op)` holds (each its own seed from
/// `seed`); every row they read was checked, none mismatched, no call threw.
template <typename More>
void run_stress_threads(StressWorld& w, uint64_t seed, const More& more) {
  std::atomic<int64_t> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kStressThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t) * seed + 7);
      try {
        for (int op = 0; more(op); ++op) stress_op(w, rng);
      } catch (const std::exception& e) {
        failures.fetch_add(1);
        ADD_FAILURE() << "thread " << t << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(w.mismatches.load(), 0);
  EXPECT_GT(w.rows_checked.load(), 0);
}

TEST(StoreStress, EightThreadsBothEvictionsEveryRowValidated) {
  StressWorld w;
  const StressBudget budget(1500);
  run_stress_threads(w, 104729, [&](int op) { return budget.more(op); });
  HiddenStateStore& store = w.store();
  EXPECT_NO_THROW(store.check_invariants());
  const HiddenStateStats s = store.stats();
  EXPECT_GT(s.hs_evictions, 0u);                            // pool pressure
  EXPECT_GT(w.engine->kv_backend().stats().evictions, 0u);  // the KV backend's own LRU
  EXPECT_GT(s.coupled_evictions, 0u);                       // KV gone => HS dropped
  EXPECT_EQ(s.entries_held, store.num_entries());
  EXPECT_EQ(s.keys_held, store.num_cached_chunks());
  EXPECT_EQ(s.pool_free_bytes + s.blocks_held * s.granule_bytes, s.pool_capacity_bytes);
  std::printf(
      "[ stress   ] %lld rows validated, %llu HS evictions, %llu KV evictions, %llu coupled\n",
      static_cast<long long>(w.rows_checked.load()),
      static_cast<unsigned long long>(s.hs_evictions),
      static_cast<unsigned long long>(w.engine->kv_backend().stats().evictions),
      static_cast<unsigned long long>(s.coupled_evictions));
}

// The same eight threads with the local disk tier on: the pool evicts into the write-behind,
// misses read through the disk (several files a call: the read pipeline's reader thread), KV
// eviction discards files. Every row read is checked; under TSan this phase runs for a third of
// HSS_STRESS_SECONDS.
TEST(StoreStress, EightThreadsWithTheDiskTierEveryRowValidated) {
  const test::TempDir dir;
  StressWorld w(dir.root);
  const double seconds = stress_seconds();
  const auto start = std::chrono::steady_clock::now();
  run_stress_threads(w, 15485863, [&](int op) {
    if (seconds <= 0) return op < 800;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
           seconds / 3;
  });
  HiddenStateStore& store = w.store();
  store.flush();
  EXPECT_NO_THROW(store.check_invariants());
  const HiddenStateStats s = store.stats();
  ASSERT_EQ(s.tiers.size(), 1U);
  const TierStats& disk = s.tiers[0];
  EXPECT_EQ(disk.name, "disk");
  EXPECT_GT(disk.writes_done, 0U);
  EXPECT_GT(disk.hits, 0U);  // pool misses served from the files
  EXPECT_EQ(disk.corrupt_values, 0U);
  EXPECT_EQ(disk.errors, 0U);
  EXPECT_GT(s.hs_evictions, 0u);
  std::printf("[ stress   ] disk tier: %lld rows validated, %llu files written, %llu disk hits\n",
              static_cast<long long>(w.rows_checked.load()),
              static_cast<unsigned long long>(disk.writes_done),
              static_cast<unsigned long long>(disk.hits));
}

// close() while 8 threads work: once it returns the store holds nothing, and a call that starts
// afterwards fails with hss::Error (or, for queries, reports nothing held).
TEST(StoreStress, CloseUnderLoadIsFinal) {
  StressWorld w;
  std::atomic<bool> close_started{false}, close_returned{false};
  std::atomic<int64_t> ops_before_close{0}, failures{0}, late_successes{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kStressThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t) * 7727 + 3);
      int after_close = 0;
      while (after_close < 50) {
        const bool started_after_close = close_returned.load();
        try {
          stress_op(w, rng);
          if (!close_started.load()) ops_before_close.fetch_add(1);
        } catch (const Error& e) {
          if (!close_started.load()) {
            failures.fetch_add(1);
            ADD_FAILURE() << "thread " << t << " before close(): " << e.what();
            return;
          }
          if (started_after_close) ++after_close;
          continue;
        }
        if (started_after_close) {
          // Reads of a closed store that succeed must see nothing (num_*, has_chunk, stats);
          // only the state is checked below. Count mutating calls that went through.
          ++after_close;
          if (w.store().num_entries() != 0) late_successes.fetch_add(1);
        }
      }
    });
  }
  const StressBudget budget(4000);
  while (budget.more(static_cast<int>(ops_before_close.load())) && failures.load() == 0) {
    std::this_thread::yield();
  }
  close_started.store(true);
  w.store().close();
  // Final at once, while the threads still call in.
  HiddenStateStats s = w.store().stats();
  EXPECT_TRUE(s.closed);
  EXPECT_EQ(s.entries_held, 0u);
  EXPECT_EQ(w.store().num_entries(), 0u);
  EXPECT_EQ(w.store().num_cached_chunks(), 0u);
  EXPECT_TRUE(w.store().lru_keys().empty());
  close_returned.store(true);
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(late_successes.load(), 0);
  EXPECT_EQ(w.mismatches.load(), 0);
  EXPECT_GT(ops_before_close.load(), 0);
  s = w.store().stats();
  EXPECT_EQ(s.entries_held, 0u);
  EXPECT_EQ(s.keys_held, 0u);
  EXPECT_EQ(s.pool_free_bytes, s.pool_capacity_bytes);
  EXPECT_EQ(w.store().num_entries(), 0u);
  EXPECT_THROW(
      (void)w.store().store_hidden_states(
          w.bases[0], test::view_of(stress_rows(w.bases[0], ActivationKind::kHidden, 0), kCols)),
      Error);
  EXPECT_NO_THROW(w.store().check_invariants());
}

}  // namespace
}  // namespace hss
