// RemoteTier against a real redis-server that each test starts on 127.0.0.1 and a free port
// (tests/redis_test_server.hpp). Skipped without redis-server; compiled out without hiredis.

#if HSS_HAVE_REMOTE

#include "tiers/remote/remote_tier.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hss/error.hpp"
#include "redis_test_server.hpp"
#include "format/value_codec.hpp"

namespace hss::detail {
namespace {

using test::RedisTestServer;
using test::wait_until;

CacheEngineKey chunk_key(uint64_t i) {
  CacheEngineKey key;
  key.model_name = "remote-test";
  key.chunk_hash = 0x1000 + i;
  return key;
}

// Deterministic payload of a chunk: every byte depends on (chunk, layer, position).
std::vector<std::byte> payload_of(uint64_t chunk, int64_t layer, size_t bytes) {
  std::vector<std::byte> out(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    out[i] =
        static_cast<std::byte>((i * 31 + chunk * 7 + static_cast<uint64_t>(layer) * 13) & 0xff);
  }
  return out;
}

Config remote_config(std::vector<std::string> urls) {
  Config cfg;
  cfg.hidden_state_remote_url = std::move(urls);
  cfg.hidden_state_remote_timeout_ms = 500;
  return cfg;
}

constexpr int64_t kRows = 16;
constexpr int64_t kCols = 64;
constexpr size_t kBytes = kRows * kCols * 4;

RemoteWrite write_of(uint64_t chunk, int64_t layer = 0) {
  return RemoteWrite{chunk_key(chunk), Slot{ActivationKind::kHidden, layer}, RowFormat{}, kRows,
                     kCols};
}

bool enqueue(RemoteTier& tier, uint64_t chunk, int64_t layer = 0) {
  const auto bytes = payload_of(chunk, layer, kBytes);
  const std::span<const std::byte> whole(bytes);
  const std::vector<std::span<const std::byte>> pieces = {whole.first(100), whole.subspan(100)};
  return tier.enqueue_write(write_of(chunk, layer), pieces);
}

RemoteRequest request_of(uint64_t chunk, int64_t layer = 0) {
  return RemoteRequest{chunk_key(chunk), Slot{ActivationKind::kHidden, layer}, kRows, kCols};
}

// A value returned must be exactly what was stored for that (chunk, layer).
void expect_value(const std::optional<RemoteValue>& value, uint64_t chunk, int64_t layer = 0) {
  ASSERT_TRUE(value.has_value()) << "chunk " << chunk;
  EXPECT_EQ(value->format, detail::RowFormat{});
  EXPECT_EQ(value->rows, kRows);
  EXPECT_EQ(value->cols, kCols);
  const auto expected = payload_of(chunk, layer, kBytes);
  ASSERT_EQ(value->payload.size(), expected.size());
  EXPECT_EQ(std::memcmp(value->payload.data(), expected.data(), expected.size()), 0)
      << "chunk " << chunk;
}

std::vector<RemoteRequest> requests_for(uint64_t first, uint64_t count) {
  std::vector<RemoteRequest> out;
  for (uint64_t i = first; i < first + count; ++i) out.push_back(request_of(i));
  return out;
}

TEST(RemoteTier, NoUrlMeansNoTier) { EXPECT_EQ(RemoteTier::create(Config{}), nullptr); }

TEST(RemoteTier, RoundTripWithTtlAndBorrowedPayload) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  Config cfg = remote_config({server.url()});
  cfg.hidden_state_remote_ttl_s = 300;
  const auto tier = RemoteTier::create(cfg);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->remote_stats().servers_connected, 1U);
  EXPECT_TRUE(tier->last_error().empty()) << tier->last_error();

  ASSERT_TRUE(enqueue(*tier, 1, 0));
  ASSERT_TRUE(enqueue(*tier, 1, 5));
  // Borrowed: the tier holds the owner until the write is sent, then lets go.
  auto owned = std::make_shared<std::vector<std::byte>>(payload_of(2, 0, kBytes));
  const std::vector<std::span<const std::byte>> pieces = {std::span<const std::byte>(*owned)};
  ASSERT_TRUE(tier->enqueue_write(write_of(2), pieces, owned));
  tier->flush();
  EXPECT_EQ(owned.use_count(), 1);

  const RemoteStats after_write = tier->remote_stats();
  EXPECT_EQ(after_write.writes_enqueued, 3U);
  EXPECT_EQ(after_write.writes_sent, 3U);
  EXPECT_EQ(after_write.bytes_written, 3 * kBytes);
  EXPECT_EQ(after_write.dropped_writes, 0U);
  EXPECT_EQ(after_write.queue_bytes, 0U);

