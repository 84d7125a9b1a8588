// libFuzzer target: sequences of store API operations checked against a reference model.
//
// The input bytes pick operations (KV store, hidden-state store by tokens or by chunks, the
// retrieves, coverage, drop_key, evict_one_lru, KV removal, deliberately invalid calls) on a
// small engine whose hidden-state pool and KV backend both evict. The model keeps, per (chunk
// key, kind, layer), the shape and the content version last written, learnt from has_chunk()
// around each store. After every operation:
//   * store_* returned StoreResult{written, cached} equal to what has_chunk shows changed;
//   * a retrieve returns exactly the prefix the model predicts (slot present with a consistent
//     shape, KV present, asked KV-first like LMCache), on chunk boundaries, no longer than the KV
//     prefix, content bit-exact, only chunks stored and not dropped; a KV-orphaned key is dropped;
//   * coverage() == rows of retrieve_layers() for the same chunks and slots;
//   * retrieve_*_into never writes outside the rows it reports (guard rows and guard columns);
//   * hidden-state operations never change the KV backend's keys (HS pressure never evicts KV);
//   * InvalidArgument changes nothing (stats, entries, LRU order);
//   * stats agree with num_entries/num_cached_chunks/lru_keys and the pool's capacity, and
//     check_invariants() holds.
// A violation aborts with a message (libFuzzer saves the input).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz_util.hpp"
#include "hss/hss.hpp"
#include "hss/kernels/convert.hpp"

namespace {

using namespace hss;
using fuzz::Input;
using fuzz::require;
using fuzz::violation;

constexpr int64_t kChunk = 4;
constexpr int64_t kKvCols = 2;
constexpr int64_t kColsChoices[] = {4, 8};
constexpr int64_t kLayers[] = {0, 1, -1};
constexpr ActivationKind kKinds[] = {ActivationKind::kHidden, ActivationKind::kKey};
constexpr int kMaxOps = 48;

// HSS_FUZZ_TRACE=1 prints every operation (to reproduce a saved input by hand).
bool g_trace = false;

template <typename... Args>
void trace(const char* format, Args... args) {
  if (g_trace) std::fprintf(stderr, format, args...);
}

uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Exactly representable in float32, bfloat16 and float16: every path restores it bit for bit.
float value(uint64_t key_hash, ActivationKind kind, int64_t layer, int64_t row, int64_t col,
            uint8_t version) {
  const uint64_t h = mix64(
      key_hash ^ (static_cast<uint64_t>(kind) << 56) ^ (static_cast<uint64_t>(layer + 8) << 48) ^
      (static_cast<uint64_t>(row) << 32) ^ (static_cast<uint64_t>(col) << 8) ^ version);
  return static_cast<float>(static_cast<int64_t>(h % 256) - 128) / 8.0f;
}

// What a slot of a key holds, as far as the model knows.
struct Held {
  int64_t cols = 0;
  int storage = 0;  // 0 float32, 1 bfloat16, 2 float16 (native storage keeps 16-bit inputs)
  uint8_t version = 0;
};
using SlotKey = std::tuple<uint64_t, int, int64_t>;  // chunk hash, kind, layer

struct Fixture {
  explicit Fixture(bool native) {
    config.chunk_size = kChunk;
    config.enable_hidden_state_cache = true;
    config.hidden_state_storage_dtype = native ? StorageDType::kNative : StorageDType::kFloat32;
    // 12 float32 chunks of 4 x 8 and 10 KV chunks of 4 x 2 bfloat16: both sides evict.
    config.max_hidden_state_cpu_size = 12.0 * kChunk * 8 * 4 / (1ULL << 30);
    config.max_local_cpu_size = 10.0 * kChunk * kKvCols * 2 / (1ULL << 30);
    engine = Engine::create(config);
    // Three token streams of 7 chunks (6 used, the 7th for partial tails); stream 1 shares its
    // first 2 chunks with stream 0.
    for (int s = 0; s < 3; ++s) {
      std::vector<int32_t> t;
      for (int64_t i = 0; i < 7 * kChunk; ++i) {
        const bool shared = s == 1 && i < 2 * kChunk;
        t.push_back(static_cast<int32_t>(shared ? 1000 + i : 1000 + 100 * s + i));
      }
      streams.push_back(std::move(t));
    }
  }
  HiddenStateStore& store() { return *engine->hidden_state_store(); }

