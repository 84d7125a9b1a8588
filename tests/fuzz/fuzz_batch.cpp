// libFuzzer target: batch calls against the same items as single calls (differential).
//
// Two engines with the same config: A gets store_batch / retrieve_batch_into, B gets every item
// of the batch as a single call, in item order. Both also get the same KV stores, KV removals
// (coupled drops), drop_key and evict_one_lru calls. Batches share work between items (the key
// pass per token list, index lookups per chunk, touches per key); this target checks that none
// of it changes an answer. After every step:
//   * the results of the batch equal the single calls' (StoreResult per item, rows per item);
//   * every output buffer of A equals B's byte for byte, guard rows and columns included;
//   * the stats (every counter, holdings, pool) and the LRU order of A and B are equal, and so is
//     has_chunk() of every (key, kind, layer) the inputs can name;
//   * check_invariants() holds on both.
// A batch with a bad item (wrong row count, wrong output width) must raise InvalidArgument on A
// and change nothing; B then gets nothing. The hidden-state pool holds every slot the inputs can
// name: under pool pressure a batch may evict differently (documented), which is out of scope.
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz_util.hpp"
#include "hss/hss.hpp"

namespace {

using namespace hss;
using fuzz::Input;
using fuzz::require;
using fuzz::violation;
using fuzz::write_value;

constexpr int64_t kChunk = 4;
constexpr int64_t kKvCols = 2;
constexpr int64_t kLayers[] = {0, 1, -1};
constexpr ActivationKind kKinds[] = {ActivationKind::kHidden, ActivationKind::kKey};
constexpr int64_t kColsOf[] = {4, 8};  // per entry of kKinds; a store may use the other one
constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
constexpr int kMaxSteps = 24;
constexpr size_t kMaxItems = 8;

struct Side {
  explicit Side(const Config& config) : engine(Engine::create(config)) {}
  HiddenStateStore& store() { return *engine->hidden_state_store(); }
  std::unique_ptr<Engine> engine;
};

struct World {
  explicit World(bool native) {
    config.chunk_size = kChunk;
    config.enable_hidden_state_cache = true;
    config.hidden_state_storage_dtype = native ? StorageDType::kNative : StorageDType::kFloat32;
    config.max_hidden_state_cpu_size = 1.0 / 1024;  // 1 MiB: every slot fits, no HS pressure
    config.max_local_cpu_size = 10.0 * kChunk * kKvCols * 2 / (1ULL << 30);  // KV evicts
    a = std::make_unique<Side>(config);
    b = std::make_unique<Side>(config);
    // Three token streams of 7 chunks; stream 1 shares its first 2 chunks with stream 0.
    for (int s = 0; s < 3; ++s) {
      std::vector<int64_t> t;
      for (int64_t i = 0; i < 7 * kChunk; ++i) {
        t.push_back(s == 1 && i < 2 * kChunk ? 1000 + i : 1000 + 100 * s + i);
      }
      streams.push_back(std::move(t));
    }
  }
  Config config;
  std::unique_ptr<Side> a, b;
  std::vector<std::vector<int64_t>> streams;
};

// Exactly representable in float32, bfloat16 and float16: any path keeps it bit for bit.
float value(int64_t token, int64_t col, int64_t layer, ActivationKind kind, uint8_t version) {
  uint64_t h = static_cast<uint64_t>(token) * 0x9e3779b97f4a7c15ULL ^
               static_cast<uint64_t>(col + 16 * (layer + 2) + 256 * static_cast<int>(kind)) ^
               (static_cast<uint64_t>(version) << 40);
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 32;
  return static_cast<float>(static_cast<int64_t>(h % 256) - 128) / 8.0f;
}

/// Token lists of one step: the same (stream, length) shares one vector (one span) unless the
/// input asks for a separate copy, so both the shared and the unshared key pass are exercised.
class TokenLists {
 public:
  explicit TokenLists(const World& w) : w_(w) {}
  std::span<const int64_t> get(Input& in) {
    const size_t s = in.pick(3);
    const int64_t len = (1 + static_cast<int64_t>(in.pick(6))) * kChunk + in.pick(4);
    const bool copy = in.pick(4) == 0;
    const auto key = std::make_tuple(s, len, copy ? next_copy_++ : 0);
    auto it = lists_.find(key);
    if (it == lists_.end()) {
      const auto& stream = w_.streams[s];
      it = lists_.emplace(key, std::vector<int64_t>(stream.begin(), stream.begin() + len)).first;
    }
    return it->second;
  }