  const std::vector<RemoteRequest> requests = {request_of(1, 0), request_of(1, 5), request_of(2),
                                               request_of(3)};
  const auto values = tier->fetch(requests);
  ASSERT_EQ(values.size(), 4U);
  expect_value(values[0], 1, 0);
  expect_value(values[1], 1, 5);
  expect_value(values[2], 2, 0);
  EXPECT_FALSE(values[3].has_value());
  const RemoteStats s = tier->remote_stats();
  EXPECT_EQ(s.hits, 3U);
  EXPECT_EQ(s.misses, 1U);
  EXPECT_EQ(s.bytes_read, 3 * kBytes);
  EXPECT_EQ(s.corrupt_values, 0U);

  const std::vector<bool> present = tier->contains(requests);
  EXPECT_EQ(present, (std::vector<bool>{true, true, true, false}));

  const auto ttl = server.command({"TTL", remote_key(chunk_key(1), "hidden", 0)});
  ASSERT_TRUE(ttl);
  EXPECT_GT(ttl->integer, 0);
  EXPECT_LE(ttl->integer, 300);
  // The value on the server is the documented format.
  const auto raw = server.get(remote_key(chunk_key(2), "hidden", 0));
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->substr(0, 4), "HSSR");
}

TEST(RemoteTier, BadWriteShapeIsInvalidArgumentAndQueuesNothing) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  const auto tier = RemoteTier::create(remote_config({server.url()}));
  const auto bytes = payload_of(1, 0, kBytes - 4);
  const std::vector<std::span<const std::byte>> pieces = {std::span<const std::byte>(bytes)};
  EXPECT_THROW((void)tier->enqueue_write(write_of(1), pieces), InvalidArgument);
  EXPECT_EQ(tier->remote_stats().writes_enqueued, 0U);
}

TEST(RemoteTier, OverBudgetDropsTheOldestPendingWriteWithoutBlocking) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  Config cfg = remote_config({server.url()});
  cfg.hidden_state_remote_queue_bytes = static_cast<int64_t>(2 * kBytes);
  const auto tier = RemoteTier::create(cfg);

  // Hold the writer inside the first write so the queue fills behind it.
  std::promise<void> entered;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  const auto first = payload_of(10, 0, kBytes);
  const std::vector<std::span<const std::byte>> first_pieces = {std::span<const std::byte>(first)};
  ASSERT_TRUE(tier->enqueue_write(write_of(10), first_pieces, {}, [&] {
    entered.set_value();
    released.wait();
    return true;
  }));
  entered.get_future().wait();
  ASSERT_TRUE(enqueue(*tier, 11));
  ASSERT_TRUE(enqueue(*tier, 12));
  ASSERT_TRUE(enqueue(*tier, 13));  // over budget: 11, the oldest pending, goes
  EXPECT_EQ(tier->remote_stats().dropped_writes, 1U);
  EXPECT_EQ(tier->remote_stats().queue_bytes, 2 * kBytes);
  release.set_value();
  tier->flush();

  const auto values = tier->fetch(requests_for(10, 4));
  expect_value(values[0], 10);
  EXPECT_FALSE(values[1].has_value());
  expect_value(values[2], 12);
  expect_value(values[3], 13);
  EXPECT_EQ(tier->remote_stats().writes_sent, 3U);

  // A value larger than the whole budget is dropped at once.
  cfg.hidden_state_remote_queue_bytes = 16;
  const auto tiny = RemoteTier::create(cfg);
  EXPECT_FALSE(enqueue(*tiny, 20));
  EXPECT_EQ(tiny->remote_stats().dropped_writes, 1U);
}

TEST(RemoteTier, ServerAbsentAtStartRunsLocalOnlyThenReconnects) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  server.stop();
  const auto tier = RemoteTier::create(remote_config({server.url()}));
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->remote_stats().servers_connected, 0U);
  EXPECT_NE(tier->last_error().find(std::to_string(server.port())), std::string::npos)
      << tier->last_error();
  EXPECT_FALSE(tier->fetch(requests_for(1, 3))[0].has_value());
  EXPECT_EQ(tier->remote_stats().misses, 3U);
  ASSERT_TRUE(enqueue(*tier, 1));
  tier->flush();
  EXPECT_EQ(tier->remote_stats().dropped_writes, 1U);

  ASSERT_TRUE(server.start());
  tier->reconnect_now();
  ASSERT_TRUE(wait_until([&] { return tier->remote_stats().servers_connected == 1; }));
  EXPECT_GE(tier->remote_stats().reconnects, 1U);
  ASSERT_TRUE(enqueue(*tier, 2));
  tier->flush();
  expect_value(tier->fetch(requests_for(2, 1))[0], 2);
}