  Config config;
  std::unique_ptr<Engine> engine;
  std::vector<std::vector<int32_t>> streams;
  std::map<SlotKey, Held> model;
};

std::string stats_text(Fixture& f) {
  const HiddenStateStats s = f.store().stats();
  std::ostringstream out;
  out << s.keys_held << ' ' << s.entries_held << ' ' << s.bytes_held << ' ' << s.blocks_held << ' '
      << s.pool_capacity_bytes << ' ' << s.pool_free_bytes << ' ' << s.granule_bytes << ' '
      << s.closed << ' ' << s.stores << ' ' << s.chunks_written << ' ' << s.retrieves << ' '
      << s.hit_tokens << ' ' << s.miss_tokens << ' ' << s.hs_evictions << ' ' << s.coupled_evictions
      << ' ' << s.allocation_failures;
  for (const KindStats& k : s.per_kind) {
    out << " [" << k.entries_held << ' ' << k.bytes_held << ' ' << k.chunks_written << ']';
  }
  out << " lru";
  for (const CacheEngineKey& key : f.store().lru_keys()) out << ' ' << key.chunk_hash;
  return out.str();
}

std::set<uint64_t> kv_keys(Fixture& f) {
  std::set<uint64_t> out;
  for (const CacheEngineKey& key : f.engine->kv_backend().keys_lru_order()) {
    out.insert(key.chunk_hash);
  }
  return out;
}

void check_consistent(Fixture& f, const char* after) {
  HiddenStateStore& store = f.store();
  try {
    store.check_invariants();
  } catch (const std::exception& e) {
    violation(std::string("check_invariants after ") + after + ": " + e.what());
  }
  const HiddenStateStats s = store.stats();
  require(s.entries_held == store.num_entries(),
          std::string("entries_held != num_entries after ") + after);
  require(s.keys_held == store.num_cached_chunks(),
          std::string("keys_held != num_cached_chunks after ") + after);
  require(s.keys_held == store.lru_keys().size(),
          std::string("keys_held != lru_keys after ") + after);
  require(s.pool_free_bytes + s.blocks_held * s.granule_bytes == s.pool_capacity_bytes,
          std::string("pool free + held != capacity after ") + after);
  uint64_t entries = 0, bytes = 0;
  for (const KindStats& k : s.per_kind) {
    entries += k.entries_held;
    bytes += k.bytes_held;
  }
  require(entries == s.entries_held && bytes == s.bytes_held,
          std::string("per-kind stats do not sum up after ") + after);
}

// A chunk list for stream s, first n chunks (plus `extra` tokens of the next, unkeyed).
std::vector<int32_t> tokens_of(Fixture& f, size_t s, int64_t n, int64_t extra) {
  const auto& stream = f.streams[s];
  return {stream.begin(), stream.begin() + n * kChunk + extra};
}

struct Rows {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  DType dtype = DType::kFloat32;
  TensorView view(int64_t rows, int64_t cols) const {
    const void* data = dtype == DType::kFloat32 ? static_cast<const void*>(f32.data())
                                                : static_cast<const void*>(half.data());
    return {data, dtype, rows, cols, 0, Device::kHost, 0};
  }
};

// The rows a store of `chunks` from token_offset writes (content of `version`).
Rows make_rows(const std::vector<Chunk>& chunks, int64_t n_tokens, int64_t offset, int64_t cols,
               ActivationKind kind, int64_t layer, uint8_t version, DType dtype) {
  Rows r;
  r.dtype = dtype;
  std::vector<float> values(static_cast<size_t>((n_tokens - offset) * cols), 0.0f);
  for (const Chunk& c : chunks) {
    for (int64_t row = c.start; row < c.end; ++row) {
      if (row < offset) continue;
      for (int64_t col = 0; col < cols; ++col) {
        values[static_cast<size_t>((row - offset) * cols + col)] =
            value(c.key.chunk_hash, kind, layer, row - c.start, col, version);
      }
    }
  }
  if (dtype == DType::kFloat32) {
    r.f32 = std::move(values);
  } else {
    for (const float v : values) {
      r.half.push_back(dtype == DType::kBFloat16 ? kernels::float_to_bf16(v)
                                                 : kernels::float_to_f16(v));
    }
  }
  return r;
}

int storage_of(const Fixture& f, DType dtype) {
  if (f.config.hidden_state_storage_dtype == StorageDType::kFloat32 || dtype == DType::kFloat32) {
    return 0;
  }
  return dtype == DType::kBFloat16 ? 1 : 2;
}

void op_store(Fixture& f, Input& in, bool by_chunks) {
  const size_t s = in.pick(3);
  const int64_t n = 1 + static_cast<int64_t>(in.pick(6));
  const int64_t extra = static_cast<int64_t>(in.pick(4)) == 0 ? 1 : 0;
  const auto tokens = tokens_of(f, s, n, by_chunks ? 0 : extra);
  const auto n_tokens = static_cast<int64_t>(tokens.size());
  const int64_t offset =
      in.pick(3) == 0 ? static_cast<int64_t>(in.pick(static_cast<size_t>(n_tokens) + 1)) : 0;
  const ActivationKind kind = kKinds[in.pick(2)];
  const int64_t layer = kLayers[in.pick(3)];
  const int64_t cols = kColsChoices[in.pick(2)];
  const uint8_t version = in.byte();
  const DType dtype = std::array{DType::kFloat32, DType::kBFloat16, DType::kFloat16}[in.pick(3)];
  const std::vector<Chunk> chunks = f.engine->token_database().process_tokens(tokens);
  const Rows rows = make_rows(chunks, n_tokens, offset, cols, kind, layer, version, dtype);
  const int storage = storage_of(f, dtype);

  std::vector<bool> before;
  for (const Chunk& c : chunks) before.push_back(f.store().has_chunk(c.key, layer, kind));
  const auto kv_before = kv_keys(f);
  StoreOptions opt;
  opt.layer_idx = layer;
  opt.token_offset = offset;
  opt.kind = kind;
  StoreResult result;
  if (by_chunks) {
    result = f.store().store_chunks(chunks, rows.view(n_tokens - offset, cols), opt);
  } else {
    result = f.store().store_hidden_states(tokens, rows.view(n_tokens - offset, cols), opt);
  }
  require(kv_keys(f) == kv_before, "a hidden-state store changed the KV backend");
  // Expected: over the chunks in range (start >= offset), the leading run present afterwards is
  // `cached`; of those, the ones absent before or held with another shape were written.
  int64_t cached = 0, written = 0;
  bool run = true;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    const bool after = f.store().has_chunk(c.key, layer, kind);
    if (c.start < offset) {
      // Bug 2 of issue 14: the prefix a store extends is never its eviction victim.
      require(!before[i] || after, "a store evicted a chunk of its own prefix before token_offset");
      continue;
    }
    const SlotKey key{c.key.chunk_hash, static_cast<int>(kind), layer};
    const auto it = f.model.find(key);
    if (before[i]) require(it != f.model.end(), "the store holds a slot nobody stored");
    const bool same_shape = before[i] && it->second.cols == cols && it->second.storage == storage;
    if (run && after) {
      ++cached;
      if (!same_shape) {
        ++written;
        f.model[key] = Held{cols, storage, version};
      }
    } else {
      run = false;
      if (after && !before[i]) violation("a chunk after the stop point was written");
      if (!after && before[i] && same_shape)
        violation("a store lost a cached chunk of its own range");
    }
  }
  trace(
      "%s s=%zu n=%lld tokens=%lld offset=%lld kind=%d layer=%lld cols=%lld v=%d dtype=%d -> "
      "{%lld, %lld}\n",
      by_chunks ? "store_chunks" : "store_hidden_states", s, static_cast<long long>(n),
      static_cast<long long>(n_tokens), static_cast<long long>(offset), static_cast<int>(kind),
      static_cast<long long>(layer), static_cast<long long>(cols), version, static_cast<int>(dtype),
      static_cast<long long>(result.written), static_cast<long long>(result.cached));
  if (result.cached != cached || result.written != written) {
    violation("StoreResult {" + std::to_string(result.written) + ", " +
              std::to_string(result.cached) + "} but has_chunk shows {" + std::to_string(written) +
              ", " + std::to_string(cached) + "}");
  }
}