 private:
  const World& w_;
  std::map<std::tuple<size_t, int64_t, int>, std::vector<int64_t>> lists_;
  int next_copy_ = 1;
};

std::string state_of(World& w, Side& side) {
  HiddenStateStore& store = side.store();
  try {
    store.check_invariants();
  } catch (const std::exception& e) {
    violation(std::string("check_invariants: ") + e.what());
  }
  const HiddenStateStats s = store.stats();
  std::ostringstream out;
  out << s.keys_held << ' ' << s.entries_held << ' ' << s.bytes_held << ' ' << s.blocks_held << ' '
      << s.pool_free_bytes << ' ' << s.stores << ' ' << s.chunks_written << ' ' << s.retrieves
      << ' ' << s.hit_tokens << ' ' << s.miss_tokens << ' ' << s.hs_evictions << ' '
      << s.coupled_evictions << ' ' << s.allocation_failures;
  for (const KindStats& k : s.per_kind) {
    out << " [" << k.entries_held << ' ' << k.bytes_held << ' ' << k.chunks_written << ']';
  }
  out << " lru";
  for (const CacheEngineKey& key : store.lru_keys()) out << ' ' << key.chunk_hash;
  out << " slots ";
  for (const auto& stream : w.streams) {
    for (const Chunk& chunk : side.engine->token_database().process_tokens(
             std::span<const int64_t>(stream.data(), 6 * kChunk))) {
      for (const ActivationKind kind : kKinds) {
        for (const int64_t layer : kLayers)
          out << (store.has_chunk(chunk.key, layer, kind) ? 1 : 0);
      }
    }
  }
  out << " kv";
  for (const CacheEngineKey& key : side.engine->kv_backend().keys_lru_order()) {
    out << ' ' << key.chunk_hash;
  }
  return out.str();
}

void store_step(World& w, Input& in) {
  TokenLists lists(w);
  const size_t n = 1 + in.pick(kMaxItems);
  std::vector<std::vector<std::byte>> rows(n);
  std::vector<StoreItem> items(n);
  for (size_t i = 0; i < n; ++i) {
    const std::span<const int64_t> tokens = lists.get(in);
    StoreOptions o;
    o.layer_idx = kLayers[in.pick(3)];
    const size_t kind = in.pick(2);
    o.kind = kKinds[kind];
    o.token_offset = in.pick(3) == 0 ? static_cast<int64_t>(in.pick(tokens.size())) : 0;
    const int64_t cols = kColsOf[(kind + (in.pick(8) == 0 ? 1 : 0)) % 2];
    const DType dtype = kDTypes[in.pick(3)];
    const int64_t stride = cols + static_cast<int64_t>(in.pick(3));
    int64_t count = static_cast<int64_t>(tokens.size()) - o.token_offset;
    const size_t esize = element_size(dtype);
    rows[i].assign(static_cast<size_t>(std::max<int64_t>(count, 1) * stride) * esize,
                   std::byte{0x5a});
    const uint8_t version = in.byte();
    for (int64_t r = 0; r < count; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        write_value(rows[i].data() + static_cast<size_t>(r * stride + c) * esize, dtype,
                    value(tokens[static_cast<size_t>(o.token_offset + r)], c, o.layer_idx, o.kind,
                          version));
      }
    }
    if (in.pick(24) == 0) ++count;  // a bad item: one row more than the tokens call for
    items[i] = {tokens, {rows[i].data(), dtype, count, cols, stride, Device::kHost, 0}, o};
  }
  const std::string before = state_of(w, *w.a);
  std::vector<StoreResult> batch;
  try {
    batch = w.a->store().store_batch(items);
  } catch (const InvalidArgument&) {
    require(state_of(w, *w.a) == before, "a rejected store batch changed the store");
    return;
  }
  require(batch.size() == n, "store_batch returned the wrong number of results");
  for (size_t i = 0; i < n; ++i) {
    StoreResult single;
    try {
      single = w.b->store().store_hidden_states(items[i].token_ids, items[i].hidden_states,
                                                items[i].options);
    } catch (const InvalidArgument& e) {
      violation("store item " + std::to_string(i) +
                " accepted in a batch, rejected alone: " + e.what());
    }
    require(single == batch[i],
            "store item " + std::to_string(i) + ": batch {" + std::to_string(batch[i].written) +
                ", " + std::to_string(batch[i].cached) + "} != single {" +
                std::to_string(single.written) + ", " + std::to_string(single.cached) + "}");
  }
}

