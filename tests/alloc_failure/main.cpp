// The allocation-failure sweep (issue 14, bug 1): a store/retrieve/evict/drop workload (three
// layers, hidden-state pool pressure, a small KV backend that evicts) is run once to count its
// allocations, then once per allocation N in a forked child with std::bad_alloc thrown at the Nth.
// After the failure the workload goes on (a store left broken tends to crash later), then:
//   * the call that threw left the index and the pool as before it (strong guarantee: keys,
//     entries, bytes, granules, free pool bytes),
//   * check_invariants() holds,
//   * pool_free_bytes + blocks_held * granule_bytes == pool_capacity_bytes,
//   * dropping every key frees the whole pool, a new round trip is bit-exact, and after close()
//     the whole pool is free.
// Prints: points tried, points where the failure surfaced as an exception, broken stores, crashes.
// Exits non-zero unless there are 0 broken stores and 0 crashes.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "../fork_child.hpp"
#include "../test_util.hpp"
#include "failing_new.hpp"
#include "hss/hss.hpp"

namespace hss::alloc_failure {
namespace {

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;
constexpr int64_t kKvCols = 8;
constexpr int64_t kLayers[] = {0, 1, -1};

struct Failure {
  std::string what;
};

struct World {
  World() {
    config.chunk_size = kChunk;
    config.enable_hidden_state_cache = true;
    // Room for 10 of the 3-layer workload's entries, and for 6 KV chunks: both kinds evict.
    config.max_hidden_state_cpu_size = 10.0 * kChunk * kCols * 4 / (1ULL << 30);
    config.max_local_cpu_size = 6.0 * kChunk * kKvCols * 2 / (1ULL << 30);
    engine = Engine::create(config);
  }
  HiddenStateStore& store() { return *engine->hidden_state_store(); }
  Config config;
  std::unique_ptr<Engine> engine;
};

// The index and pool state that a failed call must leave as it found it.
std::string index_state(HiddenStateStore& store) {
  const Pause pause;
  const HiddenStateStats s = store.stats();
  std::vector<std::string> keys;
  for (const CacheEngineKey& key : store.lru_keys()) keys.push_back(key.to_string());
  std::sort(keys.begin(), keys.end());
  std::ostringstream out;
  out << "keys=" << s.keys_held << " entries=" << s.entries_held << " bytes=" << s.bytes_held
      << " granules=" << s.blocks_held << " free=" << s.pool_free_bytes
      << " num_entries=" << store.num_entries()
      << " num_cached_chunks=" << store.num_cached_chunks();
  for (const std::string& key : keys) out << "\n  " << key;
  return out.str();
}

void check_pool_accounting(HiddenStateStore& store, const char* when) {
  const Pause pause;
  const HiddenStateStats s = store.stats();
  if (s.pool_free_bytes + s.blocks_held * s.granule_bytes != s.pool_capacity_bytes) {
    throw Failure{std::string(when) + ": pool_free_bytes " + std::to_string(s.pool_free_bytes) +
                  " + granules held " + std::to_string(s.blocks_held) + " x " +
                  std::to_string(s.granule_bytes) + " != capacity " +
                  std::to_string(s.pool_capacity_bytes)};
  }
}

int g_surfaced = 0;  // steps whose call let the injected bad_alloc out (checked as strong)

// Runs one step; if it throws bad_alloc, checks the strong guarantee and swallows it.
template <typename Fn>
void step(HiddenStateStore& store, const char* name, Fn&& fn) {
  std::string before;
  {
    const Pause pause;
    before = index_state(store);
  }
  try {
    fn();
  } catch (const std::bad_alloc&) {
    ++g_surfaced;
    const std::string after = index_state(store);
    if (after != before) {
      throw Failure{std::string(name) + " threw bad_alloc and changed the index:\n--- before\n" +
                    before + "\n--- after\n" + after};
    }
  }
}

// The workload: 8 prompts of 3 chunks, 3 layers each, with retrieves, drops and evictions.
void workload(World& w) {
  HiddenStateStore& store = w.store();
  std::vector<std::vector<int32_t>> prompts;
  {
    const Pause pause;
    for (uint64_t p = 0; p < 8; ++p) prompts.push_back(test::make_tokens(3 * kChunk, 100 + p));
  }
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t>& tokens = prompts[p];
    std::vector<uint16_t> kv;
    std::vector<std::vector<float>> rows;
    {
      const Pause pause;
      kv.assign(tokens.size() * kKvCols, static_cast<uint16_t>(p + 1));
      for (const int64_t layer : kLayers) rows.push_back(test::make_rows(tokens, 0, layer, kCols));
    }
    step(store, "Engine::store",
         [&] { (void)w.engine->store(tokens, test::view_of(kv, kKvCols, DType::kBFloat16)); });
    for (size_t l = 0; l < std::size(kLayers); ++l) {
      step(store, "store_hidden_states", [&] {
        StoreOptions o;
        o.layer_idx = kLayers[l];
        (void)store.store_hidden_states(tokens, test::view_of(rows[l], kCols), o);
      });
    }
    step(store, "retrieve_hidden_states", [&] {
      (void)store.retrieve_hidden_states(prompts[p / 2], {kLayers[p % 3], 0});
    });
    step(store, "retrieve_layers", [&] {
      const std::vector<int64_t> layers{0, 1};
      (void)store.retrieve_layers(tokens, layers, kChunk / 2);
    });
    step(store, "retrieve_hidden_states_into", [&] {
      std::vector<float> out;
      {
        const Pause pause;
        out.resize(tokens.size() * kCols);
      }
      const MutableTensorView view{
          out.data(), DType::kFloat32, static_cast<int64_t>(tokens.size()), kCols, 0, Device::kHost,
          0};
      RetrieveOptions o;
      o.layer_idx = -1;
      (void)store.retrieve_hidden_states_into(tokens, view, o);
    });
    step(store, "coverage", [&] {
      const std::vector<int64_t> layers{0, -1};
      (void)store.coverage(w.engine->token_database().process_tokens(tokens), layers);
    });
    if (p % 3 == 2) {
      step(store, "drop_key", [&] {
        (void)store.drop_key(w.engine->token_database().process_tokens(prompts[p - 1])[1].key);
      });
    }
    if (p % 2 == 1) {
      step(store, "evict_one_lru", [&] { (void)store.evict_one_lru(); });
    }
    step(store, "has_chunk", [&] {
      (void)store.has_chunk(w.engine->token_database().process_tokens(tokens)[0].key, 1);
    });
  }
}

// Everything after the workload, without injected failures.
void check_after(World& w) {
  HiddenStateStore& store = w.store();
  try {
    store.check_invariants();
  } catch (const std::exception& e) {
    throw Failure{std::string("check_invariants: ") + e.what()};
  }
  check_pool_accounting(store, "after the workload");
  for (const CacheEngineKey& key : store.lru_keys()) (void)store.drop_key(key);
  const HiddenStateStats emptied = store.stats();
  if (emptied.pool_free_bytes != emptied.pool_capacity_bytes || emptied.entries_held != 0 ||
      store.num_entries() != 0) {
    throw Failure{"after dropping every key: " + std::to_string(emptied.entries_held) +
                  " entries held, pool free " + std::to_string(emptied.pool_free_bytes) + " of " +
                  std::to_string(emptied.pool_capacity_bytes)};
  }
  const auto tokens = test::make_tokens(2 * kChunk, 999);
  const auto rows = test::make_rows(tokens, 0, 0, kCols);
  std::vector<uint16_t> kv(tokens.size() * kKvCols, 5);
  (void)w.engine->store(tokens, test::view_of(kv, kKvCols, DType::kBFloat16));
  const StoreResult stored = store.store_hidden_states(tokens, test::view_of(rows, kCols));
  const auto out = store.retrieve_hidden_states(tokens);
  if (stored.cached != 2 || !out || out->rows() != 2 * kChunk ||
      std::memcmp(out->data(), rows.data(), rows.size() * sizeof(float)) != 0) {
    throw Failure{"round trip after the workload is not bit-exact (cached " +
                  std::to_string(stored.cached) + ")"};
  }
  store.check_invariants();
  store.close();
  const HiddenStateStats closed = store.stats();
  if (closed.pool_free_bytes != closed.pool_capacity_bytes) {
    throw Failure{"after close(): pool free " + std::to_string(closed.pool_free_bytes) + " of " +
                  std::to_string(closed.pool_capacity_bytes)};
  }
}

enum ChildStatus : int { kOk = 0, kBroken = 10, kNotReached = 11, kOkSurfaced = 12 };

[[noreturn]] void run_child(uint64_t fail_at, int fd) {
  ::alarm(60);
  int status = kOk;
  std::string why;
  try {
    World w;
    arm(fail_at);
    bool surfaced = false;
    try {
      workload(w);
    } catch (const Failure&) {
      throw;
    } catch (const std::bad_alloc&) {
      surfaced = true;  // outside a step: only the fixture's own calls are outside
    }
    (void)disarm();
    if (!fired()) std::_Exit(kNotReached);
    check_after(w);
    status = surfaced || g_surfaced > 0 ? kOkSurfaced : kOk;
  } catch (const Failure& f) {
    (void)disarm();
    why = f.what;
    status = kBroken;
  } catch (const std::exception& e) {
    (void)disarm();
    why = std::string("unexpected exception: ") + e.what();
    status = kBroken;
  }
  if (!why.empty()) {
    const std::string line = why.substr(0, 3000) + "\n";
    (void)!::write(fd, line.data(), line.size());
  }
  std::_Exit(status);
}

}  // namespace
}  // namespace hss::alloc_failure