// The prefix a walk must find, asked like the store: slots held with a consistent shape, then KV
// for every chunk of that prefix and the chunk that ended it. Returns {hits, orphan chunk}.
std::pair<size_t, std::optional<size_t>> expected_walk(Fixture& f, const std::vector<Chunk>& chunks,
                                                       const std::vector<Slot>& slots) {
  size_t present = 0;
  std::vector<std::pair<int64_t, int>> first_shape(slots.size());
  for (; present < chunks.size(); ++present) {
    bool all = true;
    for (size_t s = 0; s < slots.size() && all; ++s) {
      const Slot& slot = slots[s];
      if (!f.store().has_chunk(chunks[present].key, slot.layer_idx, slot.kind)) {
        all = false;
        break;
      }
      const auto it = f.model.find(
          {chunks[present].key.chunk_hash, static_cast<int>(slot.kind), slot.layer_idx});
      require(it != f.model.end(), "has_chunk true for a slot nobody stored (or dropped)");
      const std::pair<int64_t, int> shape{it->second.cols, it->second.storage};
      if (present == 0) first_shape[s] = shape;
      // The walk compares hidden dims only: storage differences restore to the same float32.
      if (shape.first != first_shape[s].first) all = false;
    }
    if (!all) break;
  }
  const size_t asked = std::min(present + 1, chunks.size());
  for (size_t i = 0; i < asked; ++i) {
    if (!f.engine->kv_backend().contains(chunks[i].key)) return {i, i};
  }
  return {present, std::nullopt};
}

