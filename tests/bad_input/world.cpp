#include "world.hpp"

#include <cstring>
#include <sstream>

#include "../test_util.hpp"

namespace hss::bad_input {

World::World() {
  config.chunk_size = kChunk;
  config.enable_hidden_state_cache = true;
  // 16 chunks of 16 x 32 float32 hidden states; 16 KV chunks of 16 x 8 bfloat16.
  config.max_hidden_state_cpu_size = 16.0 * kChunk * kCols * 4 / (1ULL << 30);
  config.max_local_cpu_size = 16.0 * kChunk * kKvCols * 2 / (1ULL << 30);
  engine = Engine::create(config);
  tokens = test::make_tokens(4 * kChunk, 42);
  rows = test::make_rows(tokens, 0, 0, kCols);
  kv.resize(tokens.size() * kKvCols);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<uint16_t>(i * 7);
  if (engine->store(tokens, kv_view()) != 4) throw Error("fixture: KV store failed");
  if (store().store_hidden_states(tokens, rows_view()).cached != 4) {
    throw Error("fixture: hidden-state store failed");
  }
}

TensorView World::rows_view() const { return test::view_of(rows, kCols); }
TensorView World::kv_view() const { return test::view_of(kv, kKvCols, DType::kBFloat16); }

std::string snapshot(World& world) {
  std::ostringstream out;
  const HiddenStateStats s = world.store().stats();
  out << "keys_held=" << s.keys_held << " entries_held=" << s.entries_held
      << " bytes_held=" << s.bytes_held << " blocks_held=" << s.blocks_held
      << " pool_capacity_bytes=" << s.pool_capacity_bytes
      << " pool_free_bytes=" << s.pool_free_bytes << " granule_bytes=" << s.granule_bytes
      << " closed=" << s.closed << " stores=" << s.stores << " chunks_written=" << s.chunks_written
      << " retrieves=" << s.retrieves << " hit_tokens=" << s.hit_tokens
      << " miss_tokens=" << s.miss_tokens << " hs_evictions=" << s.hs_evictions
      << " coupled_evictions=" << s.coupled_evictions
      << " allocation_failures=" << s.allocation_failures;
  for (size_t k = 0; k < s.per_kind.size(); ++k) {
    out << " kind" << k << "=" << s.per_kind[k].entries_held << "/" << s.per_kind[k].bytes_held
        << "/" << s.per_kind[k].chunks_written;
  }
  out << "\nnum_cached_chunks=" << world.store().num_cached_chunks()
      << " num_entries=" << world.store().num_entries() << "\nlru:";
  for (const CacheEngineKey& key : world.store().lru_keys()) out << " " << key.to_string();
  const KvStats kv = world.engine->kv_backend().stats();
  out << "\nkv: chunks_held=" << kv.chunks_held << " bytes_held=" << kv.bytes_held
      << " puts=" << kv.puts << " hits=" << kv.hits << " misses=" << kv.misses
      << " evictions=" << kv.evictions << " put_failures=" << kv.put_failures << "\nkv lru:";
  for (const CacheEngineKey& key : world.engine->kv_backend().keys_lru_order()) {
    out << " " << key.to_string();
  }
  return out.str();
}

std::string round_trip(World& world) {
  const auto tokens = test::make_tokens(2 * kChunk, 4242);
  const auto rows = test::make_rows(tokens, 0, 0, kCols);
  std::vector<uint16_t> kv(tokens.size() * kKvCols);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<uint16_t>(i * 13 + 1);
  if (world.engine->store(tokens, test::view_of(kv, kKvCols, DType::kBFloat16)) != 2) {
    return "round trip: KV store did not hold 2 chunks";
  }
  const StoreResult stored = world.store().store_hidden_states(tokens, test::view_of(rows, kCols));
  if (stored.cached != 2)
    return "round trip: hidden-state store cached " + std::to_string(stored.cached);
  const auto out = world.store().retrieve_hidden_states(tokens);
  if (!out || out->rows() != 2 * kChunk || out->cols() != kCols ||
      std::memcmp(out->data(), rows.data(), rows.size() * sizeof(float)) != 0) {
    return "round trip: hidden states not read back bit-exact";
  }
  std::vector<uint16_t> kv_out(kv.size(), 0);
  const MutableTensorView kv_view{
      kv_out.data(), DType::kBFloat16, 2 * kChunk, kKvCols, 0, Device::kHost, 0};
  if (world.engine->retrieve(tokens, kv_view) != 2 * kChunk || kv_out != kv) {
    return "round trip: KV not read back bit-exact";
  }
  return {};
}

}  // namespace hss::bad_input