int main(int argc, char** argv) {
  using namespace hss::alloc_failure;
  const bool verbose = argc > 1 && std::strcmp(argv[1], "-v") == 0;
  uint64_t points = 0;
  {
    World w;
    arm(0);
    workload(w);
    points = disarm();
    check_after(w);
  }
  std::printf("allocation-failure sweep: the workload makes %llu allocations\n",
              static_cast<unsigned long long>(points));
  uint64_t tried = 0, broken = 0, crashes = 0, not_reached = 0, surfaced = 0;
  for (uint64_t n = 1; n <= points; ++n) {
    const auto child = hss::test::run_in_child([&](int fd) { run_child(n, fd); });
    if (!child) return 2;
    std::string detail = child->output;
    const int status = child->status;
    ++tried;
    const char* verdict = nullptr;
    if (WIFSIGNALED(status)) {
      ++crashes;
      verdict = "CRASH";
      detail += std::string("signal ") + strsignal(WTERMSIG(status)) + "\n";
    } else if (WEXITSTATUS(status) == kBroken) {
      ++broken;
      verdict = "BROKEN";
    } else if (WEXITSTATUS(status) == kNotReached) {
      ++not_reached;
    } else if (WEXITSTATUS(status) == kOkSurfaced) {
      ++surfaced;
    } else if (WEXITSTATUS(status) != kOk && WEXITSTATUS(status) != kOkSurfaced) {
      ++crashes;  // a sanitizer report exits 1
      verdict = "CRASH";
      detail += "exit status " + std::to_string(WEXITSTATUS(status)) + "\n";
    }
    if (verdict != nullptr && (verbose || broken + crashes <= 20)) {
      std::printf("%-6s at allocation %llu: %s", verdict, static_cast<unsigned long long>(n),
                  detail.c_str());
    }
  }
  std::printf(
      "allocation-failure sweep: %llu points tried, %llu broken stores, %llu crashes "
      "(%llu threw std::bad_alloc out of a call, %llu absorbed, %llu not reached)\n",
      static_cast<unsigned long long>(tried), static_cast<unsigned long long>(broken),
      static_cast<unsigned long long>(crashes), static_cast<unsigned long long>(surfaced),
      static_cast<unsigned long long>(tried - broken - crashes - surfaced - not_reached),
      static_cast<unsigned long long>(not_reached));
  return broken == 0 && crashes == 0 ? 0 : 1;
}
