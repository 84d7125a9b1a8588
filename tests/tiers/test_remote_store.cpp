// HiddenStateStore with the remote tier: write-behind, read-through, coverage, faults, and two
// processes sharing one real redis-server (started by the test on 127.0.0.1).

#include <gtest/gtest.h>

#include "hss/error.hpp"
#include "hss/hss.hpp"
#include "test_util.hpp"

#if HSS_HAVE_REMOTE

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "redis_test_server.hpp"
#include "format/value_codec.hpp"

namespace hss {
namespace {

using test::make_rows;
using test::make_tokens;
using test::RedisTestServer;
using test::view_of;
using test::wait_until;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;
constexpr int64_t kChunks = 8;  // per prompt
const std::vector<int64_t> kLayers = {-1, 0, 5};

using FakeKv = test::ControlledKv;

Config remote_config(const std::vector<std::string>& urls, int64_t pool_chunks = 256) {
  Config c = test::store_config(kChunk, kCols, pool_chunks);
  c.hidden_state_remote_url = urls;
  c.hidden_state_remote_timeout_ms = 500;
  return c;
}

void store_layers(HiddenStateStore& store, const std::vector<int32_t>& tokens,
                  DType dtype = DType::kFloat32) {
  for (const int64_t layer : kLayers) {
    const auto rows = make_rows(tokens, 0, layer, kCols);
    if (dtype == DType::kFloat32) {
      ASSERT_EQ(store.store_hidden_states(tokens, view_of(rows, kCols), {layer, 0}).cached,
                static_cast<int64_t>(tokens.size()) / kChunk);
    } else {
      const auto bf16 = test::to_bf16(rows);
      ASSERT_EQ(store.store_hidden_states(tokens, view_of(bf16, kCols, dtype), {layer, 0}).cached,
                static_cast<int64_t>(tokens.size()) / kChunk);
    }
  }
}

// Every restored layer must be exactly the stored rows [0, rows).
void expect_layers(const std::vector<HostTensor>& got, const std::vector<int32_t>& tokens,
                   int64_t rows) {
  if (rows == 0) {
    EXPECT_TRUE(got.empty());
    return;
  }
  ASSERT_EQ(got.size(), kLayers.size());
  for (size_t l = 0; l < kLayers.size(); ++l) {
    ASSERT_EQ(got[l].rows(), rows) << "layer " << kLayers[l];
    const auto expected = make_rows(tokens, 0, kLayers[l], kCols);
    ASSERT_EQ(std::memcmp(got[l].data(), expected.data(), got[l].bytes()), 0)
        << "layer " << kLayers[l] << " differs";
  }
}

std::string key_of(const Chunk& chunk, int64_t layer) {
  return detail::remote_key(chunk.key, "hidden", layer);
}

TEST(RemoteStore, TwoProcessesShareAMultiLayerPrefixBitIdentically) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  const auto tokens = make_tokens(kChunk * kChunks, 7);
  const uint64_t entries = kChunks * kLayers.size();

  // Process A: stores every layer (native bfloat16 storage), flushes the write-behind, exits.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int status = 1;
    try {
      Config c = remote_config({server.url()});
      c.hidden_state_storage_dtype = StorageDType::kNative;
      ChunkedTokenDatabase db(kChunk, false);
      HiddenStateStore a(c, db);
      for (const int64_t layer : kLayers) {
        const auto bf16 = test::to_bf16(make_rows(tokens, 0, layer, kCols));
        (void)a.store_hidden_states(tokens, view_of(bf16, kCols, DType::kBFloat16), {layer, 0});
      }
      a.flush();
      status = a.stats().remote.writes_sent == entries ? 0 : 2;
    } catch (...) {
      status = 3;
    }
    ::_exit(status);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "process A failed";