TEST(RemoteTier, ShardsOverTwoServersAndLosesOnlyTheStoppedShare) {
  HSS_REQUIRE_REDIS();
  RedisTestServer a;
  RedisTestServer b;
  const auto tier = RemoteTier::create(remote_config({a.url(), b.url()}));
  constexpr uint64_t kChunks = 64;
  for (uint64_t i = 0; i < kChunks; ++i) ASSERT_TRUE(enqueue(*tier, i));
  tier->flush();
  ASSERT_EQ(tier->remote_stats().writes_sent, kChunks);

  std::array<uint64_t, 2> per_server{};
  for (uint64_t i = 0; i < kChunks; ++i) {
    const std::string key = remote_key(chunk_key(i), "hidden", 0);
    const bool on_a = a.get(key).has_value();
    const bool on_b = b.get(key).has_value();
    EXPECT_NE(on_a, on_b) << "chunk " << i << " must be on exactly one server";
    EXPECT_EQ(on_a ? 0U : 1U, tier->shard_of(chunk_key(i))) << "chunk " << i;
    ++per_server[on_a ? 0 : 1];
  }
  EXPECT_GT(per_server[0], 10U);
  EXPECT_GT(per_server[1], 10U);

  b.stop();
  const auto present = tier->contains(requests_for(0, kChunks));
  const auto values = tier->fetch(requests_for(0, kChunks));
  uint64_t hits = 0;
  for (uint64_t i = 0; i < kChunks; ++i) {
    if (tier->shard_of(chunk_key(i)) == 0) {
      expect_value(values[i], i);
      EXPECT_TRUE(present[i]) << "chunk " << i;
      ++hits;
    } else {
      EXPECT_FALSE(values[i].has_value()) << "chunk " << i;
      EXPECT_FALSE(present[i]) << "chunk " << i;
    }
  }
  EXPECT_EQ(hits, per_server[0]);
}

TEST(RemoteTier, ServerKilledDuringWritesAndFetchesThenRestarted) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  const auto tier = RemoteTier::create(remote_config({server.url()}));
  for (uint64_t i = 0; i < 32; ++i) ASSERT_TRUE(enqueue(*tier, i));
  tier->flush();

  // Readers keep fetching while the server is killed; every value they get must be right.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> checked{0};
  std::thread reader([&] {
    while (!stop.load()) {
      const auto values = tier->fetch(requests_for(0, 32));
      for (uint64_t i = 0; i < 32; ++i) {
        if (values[i]) {
          expect_value(values[i], i);
          checked.fetch_add(1);
        }
      }
    }
  });
  ASSERT_TRUE(wait_until([&] { return checked.load() >= 64; }));
  for (uint64_t i = 100; i < 300; ++i) {
    if (i == 150) server.stop(/*kill=*/true);
    (void)enqueue(*tier, i);  // never blocks, whatever the server does
  }
  tier->flush();  // returns: writes to a dead server are dropped
  stop.store(true);
  reader.join();
  const RemoteStats dead = tier->remote_stats();
  EXPECT_GT(dead.dropped_writes, 0U);
  EXPECT_GT(dead.errors, 0U);
  EXPECT_EQ(dead.corrupt_values, 0U);

  ASSERT_TRUE(server.start());  // same port, empty (no persistence)
  tier->reconnect_now();
  ASSERT_TRUE(wait_until([&] { return tier->remote_stats().servers_connected == 1; }));
  for (uint64_t i = 400; i < 432; ++i) ASSERT_TRUE(enqueue(*tier, i));
  tier->flush();
  const auto values = tier->fetch(requests_for(400, 32));
  for (uint64_t i = 0; i < 32; ++i) expect_value(values[i], 400 + i);
  EXPECT_GE(tier->remote_stats().reconnects, 1U);
}

// A server restart leaves the reader's idle connection stale: the next fetch must reconnect once
// and answer, not miss everything (deterministic: no fetch sees the outage before the restart).
TEST(RemoteTier, FirstFetchAfterARestartReconnectsTheStaleReader) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  const auto tier = RemoteTier::create(remote_config({server.url()}));
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(enqueue(*tier, i));
  tier->flush();
  const auto before = tier->fetch(requests_for(0, 8));
  for (uint64_t i = 0; i < 8; ++i) expect_value(before[i], i);

  server.stop(/*kill=*/true);
  ASSERT_TRUE(server.start());  // same port, empty
  {
    // Another process's writes land on the restarted server.
    const auto other = RemoteTier::create(remote_config({server.url()}));
    for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(enqueue(*other, 500 + i));
    other->flush();
    ASSERT_EQ(other->remote_stats().writes_sent, 8U);
  }
  const auto after = tier->fetch(requests_for(500, 8));
  for (uint64_t i = 0; i < 8; ++i) expect_value(after[i], 500 + i);
  EXPECT_GE(tier->remote_stats().reconnects, 1U);
}

