// HiddenStateStore::coverage_by_tier: the prefix coverage(..., kAllTiers) counts and which
// tier holds each of its chunks ("host", "disk", "remote"), with the same rules (KV's end, the
// first (chunk, slot) no tier holds).

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "hss/hss.hpp"
#include "test_util.hpp"
#include "tier_test_dir.hpp"

#if HSS_HAVE_REMOTE
#include "redis_test_server.hpp"
#endif

namespace hss {
namespace {

using test::make_rows;
using test::make_tokens;
using test::view_of;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;
const std::vector<Slot> kLayer0 = {{ActivationKind::kHidden, 0}};

using test::TempDir;

void store_prefix(HiddenStateStore& store, const std::vector<int32_t>& tokens) {
  const auto rows = make_rows(tokens, 0, 0, kCols);
  ASSERT_EQ(store.store_hidden_states(tokens, view_of(rows, kCols)).cached,
            static_cast<int64_t>(tokens.size()) / kChunk);
}

using Tiers = std::vector<std::string>;

TEST(TierCoverage, EachChunkIsNamedByTheTierItIsReadFrom) {
  const TempDir dir;
  ChunkedTokenDatabase db(kChunk, false);
  Config config = test::store_config(kChunk, kCols, 4);  // four chunks in the pool
  config.local_disk = dir.root;
  HiddenStateStore store(config, db);
  test::ControlledKv kv;
  store.bind_storage_manager(&kv);
  const auto p = make_tokens(4 * kChunk, 1);
  const auto q = make_tokens(2 * kChunk, 2);
  const auto p_chunks = db.process_tokens(std::span<const int32_t>(p));
  const auto q_chunks = db.process_tokens(std::span<const int32_t>(q));

  TierCoverage c = store.coverage_by_tier(p_chunks, kLayer0);
  EXPECT_EQ(c.tokens, 0);
  EXPECT_TRUE(c.chunk_tiers.empty());

  store_prefix(store, p);
  store.flush();  // on disk too
  c = store.coverage_by_tier(p_chunks, kLayer0);
  EXPECT_EQ(c.tokens, 4 * kChunk);
  EXPECT_EQ(c.chunk_tiers, Tiers(4, "host"));

  store_prefix(store, q);  // evicts p's first two chunks (the least recently stored)
  store.flush();
  EXPECT_EQ(store.coverage(p_chunks, kLayer0), 0);
  c = store.coverage_by_tier(p_chunks, kLayer0);
  EXPECT_EQ(c.tokens, 4 * kChunk);
  EXPECT_EQ(c.tokens, store.coverage(p_chunks, kLayer0, CoverageScope::kAllTiers));
  EXPECT_EQ(c.chunk_tiers, (Tiers{"disk", "disk", "host", "host"}));
  EXPECT_EQ(store.coverage_by_tier(q_chunks, kLayer0).chunk_tiers, Tiers(2, "host"));

  // A second slot only the pool lacks: the chunk is read from disk for it.
  const Slot layer5{ActivationKind::kHidden, 5};
  const std::vector<Slot> both = {kLayer0[0], layer5};
  c = store.coverage_by_tier(q_chunks, both);
  EXPECT_EQ(c.tokens, 0);  // nobody holds layer 5
  EXPECT_TRUE(c.chunk_tiers.empty());

  // KV's end ends the prefix, as it ends a retrieve's.
  kv.evict(p_chunks[3].key);
  c = store.coverage_by_tier(p_chunks, kLayer0);
  EXPECT_EQ(c.tokens, 3 * kChunk);
  EXPECT_EQ(c.chunk_tiers, (Tiers{"disk", "disk", "host"}));

  // What it promised is what a retrieve then reads.
  const auto got = store.retrieve_hidden_states(std::span<const int32_t>(p).first(3 * kChunk));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->rows(), 3 * kChunk);
  EXPECT_EQ(store.coverage_by_tier(p_chunks, kLayer0).chunk_tiers, Tiers(3, "host"));
  store.check_invariants();
}

TEST(TierCoverage, WithoutTiersItIsTheLocalCoverage) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(test::store_config(kChunk, kCols, 8), db);
  const auto p = make_tokens(3 * kChunk, 3);
  const auto chunks = db.process_tokens(std::span<const int32_t>(p));
  store_prefix(store, p);
  const TierCoverage c = store.coverage_by_tier(chunks, kLayer0);
  EXPECT_EQ(c.tokens, 3 * kChunk);
  EXPECT_EQ(c.chunk_tiers, Tiers(3, "host"));
  EXPECT_THROW((void)store.coverage_by_tier(chunks, {}), InvalidArgument);
}

#if HSS_HAVE_REMOTE
TEST(TierCoverage, TheDiskIsNamedBeforeTheRemoteTier) {
  HSS_REQUIRE_REDIS();
  test::RedisTestServer server;
  const TempDir writer_dir, reader_dir;
  ChunkedTokenDatabase db(kChunk, false);
  const auto p = make_tokens(3 * kChunk, 4);
  const auto chunks = db.process_tokens(std::span<const int32_t>(p));
  Config config = test::store_config(kChunk, kCols, 8);
  config.hidden_state_remote_url = {server.url()};
  config.hidden_state_remote_timeout_ms = 500;
  {
    Config writer = config;
    writer.local_disk = writer_dir.root;
    HiddenStateStore a(writer, db);
    store_prefix(a, p);
  }                                     // on the server (and in the writer's directory)
  config.local_disk = reader_dir.root;  // an empty directory: the chunks are on the server only
  HiddenStateStore b(config, db);
  test::ControlledKv kv;
  b.bind_storage_manager(&kv);
  const TierCoverage c = b.coverage_by_tier(chunks, kLayer0);
  EXPECT_EQ(c.tokens, 3 * kChunk);
  EXPECT_EQ(c.chunk_tiers, Tiers(3, "remote"));
}
#endif

}  // namespace
}  // namespace hss