void check_rows(Fixture& f, const std::vector<Chunk>& chunks, size_t hits, const Slot& slot,
                int64_t row_begin, const float* data, int64_t cols, int64_t stride) {
  int64_t out_row = 0;
  for (size_t i = 0; i < hits; ++i) {
    const Chunk& c = chunks[i];
    if (c.end <= row_begin) continue;  // not part of the output
    const auto it = f.model.find({c.key.chunk_hash, static_cast<int>(slot.kind), slot.layer_idx});
    require(it != f.model.end(), "a retrieve returned a chunk nobody stored");
    require(it->second.cols == cols, "a retrieve returned a chunk with another hidden dim");
    for (int64_t r = c.start; r < c.end; ++r) {
      if (r < row_begin) continue;
      for (int64_t col = 0; col < cols; ++col) {
        const float want = value(c.key.chunk_hash, slot.kind, slot.layer_idx, r - c.start, col,
                                 it->second.version);
        const float got = data[out_row * stride + col];
        if (std::memcmp(&want, &got, sizeof(float)) != 0) {
          violation("content mismatch at chunk " + std::to_string(i) + " row " + std::to_string(r) +
                    " col " + std::to_string(col));
        }
      }
      ++out_row;
    }
  }
}

void forget_key(Fixture& f, uint64_t hash) {
  for (auto it = f.model.begin(); it != f.model.end();) {
    it = std::get<0>(it->first) == hash ? f.model.erase(it) : std::next(it);
  }
}

void after_walk(Fixture& f, const std::vector<Chunk>& chunks, std::optional<size_t> orphan) {
  if (!orphan) return;
  const CacheEngineKey& key = chunks[*orphan].key;
  for (const ActivationKind kind : kKinds) {
    for (const int64_t layer : kLayers) {
      require(!f.store().has_chunk(key, layer, kind), "a KV-orphaned key kept hidden states");
    }
  }
  forget_key(f, key.chunk_hash);
}

