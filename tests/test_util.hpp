#pragma once
// Shared helpers for the CPU tests: deterministic tokens and hidden-state rows whose every value
// is a function of (token prefix, layer, column), so any reader can check any row it gets.

#include <gtest/gtest.h>
#include <cstdint>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "hss/config.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/kernels/convert.hpp"
#include "hss/tensor.hpp"

namespace hss::test {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

/// KV presence the test controls: every chunk is present until evict()ed. Counts contains() calls
/// (the walk's order of questions is part of the LMCache semantics under test).
class ControlledKv final : public StorageManager {
 public:
  bool contains(const CacheEngineKey& key) const override {
    calls.fetch_add(1, std::memory_order_relaxed);
    return !evicted.count(key.chunk_hash);
  }
  void evict(const CacheEngineKey& key) { evicted.insert(key.chunk_hash); }

  std::set<uint64_t> evicted;  ///< chunk hashes whose KV is gone
  mutable std::atomic<int> calls{0};
};

/// n token ids in [0, 50000), deterministic in seed.
inline std::vector<int32_t> make_tokens(int64_t n, uint64_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    tokens[static_cast<size_t>(i)] =
        static_cast<int32_t>(mix64(seed * 1000003 + static_cast<uint64_t>(i)) % 50000);
  }
  return tokens;
}

/// Rolling hash of tokens[0..r] for every r.
inline std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens) {
  std::vector<uint64_t> h(tokens.size());
  uint64_t acc = 0x9e3779b97f4a7c15ULL;
  for (size_t i = 0; i < tokens.size(); ++i) {
    acc = mix64(acc ^ static_cast<uint64_t>(tokens[i]));
    h[i] = acc;
  }
  return h;
}

/// The float32 value of (prefix hash, layer, col): exactly representable in bfloat16 and float16
/// (an integer in [-128, 128) divided by 8), so every dtype round-trips bit for bit.
inline float value_at(uint64_t prefix_hash, int64_t layer, int64_t col) {
  const uint64_t h = mix64(prefix_hash ^ (static_cast<uint64_t>(layer) * 0x100000001b3ULL) ^
                           (static_cast<uint64_t>(col) << 20));
  return static_cast<float>(static_cast<int64_t>(h % 256) - 128) / 8.0f;
}

/// float32 rows [row_begin, rows) of (tokens, layer) as a contiguous buffer.
inline std::vector<float> make_rows(std::span<const int32_t> tokens, int64_t row_begin,
                                    int64_t layer, int64_t cols) {
  const auto h = prefix_hashes(tokens);
  std::vector<float> out;
  out.reserve(static_cast<size_t>((static_cast<int64_t>(tokens.size()) - row_begin) * cols));
  for (int64_t r = row_begin; r < static_cast<int64_t>(tokens.size()); ++r) {
    for (int64_t c = 0; c < cols; ++c) out.push_back(value_at(h[static_cast<size_t>(r)], layer, c));
  }
  return out;
}

inline std::vector<uint16_t> to_bf16(std::span<const float> values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = kernels::float_to_bf16(values[i]);
  return out;
}

/// IEEE half from a float that is exactly representable (test values are).
inline uint16_t exact_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  if ((bits & 0x7FFFFFFFu) == 0) return static_cast<uint16_t>(sign);
  const int exp = static_cast<int>((bits >> 23) & 0xFF) - 127 + 15;
  const uint32_t mant = (bits >> 13) & 0x3FFu;
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | mant);
}

inline std::vector<uint16_t> to_f16(std::span<const float> values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = exact_f16(values[i]);
  return out;
}

/// The decimal exponent of row `row`'s magnitude in scaled_rows: row mod (2e + 1) - e, so
/// consecutive rows step through 10^-e .. 10^e (e = max_exponent) and start again.
inline int row_exponent(int64_t row, int max_exponent) {
  return static_cast<int>(row % (2 * max_exponent + 1)) - max_exponent;
}

/// rows x cols of normal(0, 1) values (std::mt19937 seeded with `seed`) times a per-row
/// magnitude 10^row_exponent(r, max_exponent): every row has its own scale (the FP8 tests' input:
/// a per-row scale that one shared scale could not serve).
inline std::vector<float> scaled_rows(int64_t rows, int64_t cols, uint32_t seed,
                                      int max_exponent) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::pow(10.0f, static_cast<float>(row_exponent(r, max_exponent)));
    for (int64_t c = 0; c < cols; ++c)
      out[static_cast<size_t>(r * cols + c)] = normal(rng) * magnitude;
  }
  return out;
}

/// Writes `f` at `dst` as `dtype`: float32 bits, or float16/bfloat16 rounded to nearest-even.
inline void write_as(DType dtype, float f, void* dst) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, &f, 4);
    return;
  }
  const uint16_t h =
      dtype == DType::kBFloat16 ? kernels::float_to_bf16(f) : kernels::float_to_f16(f);
  std::memcpy(dst, &h, 2);
}

inline TensorView view_of(const std::vector<float>& v, int64_t cols) {
  return {v.data(), DType::kFloat32, static_cast<int64_t>(v.size()) / cols, cols, 0, Device::kHost,
          0};
}
inline TensorView view_of(const std::vector<uint16_t>& v, int64_t cols, DType dtype) {
  return {v.data(), dtype, static_cast<int64_t>(v.size()) / cols, cols, 0, Device::kHost, 0};
}

/// A store config whose pool holds exactly `chunks` float32 chunks of chunk_size x cols.
inline Config store_config(int64_t chunk_size, int64_t cols, int64_t chunks) {
  Config c;
  c.chunk_size = chunk_size;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size =
      static_cast<double>(chunk_size * cols * 4 * chunks) / static_cast<double>(1ULL << 30);
  return c;
}

/// Stores two prefixes into a two-chunk pool (the second evicts the first) and retrieves one:
/// every pipeline stage runs at least once (the trace tests count the ranges).
inline void run_every_stage_once() {
  Config c = store_config(16, 32, 2);
  ChunkedTokenDatabase db(16, false);
  HiddenStateStore store(c, db);
  const auto a = make_tokens(32, 1), b = make_tokens(32, 2);
  const auto ra = make_rows(a, 0, 0, 32), rb = make_rows(b, 0, 0, 32);
  ASSERT_EQ(store.store_hidden_states(a, view_of(ra, 32)).written, 2);
  ASSERT_EQ(store.store_hidden_states(b, view_of(rb, 32)).written, 2);  // evicts a
  ASSERT_TRUE(store.retrieve_hidden_states(b).has_value());
}

}  // namespace hss::test
