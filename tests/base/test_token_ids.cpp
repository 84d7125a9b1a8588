// hss::TokenIds, the one token-list parameter type: what converts to it, that it views the ids
// at their own width without a copy, and that both widths mean the same keys at every entry point
// that takes it (store, retrieve, retrieve_layers(_into), Engine) and in the token database.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <list>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "hss/hss.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

// What callers hold today converts implicitly, either width, const or not, lvalue or temporary.
static_assert(std::is_convertible_v<std::span<const int32_t>, TokenIds>);
static_assert(std::is_convertible_v<std::span<const int64_t>, TokenIds>);
static_assert(std::is_convertible_v<std::span<int32_t>, TokenIds>);
static_assert(std::is_convertible_v<std::span<const int64_t, 4>, TokenIds>);
static_assert(std::is_convertible_v<std::vector<int32_t>&, TokenIds>);
static_assert(std::is_convertible_v<const std::vector<int64_t>&, TokenIds>);
static_assert(std::is_convertible_v<std::vector<int64_t>&&, TokenIds>);
static_assert(std::is_convertible_v<std::array<int64_t, 3>&, TokenIds>);
static_assert(std::is_convertible_v<int32_t (&)[5], TokenIds>);
// Other element types are not token ids (no silent reinterpretation), nor are ranges that are
// not contiguous.
static_assert(!std::is_convertible_v<std::vector<uint32_t>&, TokenIds>);
static_assert(!std::is_convertible_v<std::vector<int16_t>&, TokenIds>);
static_assert(!std::is_convertible_v<std::vector<uint64_t>&, TokenIds>);
static_assert(!std::is_convertible_v<std::vector<double>&, TokenIds>);
static_assert(!std::is_convertible_v<std::list<int64_t>&, TokenIds>);
static_assert(!std::is_convertible_v<std::span<const Chunk>, TokenIds>);
static_assert(std::is_trivially_copyable_v<TokenIds>);

// The ids the visitor sees: width, address and length.
struct Seen {
  bool int32 = false;
  const void* data = nullptr;
  size_t size = 0;
};

Seen seen(TokenIds ids) {
  return ids.visit([](auto span) {
    return Seen{std::is_same_v<typename decltype(span)::element_type, const int32_t>, span.data(),
                span.size()};
  });
}

TEST(TokenIds, ViewsTheIdsAtTheirOwnWidthWithoutACopy) {
  const std::vector<int32_t> narrow{1, 2, 3};
  const std::vector<int64_t> wide{4, 5, 6, 7};
  const std::array<int64_t, 2> fixed{8, 9};
  const int32_t plain[4] = {1, 2, 3, 4};

  const Seen a = seen(narrow);
  EXPECT_TRUE(a.int32);
  EXPECT_EQ(a.data, narrow.data());
  EXPECT_EQ(a.size, 3u);
  const Seen b = seen(wide);
  EXPECT_FALSE(b.int32);
  EXPECT_EQ(b.data, wide.data());
  EXPECT_EQ(b.size, 4u);
  const Seen c = seen(std::span<const int64_t>(wide).subspan(1, 2));
  EXPECT_EQ(c.data, wide.data() + 1);
  EXPECT_EQ(c.size, 2u);
  EXPECT_EQ(seen(fixed).data, fixed.data());
  EXPECT_TRUE(seen(plain).int32);
  EXPECT_EQ(seen(plain).size, 4u);

  const TokenIds ids(narrow);
  EXPECT_TRUE(ids.is_int32());
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_FALSE(ids.empty());
  const TokenIds none;
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.size(), 0u);
  EXPECT_FALSE(none.is_int32());
  EXPECT_EQ(seen(none).size, 0u);
}

