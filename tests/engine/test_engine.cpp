// hss::Engine: components, KV round trip, lookup, and the store wiring.
#include <gtest/gtest.h>

#include <cstring>

#include "hss/hss.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

Config engine_config(bool hidden_states) {
  Config c;
  c.chunk_size = 16;
  c.max_local_cpu_size = 16.0 * 16 * 8 * 2 / (1ULL << 30);  // 16 KV chunks of 16 x 8 bf16
  c.enable_hidden_state_cache = hidden_states;
  c.max_hidden_state_cpu_size = hidden_states ? 1.0 / 1024 : 0.0;
  return c;
}

std::vector<uint16_t> kv_rows(const std::vector<int32_t>& tokens, int64_t from) {
  std::vector<uint16_t> out;
  for (size_t r = static_cast<size_t>(from); r < tokens.size(); ++r) {
    for (int c = 0; c < 8; ++c) out.push_back(static_cast<uint16_t>(tokens[r] * 8 + c));
  }
  return out;
}

TEST(Engine, HiddenStateStoreIsNullWhenDisabled) {
  auto engine = Engine::create(engine_config(false));
  EXPECT_EQ(engine->hidden_state_store(), nullptr);
  EXPECT_NE(engine->storage_manager(), nullptr);
}

TEST(Engine, CreateValidatesTheConfig) {
  Config c = engine_config(true);
  c.max_hidden_state_cpu_size = 0;
  EXPECT_THROW((void)Engine::create(c), ConfigError);
}

TEST(Engine, KvRoundTripAndLookup) {
  auto engine = Engine::create(engine_config(false));
  const auto tokens = test::make_tokens(3 * 16 + 4, 1);
  const auto kv = kv_rows(tokens, 0);
  EXPECT_EQ(engine->store(tokens, test::view_of(kv, 8, DType::kBFloat16)), 3);
  EXPECT_EQ(engine->lookup(tokens), 48);
  std::vector<uint16_t> out(kv.size(), 0);
  MutableTensorView view{
      out.data(), DType::kBFloat16, static_cast<int64_t>(tokens.size()), 8, 0, Device::kHost, 0};
  EXPECT_EQ(engine->retrieve(tokens, view), 48);
  EXPECT_EQ(0, std::memcmp(out.data(), kv.data(), 48 * 8 * 2));
  const auto other = test::make_tokens(48, 2);
  EXPECT_EQ(engine->lookup(other), 0);
}

TEST(Engine, IncrementalKvStoreWithOffsetAndLookupOfLongerPrompt) {
  auto engine = Engine::create(engine_config(false));
  const auto tokens = test::make_tokens(64, 3);
  const std::vector<int32_t> first(tokens.begin(), tokens.begin() + 32);
  EXPECT_EQ(engine->store(first, test::view_of(kv_rows(first, 0), 8, DType::kBFloat16)), 2);
  const auto tail = kv_rows(tokens, 32);
  EXPECT_EQ(engine->store(tokens, test::view_of(tail, 8, DType::kBFloat16), 32), 2);
  EXPECT_EQ(engine->lookup(tokens), 64);
  EXPECT_THROW((void)engine->store(tokens, test::view_of(tail, 8, DType::kBFloat16), 16),
               InvalidArgument);
}

TEST(Engine, KvPressureEvictsAndHiddenStatesFollowLazily) {
  auto engine = Engine::create(engine_config(true));
  HiddenStateStore& hs = *engine->hidden_state_store();
  const auto a = test::make_tokens(8 * 16, 4);
  const auto b = test::make_tokens(10 * 16, 5);
  ASSERT_EQ(engine->store(a, test::view_of(kv_rows(a, 0), 8, DType::kBFloat16)), 8);
  const auto rows = test::make_rows(a, 0, 0, 32);
  ASSERT_EQ(hs.store_hidden_states(a, test::view_of(rows, 32)).cached, 8);
  // 18 chunks into a 16-chunk KV pool: a's two oldest chunks go (the prefix head).
  ASSERT_EQ(engine->store(b, test::view_of(kv_rows(b, 0), 8, DType::kBFloat16)), 10);
  EXPECT_LT(engine->lookup(a), 8 * 16);
  EXPECT_EQ(engine->kv_backend().stats().evictions, 2u);
  EXPECT_FALSE(hs.retrieve_hidden_states(a).has_value());
  EXPECT_EQ(hs.stats().coupled_evictions, 1u);
  // HS pressure never evicted KV.
  EXPECT_EQ(engine->lookup(b), 10 * 16);
}

}  // namespace
}  // namespace hss