  // Process B (this one): a fresh store, empty pool, KV present.
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore b(remote_config({server.url()}), db);
  FakeKv kv;
  b.bind_storage_manager(&kv);
  const auto chunks = db.process_tokens(tokens);
  EXPECT_EQ(b.coverage(chunks, kLayers), 0);
  EXPECT_EQ(b.coverage(chunks, kLayers, CoverageScope::kAllTiers), kChunk * kChunks);
  expect_layers(b.retrieve_layers(tokens, kLayers), tokens, kChunk * kChunks);
  const HiddenStateStats s = b.stats();
  EXPECT_EQ(s.remote.hits, entries);
  EXPECT_EQ(s.remote.read_through_chunks, entries);
  EXPECT_EQ(s.remote.corrupt_values, 0U);
  EXPECT_EQ(s.remote.writes_enqueued, 0U);  // read-through never writes back
  EXPECT_EQ(s.entries_held, entries);
  // The same tier in the one shape every tier reports.
  ASSERT_EQ(s.tiers.size(), 1U);
  EXPECT_EQ(s.tiers[0].name, "remote");
  EXPECT_EQ(s.tiers[0].read_mode, "");  // no files: no O_DIRECT choice
  EXPECT_EQ(s.tiers[0].hits, entries);
  EXPECT_EQ(s.tiers[0].promotions, entries);
  EXPECT_EQ(s.tiers[0].writes_enqueued, 0U);
  EXPECT_EQ(b.coverage(chunks, kLayers), kChunk * kChunks);
  // Now local: a second retrieve asks the server for nothing.
  expect_layers(b.retrieve_layers(tokens, kLayers), tokens, kChunk * kChunks);
  EXPECT_EQ(b.stats().remote.hits + b.stats().remote.misses, entries);
}

TEST(RemoteStore, ReadThroughContinuesALocalPrefixAndStopsAtTheFirstChunkMissingAnywhere) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  const auto tokens = make_tokens(kChunk * kChunks, 9);
  ChunkedTokenDatabase db(kChunk, false);
  const auto chunks = db.process_tokens(tokens);
  {
    HiddenStateStore a(remote_config({server.url()}), db);
    store_layers(a, tokens);
  }  // destruction sends the queue
  ASSERT_TRUE(server.command({"DEL", key_of(chunks[5], 0)}));

  HiddenStateStore b(remote_config({server.url()}), db);
  FakeKv kv;
  b.bind_storage_manager(&kv);
  const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 2 * kChunk);
  store_layers(b, head);  // chunks 0-1 local
  b.flush();
  EXPECT_EQ(b.coverage(chunks, kLayers, CoverageScope::kAllTiers), 5 * kChunk);
  const auto got = b.retrieve_layers(tokens, kLayers);
  expect_layers(got, tokens, 5 * kChunk);
  // Chunks 2-7 were asked for in one round trip and all but (5, layer 0) inserted; the prefix
  // still ends at chunk 5.
  EXPECT_EQ(b.stats().remote.read_through_chunks, 6 * kLayers.size() - 1);
  EXPECT_EQ(b.stats().remote.misses, 1U);
  EXPECT_FALSE(b.has_chunk(chunks[5].key, 0));
  EXPECT_TRUE(b.has_chunk(chunks[6].key, 0));
}

TEST(RemoteStore, ReadThroughOnlyWhereKvIsPresent) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  const auto tokens = make_tokens(kChunk * kChunks, 11);
  ChunkedTokenDatabase db(kChunk, false);
  const auto chunks = db.process_tokens(tokens);
  {
    HiddenStateStore a(remote_config({server.url()}), db);
    store_layers(a, tokens);
  }
  HiddenStateStore b(remote_config({server.url()}), db);
  FakeKv kv;
  kv.evict(chunks[3].key);
  b.bind_storage_manager(&kv);
  EXPECT_EQ(b.coverage(chunks, kLayers, CoverageScope::kAllTiers), 3 * kChunk);
  expect_layers(b.retrieve_layers(tokens, kLayers), tokens, 3 * kChunk);
  const auto s = b.stats().remote;
  EXPECT_EQ(s.hits, 3 * kLayers.size());  // chunks past the KV gap were never asked for
  EXPECT_EQ(s.misses, 0U);
}

TEST(RemoteStore, ShardedPrefixStopsAtTheFirstChunkOfAStoppedServer) {
  HSS_REQUIRE_REDIS();
  RedisTestServer a;
  RedisTestServer b;
  const auto tokens = make_tokens(kChunk * 32, 13);
  ChunkedTokenDatabase db(kChunk, false);
  const auto chunks = db.process_tokens(tokens);
  {
    HiddenStateStore writer(remote_config({a.url(), b.url()}), db);
    store_layers(writer, tokens);
  }
  size_t first_on_b = chunks.size();
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (const int64_t layer : kLayers) {  // all layers of a chunk live on one server
      const bool on_a = a.get(key_of(chunks[i], layer)).has_value();
      const bool on_b = b.get(key_of(chunks[i], layer)).has_value();
      ASSERT_NE(on_a, on_b) << "chunk " << i << " layer " << layer;
      ASSERT_EQ(on_b, b.get(key_of(chunks[i], kLayers[0])).has_value());
      if (on_b) first_on_b = std::min(first_on_b, i);
    }
  }
  ASSERT_LT(first_on_b, chunks.size());
  b.stop();
  HiddenStateStore reader(remote_config({a.url(), b.url()}), db);
  expect_layers(reader.retrieve_layers(tokens, kLayers), tokens,
                static_cast<int64_t>(first_on_b) * kChunk);
}