void op_retrieve(Fixture& f, Input& in, bool into) {
  const size_t s = in.pick(3);
  const int64_t n = 1 + static_cast<int64_t>(in.pick(6));
  const auto tokens = tokens_of(f, s, n, static_cast<int64_t>(in.pick(2)));
  const Slot slot{kKinds[in.pick(2)], kLayers[in.pick(3)]};
  const int64_t row_begin = in.pick(4) == 0 ? static_cast<int64_t>(in.pick(tokens.size() + 1)) : 0;
  const std::vector<Chunk> chunks = f.engine->token_database().process_tokens(tokens);
  const auto [hits, orphan] = expected_walk(f, chunks, {slot});
  const int64_t prefix = hits > 0 ? chunks[hits - 1].end : 0;
  require(prefix <= f.engine->lookup(tokens), "hidden-state prefix longer than the KV prefix");
  const auto kv_before = kv_keys(f);
  RetrieveOptions opt;
  opt.layer_idx = slot.layer_idx;
  opt.kind = slot.kind;
  opt.row_begin = row_begin;
  const int64_t want_rows = prefix > row_begin ? prefix - row_begin : 0;
  trace(
      "%s s=%zu n=%lld tokens=%zu kind=%d layer=%lld row_begin=%lld: model hits=%zu prefix=%lld "
      "orphan=%d\n",
      into ? "retrieve_into" : "retrieve", s, static_cast<long long>(n), tokens.size(),
      static_cast<int>(slot.kind), static_cast<long long>(slot.layer_idx),
      static_cast<long long>(row_begin), hits, static_cast<long long>(prefix),
      orphan ? static_cast<int>(*orphan) : -1);
  if (!into) {
    const std::optional<HostTensor> out = f.store().retrieve_hidden_states(tokens, opt);
    require(out.has_value() == (want_rows > 0), "retrieve hit/miss differs from the model");
    if (out) {
      require(out->rows() == want_rows, "retrieve returned " + std::to_string(out->rows()) +
                                            " rows, the model says " + std::to_string(want_rows));
      check_rows(f, chunks, hits, slot, row_begin, out->data(), out->cols(), out->cols());
    }
  } else {
    // Output with a guard row above and below and guard columns right of every row.
    int64_t cols = kColsChoices[in.pick(2)];
    if (hits > 0) {
      const auto it =
          f.model.find({chunks[0].key.chunk_hash, static_cast<int>(slot.kind), slot.layer_idx});
      if (in.pick(4) != 0) cols = it->second.cols;  // mostly the right width
    }
    const int64_t stride = cols + 3;
    const auto cap = static_cast<int64_t>(tokens.size()) + (in.pick(4) == 0 ? -1 : 0);
    constexpr uint32_t kGuard = 0x7fc0dead;
    float guard;
    std::memcpy(&guard, &kGuard, 4);
    std::vector<float> buffer(static_cast<size_t>((std::max<int64_t>(cap, 0) + 2) * stride), guard);
    const MutableTensorView out{buffer.data() + stride,
                                DType::kFloat32,
                                std::max<int64_t>(cap, 0),
                                cols,
                                stride,
                                Device::kHost,
                                0};
    const std::string stats_before = stats_text(f);
    int64_t got = 0;
    try {
      got = f.store().retrieve_hidden_states_into(tokens, out, opt);
    } catch (const InvalidArgument&) {
      require(want_rows > 0 && (cols != f.model
                                            .find({chunks[0].key.chunk_hash,
                                                   static_cast<int>(slot.kind), slot.layer_idx})
                                            ->second.cols ||
                                cap < want_rows),
              "retrieve_hidden_states_into rejected a valid output");
      require(stats_text(f) == stats_before, "InvalidArgument from retrieve_into changed state");
      require(std::all_of(buffer.begin(), buffer.end(),
                          [&](float v) { return std::memcmp(&v, &guard, 4) == 0; }),
              "a rejected retrieve_into wrote to the output");
      return;
    }
    require(got == want_rows, "retrieve_into returned " + std::to_string(got) +
                                  " rows, the model says " + std::to_string(want_rows));
    check_rows(f, chunks, hits, slot, row_begin, buffer.data() + stride, cols, stride);
    for (int64_t r = -1; r < std::max<int64_t>(cap, 0) + 1; ++r) {
      for (int64_t c = 0; c < stride; ++c) {
        if (r >= 0 && r < got && c < cols) continue;
        const float v = buffer[static_cast<size_t>((r + 1) * stride + c)];
        require(std::memcmp(&v, &guard, 4) == 0, "retrieve_into wrote outside its rows (row " +
                                                     std::to_string(r) + ", col " +
                                                     std::to_string(c) + ")");
      }
    }
  }
  require(kv_keys(f) == kv_before, "a retrieve changed the KV backend");
  after_walk(f, chunks, orphan);
}