TEST(TokenIds, BothWidthsGiveTheSameKeysEverywhere) {
  Config config;
  config.chunk_size = 16;
  config.max_local_cpu_size = 1.0 / 1024;
  config.enable_hidden_state_cache = true;
  config.max_hidden_state_cpu_size = 1.0 / 1024;
  auto engine = Engine::create(config);
  HiddenStateStore& store = *engine->hidden_state_store();

  constexpr int64_t kCols = 8;
  const std::vector<int32_t> narrow = test::make_tokens(3 * 16, 11);
  const std::vector<int64_t> wide(narrow.begin(), narrow.end());
  const std::vector<float> rows = test::make_rows(narrow, 0, 0, kCols);
  const std::vector<float> rows1 = test::make_rows(narrow, 0, 1, kCols);

  // The token database: identical chunks from either width.
  const std::vector<Chunk> from32 = engine->token_database().process_tokens(narrow);
  const std::vector<Chunk> from64 = engine->token_database().process_tokens(wide);
  ASSERT_EQ(from32.size(), 3u);
  ASSERT_EQ(from64.size(), from32.size());
  for (size_t i = 0; i < from32.size(); ++i) EXPECT_EQ(from32[i].key, from64[i].key);

  // KV stored from int64 ids is found by int32 ids, and the other way round.
  std::vector<uint16_t> kv(narrow.size() * 4, 7);
  ASSERT_EQ(engine->store(wide, {kv.data(), DType::kBFloat16, 48, 4}), 3);
  EXPECT_EQ(engine->lookup(narrow), 48);
  std::vector<uint16_t> kv_out(kv.size(), 0);
  EXPECT_EQ(engine->retrieve(narrow, {kv_out.data(), DType::kBFloat16, 48, 4}), 48);
  EXPECT_EQ(kv_out, kv);

  // Hidden states stored with int32 ids (layer 0) and int64 ids (layer 1): every retrieve form
  // finds both with either width, bit for bit.
  ASSERT_EQ(store.store_hidden_states(narrow, test::view_of(rows, kCols)).cached, 3);
  ASSERT_EQ(store.store_hidden_states(wide, test::view_of(rows1, kCols), {.layer_idx = 1}).cached,
            3);
  for (const TokenIds ids : {TokenIds(narrow), TokenIds(wide)}) {
    const auto layer0 = store.retrieve_hidden_states(ids);
    ASSERT_TRUE(layer0.has_value());
    ASSERT_EQ(layer0->rows(), 48);
    EXPECT_EQ(std::memcmp(layer0->data(), rows.data(), rows.size() * sizeof(float)), 0);

    const std::vector<int64_t> layers{0, 1};
    const std::vector<HostTensor> both = store.retrieve_layers(ids, layers);
    ASSERT_EQ(both.size(), 2u);
    EXPECT_EQ(std::memcmp(both[1].data(), rows1.data(), rows1.size() * sizeof(float)), 0);

    std::vector<float> out(rows.size(), 0.0f);
    EXPECT_EQ(store.retrieve_hidden_states_into(
                  ids, {out.data(), DType::kFloat32, 48, kCols}, {.layer_idx = 1}),
              48);
    EXPECT_EQ(out, rows1);

    std::vector<float> out0(rows.size(), 0.0f), out1(rows.size(), 0.0f);
    const std::array<Slot, 2> slots{Slot{ActivationKind::kHidden, 0},
                                    Slot{ActivationKind::kHidden, 1}};
    const std::array<MutableTensorView, 2> outs{
        MutableTensorView{out0.data(), DType::kFloat32, 48, kCols},
        MutableTensorView{out1.data(), DType::kFloat32, 48, kCols}};
    EXPECT_EQ(store.retrieve_layers_into(ids, slots, outs), 48);
    EXPECT_EQ(out0, rows);
    EXPECT_EQ(out1, rows1);
  }
  // Re-storing with the other width is a touch, not a write: the same keys.
  EXPECT_EQ(store.store_hidden_states(wide, test::view_of(rows, kCols)).written, 0);
  EXPECT_EQ(store.stats().chunks_written, 6u);
}

TEST(TokenIds, OutOfRangeIdsAreInvalidArgumentNamingTheIdAtEitherWidth) {
  Config config;
  config.chunk_size = 16;
  config.enable_hidden_state_cache = true;
  config.max_hidden_state_cpu_size = 1.0 / 1024;
  auto engine = Engine::create(config);
  HiddenStateStore& store = *engine->hidden_state_store();
  std::vector<float> rows(16 * 4, 1.0f);

  std::vector<int32_t> narrow(16, 5);
  narrow[3] = -1;
  std::vector<int64_t> wide(16, 5);
  wide[7] = int64_t{1} << 32;
  const auto expect_named = [](auto&& call, const std::string& name) {
    try {
      call();
      ADD_FAILURE() << "no InvalidArgument for " << name;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  expect_named([&] { (void)store.store_hidden_states(narrow, test::view_of(rows, 4)); },
               "token_ids[3] = -1");
  expect_named([&] { (void)store.store_hidden_states(wide, test::view_of(rows, 4)); },
               "token_ids[7] = 4294967296");
  expect_named([&] { (void)store.retrieve_hidden_states(wide); }, "token_ids[7]");
  expect_named([&] { (void)engine->lookup(narrow); }, "token_ids[3]");
  const HiddenStateStats stats = store.stats();
  EXPECT_EQ(stats.stores, 0u);
  EXPECT_EQ(stats.retrieves, 0u);
  EXPECT_EQ(stats.entries_held, 0u);
}

}  // namespace
}  // namespace hss