TEST(RemoteStore, ServerKilledDuringStoresAndRetrievesThenRestarted) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore writer(remote_config({server.url()}), db);
  HiddenStateStore reader(remote_config({server.url()}, /*pool_chunks=*/64), db);
  std::vector<std::vector<int32_t>> prompts;
  for (uint64_t p = 0; p < 12; ++p) prompts.push_back(make_tokens(kChunk * 4, 100 + p));

  for (size_t p = 0; p < prompts.size(); ++p) {
    if (p == 6) server.stop(/*kill=*/true);
    store_layers(writer, prompts[p]);  // never fails, never waits for the network
    if (p % 2 == 1) writer.flush();
    // Whatever the reader gets is right; its prefix may be shorter while the server is gone.
    const auto got = reader.retrieve_layers(prompts[p], kLayers);
    if (!got.empty()) expect_layers(got, prompts[p], got.front().rows());
    for (const Chunk& c : db.process_tokens(prompts[p])) (void)reader.drop_key(c.key);
  }
  writer.flush();
  EXPECT_GT(writer.stats().remote.dropped_writes, 0U);

  ASSERT_TRUE(server.start());  // same port, empty
  // The writer never reads, so its read connection (servers_connected) never went down: what
  // must come back before its next writes land is its write connection, which the background
  // thread reconnects after a backoff (counted in reconnects). Waiting on servers_connected
  // instead let the store below race the reconnect and drop its writes on a loaded machine.
  ASSERT_TRUE(wait_until([&] { return writer.stats().remote.reconnects >= 1; }));
  ASSERT_TRUE(wait_until([&] { return reader.stats().remote.servers_connected == 1; }));
  const auto fresh = make_tokens(kChunk * 4, 999);
  store_layers(writer, fresh);
  writer.flush();
  expect_layers(reader.retrieve_layers(fresh, kLayers), fresh, kChunk * 4);
  EXPECT_EQ(writer.stats().remote.servers_connected, 1U);
}

TEST(RemoteStore, ServerAbsentAtStartIsLocalOnly) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  server.stop();
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(remote_config({server.url()}), db);
  const auto tokens = make_tokens(kChunk * 4, 21);
  store_layers(store, tokens);
  store.flush();
  expect_layers(store.retrieve_layers(tokens, kLayers), tokens, kChunk * 4);
  const auto s = store.stats().remote;
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.servers_connected, 0U);
  EXPECT_EQ(s.dropped_writes, 4 * kLayers.size());
}

TEST(RemoteStore, CorruptValueIsACountedMissAndNeverRestored) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  const auto tokens = make_tokens(kChunk * 4, 23);
  ChunkedTokenDatabase db(kChunk, false);
  const auto chunks = db.process_tokens(tokens);
  {
    HiddenStateStore a(remote_config({server.url()}), db);
    store_layers(a, tokens);
  }
  const std::string offset = std::to_string(detail::kRemoteHeaderBytes + 3);
  ASSERT_TRUE(server.command({"SETRANGE", key_of(chunks[2], 5), offset, "!"}));
  HiddenStateStore b(remote_config({server.url()}), db);
  expect_layers(b.retrieve_layers(tokens, kLayers), tokens, 2 * kChunk);
  EXPECT_EQ(b.stats().remote.corrupt_values, 1U);
}

}  // namespace
}  // namespace hss

#else  // !HSS_HAVE_REMOTE

namespace hss {
namespace {

TEST(RemoteStore, CompiledOutRemoteUrlIsAConfigErrorAtConstruction) {
  Config c = test::store_config(16, 32, 4);
  c.hidden_state_remote_url = {"redis://127.0.0.1:6379"};
  ChunkedTokenDatabase db(16, false);
  EXPECT_THROW(HiddenStateStore(c, db), ConfigError);
}

}  // namespace
}  // namespace hss

#endif  // HSS_HAVE_REMOTE