void op_layers(Fixture& f, Input& in) {
  const size_t s = in.pick(3);
  const int64_t n = 1 + static_cast<int64_t>(in.pick(6));
  const auto tokens = tokens_of(f, s, n, 0);
  std::vector<Slot> slots{{kKinds[in.pick(2)], kLayers[in.pick(3)]}};
  if (in.pick(2) == 0) slots.push_back({kKinds[in.pick(2)], kLayers[in.pick(3)]});
  const std::vector<Chunk> chunks = f.engine->token_database().process_tokens(tokens);
  const auto [hits, orphan] = expected_walk(f, chunks, slots);
  const int64_t prefix = hits > 0 ? chunks[hits - 1].end : 0;
  trace("layers s=%zu n=%lld slots=%zu: model hits=%zu prefix=%lld\n", s, static_cast<long long>(n),
        slots.size(), hits, static_cast<long long>(prefix));
  const std::string stats_before = stats_text(f);
  const int64_t covered = f.store().coverage(chunks, slots);
  require(stats_text(f) == stats_before, "coverage changed state");
  require(covered == prefix,
          "coverage " + std::to_string(covered) + " but the model says " + std::to_string(prefix));
  const std::vector<HostTensor> out = f.store().retrieve_layers(tokens, slots, 0);
  const int64_t rows = out.empty() ? 0 : out[0].rows();
  require(rows == covered, "coverage " + std::to_string(covered) + " != retrieve_layers rows " +
                               std::to_string(rows));
  require(out.empty() || out.size() == slots.size(), "retrieve_layers returned a partial set");
  for (size_t i = 0; i < out.size(); ++i) {
    require(out[i].rows() == rows, "retrieve_layers tensors differ in rows");
    check_rows(f, chunks, hits, slots[i], 0, out[i].data(), out[i].cols(), out[i].cols());
  }
  after_walk(f, chunks, orphan);
}

// Calls with one bad argument: InvalidArgument, nothing changed.
void op_invalid(Fixture& f, Input& in) {
  const auto tokens = tokens_of(f, in.pick(3), 2, 0);
  std::vector<float> rows(tokens.size() * 8, 1.0f);
  TensorView view{
      rows.data(), DType::kFloat32, static_cast<int64_t>(tokens.size()), 8, 0, Device::kHost, 0};
  StoreOptions sopt;
  RetrieveOptions ropt;
  const std::string before = stats_text(f);
  const auto kv_before = kv_keys(f);
  const size_t which = in.pick(8);
  try {
    switch (which) {
      case 0:
        sopt.token_offset = -1;
        (void)f.store().store_hidden_states(tokens, view, sopt);
        break;
      case 1:
        view.rows -= 1;
        (void)f.store().store_hidden_states(tokens, view, sopt);
        break;
      case 2:
        view.dtype = static_cast<DType>(5 + in.pick(100));
        (void)f.store().store_hidden_states(tokens, view, sopt);
        break;
      case 3:
        sopt.kind = static_cast<ActivationKind>(5 + in.pick(200));
        (void)f.store().store_hidden_states(tokens, view, sopt);
        break;
      case 4:
        ropt.row_begin = -1 - static_cast<int64_t>(in.byte());
        (void)f.store().retrieve_hidden_states(tokens, ropt);
        break;
      case 5:
        (void)f.store().retrieve_layers(tokens, std::span<const int64_t>{});
        break;
      case 6:
        (void)f.store().coverage(f.engine->token_database().process_tokens(tokens),
                                 std::span<const Slot>{});
        break;
      default: {
        auto chunks = f.engine->token_database().process_tokens(tokens);
        chunks[1].start += 1;  // not contiguous
        (void)f.store().store_chunks(chunks, view, sopt);
        break;
      }
    }
    violation("invalid call " + std::to_string(which) + " was accepted");
  } catch (const InvalidArgument&) {
  }
  require(stats_text(f) == before,
          "InvalidArgument (case " + std::to_string(which) + ") changed state");
  require(kv_keys(f) == kv_before, "InvalidArgument changed the KV backend");
}