void retrieve_step(World& w, Input& in) {
  TokenLists lists(w);
  const size_t n = 1 + in.pick(kMaxItems);
  std::vector<std::vector<std::byte>> outs_a(n), outs_b(n);
  std::vector<RetrieveItem> items(n);
  for (size_t i = 0; i < n; ++i) {
    const std::span<const int64_t> tokens = lists.get(in);
    RetrieveOptions o;
    o.layer_idx = kLayers[in.pick(3)];
    const size_t kind = in.pick(2);
    o.kind = kKinds[kind];
    o.row_begin = in.pick(3) == 0 ? static_cast<int64_t>(in.pick(tokens.size() + 2)) : 0;
    int64_t cols = kColsOf[kind];
    if (in.pick(24) == 0) cols += 1;  // a bad item when anything is cached for it
    const DType dtype = kDTypes[in.pick(3)];
    const int64_t stride = cols + static_cast<int64_t>(in.pick(3));
    const auto rows = static_cast<int64_t>(tokens.size()) + 1;  // a guard row below
    outs_a[i].assign(static_cast<size_t>(rows * stride) * element_size(dtype), std::byte{0x77});
    outs_b[i] = outs_a[i];
    items[i] = {tokens, {outs_a[i].data(), dtype, rows, cols, stride, Device::kHost, 0}, o};
  }
  const std::string before = state_of(w, *w.a);
  std::vector<int64_t> batch;
  try {
    batch = w.a->store().retrieve_batch_into(items);
  } catch (const InvalidArgument&) {
    require(state_of(w, *w.a) == before, "a rejected retrieve batch changed the store");
    for (size_t i = 0; i < n; ++i) {
      require(outs_a[i] == outs_b[i], "a rejected retrieve batch wrote item " + std::to_string(i));
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    MutableTensorView out = items[i].out;
    out.data = outs_b[i].data();
    int64_t single = 0;
    try {
      single = w.b->store().retrieve_hidden_states_into(items[i].token_ids, out, items[i].options);
    } catch (const InvalidArgument& e) {
      violation("retrieve item " + std::to_string(i) +
                " accepted in a batch, rejected alone: " + e.what());
    }
    require(single == batch[i], "retrieve item " + std::to_string(i) + ": batch " +
                                    std::to_string(batch[i]) + " rows != single " +
                                    std::to_string(single));
    require(outs_a[i] == outs_b[i], "retrieve item " + std::to_string(i) + ": output differs");
  }
}

void run(Input& in) {
  World w(in.byte() % 2 == 1);
  for (int step = 0; step < kMaxSteps && !in.done(); ++step) {
    const size_t op = in.pick(9);
    const char* name = "?";
    switch (op) {
      case 0:
      case 1: {
        name = "Engine::store";
        const auto& stream = w.streams[in.pick(3)];
        const auto len = static_cast<int64_t>(1 + in.pick(6)) * kChunk;
        std::vector<uint16_t> kv(static_cast<size_t>(len * kKvCols), in.byte());
        const TensorView view{kv.data(), DType::kBFloat16, len, kKvCols, 0, Device::kHost, 0};
        const std::span<const int64_t> tokens(stream.data(), static_cast<size_t>(len));
        (void)w.a->engine->store(tokens, view);
        (void)w.b->engine->store(tokens, view);
        break;
      }
      case 2:
      case 3:
        name = "store batch";
        store_step(w, in);
        break;
      case 4:
      case 5:
        name = "retrieve batch";
        retrieve_step(w, in);
        break;
      case 6: {
        name = "KV remove";
        const auto& stream = w.streams[in.pick(3)];
        const auto chunks = w.a->engine->token_database().process_tokens(
            std::span<const int64_t>(stream.data(), 6 * kChunk));
        const CacheEngineKey& key = chunks[in.pick(chunks.size())].key;
        (void)w.a->engine->kv_backend().remove(key);
        (void)w.b->engine->kv_backend().remove(key);
        break;
      }
      case 7: {
        name = "drop_key";
        const auto& stream = w.streams[in.pick(3)];
        const auto chunks = w.a->engine->token_database().process_tokens(
            std::span<const int64_t>(stream.data(), 6 * kChunk));
        const CacheEngineKey& key = chunks[in.pick(chunks.size())].key;
        require(w.a->store().drop_key(key) == w.b->store().drop_key(key), "drop_key differs");
        break;
      }
      default:
        name = "evict_one_lru";
        require(w.a->store().evict_one_lru() == w.b->store().evict_one_lru(),
                "evict_one_lru differs");
        break;
    }
    const std::string state_a = state_of(w, *w.a), state_b = state_of(w, *w.b);
    require(state_a == state_b, std::string("after ") + name + " (step " + std::to_string(step) +
                                    "): batch side\n  " + state_a + "\nsingle side\n  " + state_b);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  run(in);
  return 0;
}
