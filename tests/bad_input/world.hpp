#pragma once
// The fixture of the bad-input matrix: an Engine with KV and hidden states already cached, a
// text snapshot of everything a bad call must leave unchanged, and a round trip that proves the
// engine still works afterwards.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hss/hss.hpp"

namespace hss::bad_input {

inline constexpr int64_t kChunk = 16;
inline constexpr int64_t kCols = 32;   ///< hidden dim stored
inline constexpr int64_t kKvCols = 8;  ///< KV row width (bfloat16)

struct World {
  World();
  Config config;
  std::unique_ptr<Engine> engine;
  std::vector<int32_t> tokens;  ///< 64 tokens: 4 chunks with KV and layer-0 hidden states
  std::vector<float> rows;      ///< their float32 rows
  std::vector<uint16_t> kv;     ///< their KV rows

  [[nodiscard]] HiddenStateStore& store() { return *engine->hidden_state_store(); }
  [[nodiscard]] TensorView rows_view() const;
  [[nodiscard]] TensorView kv_view() const;
};

/// Everything observable that a rejected call must not change: store and KV statistics, entry and
/// key counts, the LRU orders.
[[nodiscard]] std::string snapshot(World& world);

/// Stores a fresh prefix (KV and hidden states) and reads both back bit-exact. Empty on success,
/// else what failed.
[[nodiscard]] std::string round_trip(World& world);

}  // namespace hss::bad_input