void run(Input& in) {
  Fixture f(in.byte() % 2 == 1);
  for (int op = 0; op < kMaxOps && !in.done(); ++op) {
    const size_t kind = in.pick(11);
    const char* name = "?";
    switch (kind) {
      case 0:
      case 1: {
        name = "Engine::store";
        const auto tokens = tokens_of(f, in.pick(3), 1 + static_cast<int64_t>(in.pick(6)), 0);
        std::vector<uint16_t> kv(tokens.size() * kKvCols, static_cast<uint16_t>(in.byte()));
        (void)f.engine->store(
            tokens, TensorView{kv.data(), DType::kBFloat16, static_cast<int64_t>(tokens.size()),
                               kKvCols, 0, Device::kHost, 0});
        break;
      }
      case 2:
        name = "store_hidden_states";
        op_store(f, in, false);
        break;
      case 3:
        name = "store_chunks";
        op_store(f, in, true);
        break;
      case 4:
        name = "retrieve_hidden_states";
        op_retrieve(f, in, false);
        break;
      case 5:
        name = "retrieve_hidden_states_into";
        op_retrieve(f, in, true);
        break;
      case 6:
        name = "retrieve_layers/coverage";
        op_layers(f, in);
        break;
      case 7: {
        name = "drop_key";
        const auto tokens = tokens_of(f, in.pick(3), 6, 0);
        const auto chunks = f.engine->token_database().process_tokens(tokens);
        const CacheEngineKey& key = chunks[in.pick(chunks.size())].key;
        const auto kv_before = kv_keys(f);
        (void)f.store().drop_key(key);
        require(kv_keys(f) == kv_before, "drop_key changed the KV backend");
        for (const ActivationKind k : kKinds) {
          for (const int64_t l : kLayers)
            require(!f.store().has_chunk(key, l, k), "drop_key kept a slot");
        }
        forget_key(f, key.chunk_hash);
        break;
      }
      case 8: {
        name = "evict_one_lru";
        const auto kv_before = kv_keys(f);
        const auto lru = f.store().lru_keys();
        const bool evicted = f.store().evict_one_lru();
        require(evicted == !lru.empty(),
                "evict_one_lru with nothing pinned must evict iff keys are held");
        require(kv_keys(f) == kv_before, "evict_one_lru changed the KV backend");
        if (evicted) {
          const auto now = f.store().lru_keys();
          require(
              now.size() + 1 == lru.size() && std::equal(now.begin(), now.end(), lru.begin() + 1),
              "evict_one_lru did not evict the least recently used key");
        }
        break;
      }
      case 9: {
        name = "KV remove";
        const auto tokens = tokens_of(f, in.pick(3), 6, 0);
        const auto chunks = f.engine->token_database().process_tokens(tokens);
        (void)f.engine->kv_backend().remove(chunks[in.pick(chunks.size())].key);
        break;
      }
      default:
        name = "invalid call";
        op_invalid(f, in);
        break;
    }
    trace("  op %d: %s\n", op, name);
    check_consistent(f, name);
  }
  f.store().close();
  const HiddenStateStats s = f.store().stats();
  require(s.closed && s.pool_free_bytes == s.pool_capacity_bytes && f.store().num_entries() == 0,
          "close() left entries or granules held");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* flag = std::getenv("HSS_FUZZ_TRACE");
  g_trace = flag != nullptr && *flag == '1';
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  run(in);
  return 0;
}