TEST(RemoteTier, CorruptTruncatedForeignAndOtherShapeValuesAreCountedMisses) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  const auto tier = RemoteTier::create(remote_config({server.url()}));
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(enqueue(*tier, i));
  tier->flush();
  const auto key = [](uint64_t i) { return remote_key(chunk_key(i), "hidden", 0); };

  // 0: one payload byte overwritten, with redis-cli when it is installed.
  const std::string offset = std::to_string(kRemoteHeaderBytes + 100);
  if (test::find_in_path("redis-cli")) {
    const std::string cmd = "redis-cli -h 127.0.0.1 -p " + std::to_string(server.port()) +
                            " SETRANGE '" + key(0) + "' " + offset + " XYZ > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  } else {
    ASSERT_TRUE(server.command({"SETRANGE", key(0), offset, "XYZ"}));
  }
  // 1: truncated by 8 bytes.
  const std::string whole = *server.get(key(1));
  ASSERT_TRUE(server.set(key(1), whole.substr(0, whole.size() - 8)));
  // 2: a valid value of another shape.
  const auto other = payload_of(2, 0, kBytes);
  const std::vector<std::span<const std::byte>> pieces = {std::span<const std::byte>(other)};
  ASSERT_TRUE(
      server.set(key(2), encode_remote_value(DType::kFloat32, kRows * 2, kCols / 2, pieces)));
  // 3: not ours at all.
  ASSERT_TRUE(server.set(key(3), "hello, world"));

  const auto values = tier->fetch(requests_for(0, 5));
  for (uint64_t i = 0; i < 4; ++i) EXPECT_FALSE(values[i].has_value()) << "chunk " << i;
  expect_value(values[4], 4);
  const RemoteStats s = tier->remote_stats();
  EXPECT_EQ(s.corrupt_values, 4U);
  EXPECT_EQ(s.misses, 4U);
  EXPECT_EQ(s.hits, 1U);
}

TEST(RemoteTier, PasswordProtectedServer) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server("s3cret-pw");
  {
    const auto tier = RemoteTier::create(remote_config({server.url()}));
    EXPECT_EQ(tier->remote_stats().servers_connected, 1U) << tier->last_error();
    ASSERT_TRUE(enqueue(*tier, 1));
    tier->flush();
    expect_value(tier->fetch(requests_for(1, 1))[0], 1);
  }
  for (const std::string wrong : {"not-it", ""}) {
    const auto tier = RemoteTier::create(remote_config({server.url(wrong)}));
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->remote_stats().servers_connected, 0U);
    const std::string error = tier->last_error();
    EXPECT_NE(error.find("127.0.0.1:" + std::to_string(server.port())), std::string::npos) << error;
    if (!wrong.empty()) {
      EXPECT_NE(error.find("authentication"), std::string::npos) << error;
      EXPECT_EQ(error.find(wrong), std::string::npos) << "the password leaked: " << error;
    } else {
      EXPECT_NE(error.find("NOAUTH"), std::string::npos) << error;
    }
    EXPECT_FALSE(tier->fetch(requests_for(1, 1))[0].has_value());
    EXPECT_FALSE(!enqueue(*tier, 2));  // accepted, then dropped: local-only
    tier->flush();
    EXPECT_EQ(tier->remote_stats().dropped_writes, 1U);
  }
}

}  // namespace
}  // namespace hss::detail

#else  // !HSS_HAVE_REMOTE

#include <gtest/gtest.h>

#include "hss/error.hpp"
#include "tiers/remote/remote_tier.hpp"

// Without hiredis the tier is compiled out: a configured URL fails loudly, no URL is fine.
TEST(RemoteTier, CompiledOutUrlIsAConfigError) {
  EXPECT_FALSE(hss::detail::remote_tier_available());
  EXPECT_EQ(hss::detail::RemoteTier::create(hss::Config{}), nullptr);
  hss::Config cfg;
  cfg.hidden_state_remote_url = {"redis://:pw@127.0.0.1:6379"};
  try {
    (void)hss::detail::RemoteTier::create(cfg);
    ADD_FAILURE() << "expected hss::ConfigError";
  } catch (const hss::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("hiredis"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("pw@"), std::string::npos) << e.what();
  }
}

#endif  // HSS_HAVE_REMOTE
