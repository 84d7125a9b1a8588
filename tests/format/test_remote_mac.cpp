// Authenticated remote values (src/format/value_mac.hpp) and read-only ACL users on the Redis/Valkey tier:
// a forged value with a valid xxHash3 but no valid MAC is a counted miss, a read-only user's
// writes fail cleanly and are counted with nothing lost locally. Codec cases need no server.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "hss/error.hpp"
#include "hss/hss.hpp"
#include "format/value_codec.hpp"
#include "test_util.hpp"
#include "format/value_mac.hpp"

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
const std::string kKey = "a-shared-secret-of-32-bytes-long";

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s)); }

TEST(ValueMac, ConfigKeyRules) {
  Config c;
  c.hidden_state_mac_key = "short";
  EXPECT_THROW(c.validate(), ConfigError);
  c.hidden_state_mac_key = kKey;
  c.validate();
  c.hidden_state_mac_key_file = "/tmp/x";
  EXPECT_THROW(c.validate(), ConfigError);  // at most one of the two
  // The inline key is never printed.
  Config d;
  d.hidden_state_mac_key = kKey;
  EXPECT_EQ(d.to_yaml().find(kKey), std::string::npos);
  EXPECT_THROW((void)Config::from_yaml("hidden_state_mac_key: tooshort\n"), ConfigError);
  try {
    (void)Config::from_yaml("hidden_state_mac_key: tooshort\n");
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("tooshort"), std::string::npos) << e.what();
  }
}

TEST(ValueMac, KeyFileIsReadWhenTheStoreIsBuiltAndAMissingOneIsAConfigError) {
  if (!detail::value_mac_available()) GTEST_SKIP() << "built without OpenSSL";
  Config c = test::store_config(kChunk, kCols, 4);
  c.hidden_state_mac_key_file = "/nonexistent/hss-mac-key";
  ChunkedTokenDatabase db(kChunk, false);
  EXPECT_THROW(HiddenStateStore(c, db), ConfigError);
  const auto path = std::filesystem::temp_directory_path() / "hss-test-mac-key";
  {
    std::ofstream out(path);
    out << "short\n";
  }
  c.hidden_state_mac_key_file = path.string();
  EXPECT_THROW(HiddenStateStore(c, db), ConfigError);
  {
    std::ofstream out(path);
    out << kKey << "\n";
  }
  const auto mac = detail::ValueMac::from_config(c);
  ASSERT_TRUE(mac);
  const detail::ValueMac same(kKey);  // the trailing newline is not part of the key
  const std::string payload = "payload";
  const auto piece = bytes_of(payload);
  EXPECT_EQ(mac->compute("k", {}, std::span(&piece, 1)),
            same.compute("k", {}, std::span(&piece, 1)));
  std::filesystem::remove(path);
}

TEST(ValueMac, CompiledOutMacKeyIsAConfigError) {
  if (detail::value_mac_available()) GTEST_SKIP() << "built with OpenSSL";
  Config c = test::store_config(kChunk, kCols, 4);
  c.hidden_state_mac_key = kKey;
  ChunkedTokenDatabase db(kChunk, false);
  EXPECT_THROW(HiddenStateStore(c, db), ConfigError);
}

TEST(RemoteCodecMac, ValueWithMacDecodesOnlyWithTheKeyAndItsName) {
  if (!detail::value_mac_available()) GTEST_SKIP() << "built without OpenSSL";
  const detail::ValueMac mac(kKey), other(kKey + "!");
  std::vector<float> rows(2 * 3, 1.5F);
  const auto piece = std::as_bytes(std::span(rows));
  const std::string value = detail::encode_remote_value(DType::kFloat32, 2, 3, std::span(&piece, 1),
                                                        &mac, "hss:v1:k:hidden:0");
  EXPECT_EQ(value.size(), detail::kRemoteHeaderBytes + detail::kMacBytes + piece.size());
  using detail::DecodeStatus;
  const auto ok = detail::decode_remote_value(bytes_of(value), 2, 3, &mac, "hss:v1:k:hidden:0");
  ASSERT_EQ(ok.status, DecodeStatus::kOk);
  EXPECT_EQ(std::memcmp(ok.payload.data(), rows.data(), piece.size()), 0);
  // Without a key the MAC is skipped; with another key, or under another name, it fails.
  EXPECT_EQ(detail::decode_remote_value(bytes_of(value), 2, 3).status, DecodeStatus::kOk);
  EXPECT_EQ(detail::decode_remote_value(bytes_of(value), 2, 3, &other, "hss:v1:k:hidden:0").status,
            DecodeStatus::kUnauthenticated);
  EXPECT_EQ(detail::decode_remote_value(bytes_of(value), 2, 3, &mac, "hss:v1:k:hidden:1").status,
            DecodeStatus::kUnauthenticated);
  // A forged value: valid header and xxHash3, no MAC.
  const std::string forged =
      detail::encode_remote_value(DType::kFloat32, 2, 3, std::span(&piece, 1));
  EXPECT_EQ(detail::decode_remote_value(bytes_of(forged), 2, 3).status, DecodeStatus::kOk);
  EXPECT_EQ(detail::decode_remote_value(bytes_of(forged), 2, 3, &mac, "hss:v1:k:hidden:0").status,
            DecodeStatus::kUnauthenticated);
  // A flipped MAC byte, and a value cut inside its MAC.
  std::string flipped = value;
  flipped[detail::kRemoteHeaderBytes + 5] ^= 1;
  EXPECT_EQ(detail::decode_remote_value(bytes_of(flipped), 2, 3, &mac, "hss:v1:k:hidden:0").status,
            DecodeStatus::kUnauthenticated);
  EXPECT_EQ(detail::decode_remote_value(bytes_of(value.substr(0, 40)), 2, 3, &mac, "x").status,
            DecodeStatus::kTruncated);
}

#if HSS_HAVE_REMOTE

using test::RedisTestServer;

Config remote_config(const std::string& url, std::string mac_key = {}) {
  Config c = test::store_config(kChunk, kCols, 256);
  c.hidden_state_remote_url = {url};
  c.hidden_state_remote_timeout_ms = 500;
  c.hidden_state_mac_key = std::move(mac_key);
  return c;
}

void store_prompt(HiddenStateStore& store, const std::vector<int32_t>& tokens, int64_t layer = 0) {
  const auto rows = make_rows(tokens, 0, layer, kCols);
  ASSERT_EQ(store.store_hidden_states(tokens, view_of(rows, kCols), {layer, 0}).cached,
            static_cast<int64_t>(tokens.size()) / kChunk);
}

void expect_prefix(HiddenStateStore& store, const std::vector<int32_t>& tokens, int64_t rows) {
  const auto got = store.retrieve_hidden_states(tokens);
  if (rows == 0) {
    EXPECT_FALSE(got.has_value());
    return;
  }
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->rows(), rows);
  const auto expected = make_rows(tokens, 0, 0, kCols);
  EXPECT_EQ(std::memcmp(got->data(), expected.data(), got->bytes()), 0);
}

TEST(RemoteMac, ForgedValueWithAValidChecksumButNoValidMacIsACountedMiss) {
  HSS_REQUIRE_REDIS();
  if (!detail::value_mac_available()) GTEST_SKIP() << "built without OpenSSL";
  RedisTestServer server;
  ChunkedTokenDatabase db(kChunk, false);
  const auto tokens = make_tokens(4 * kChunk, 31);
  const auto chunks = db.process_tokens(tokens);
  {
    HiddenStateStore a(remote_config(server.url(), kKey), db);
    store_prompt(a, tokens);
  }
  // Someone who can write to the server replaces chunk 2 with its own rows: header and xxHash3
  // are valid, the MAC is absent (it does not have the key).
  const std::vector<float> evil(static_cast<size_t>(kChunk * kCols), 1e6F);
  const auto piece = std::as_bytes(std::span(evil));
  const std::string key2 = detail::remote_key(chunks[2].key, "hidden", 0);
  ASSERT_TRUE(server.set(
      key2, detail::encode_remote_value(DType::kFloat32, kChunk, kCols, std::span(&piece, 1))));
  HiddenStateStore b(remote_config(server.url(), kKey), db);
  expect_prefix(b, tokens, 2 * kChunk);  // chunks 0, 1 authenticated; the forged one never served
  EXPECT_EQ(b.stats().remote.unauthenticated_values, 1U);
  EXPECT_EQ(b.stats().remote.corrupt_values, 1U);
  // A reader without the key cannot tell: the same forged value passes the checksum alone.
  HiddenStateStore c(remote_config(server.url()), db);
  const auto got = c.retrieve_hidden_states(tokens);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->rows(), 4 * kChunk);
  EXPECT_EQ(got->data()[2 * kChunk * kCols], 1e6F);
}

TEST(RemoteMac, ReadOnlyAclUserReadsAndItsWritesFailCleanlyAndAreCounted) {
  HSS_REQUIRE_REDIS();
  RedisTestServer server;
  ASSERT_TRUE(server.command({"ACL", "SETUSER", "reader", "on", ">reader-pass", "~*", "+@read"}));
  const std::string reader_url =
      "redis://reader:reader-pass@127.0.0.1:" + std::to_string(server.port());
  ChunkedTokenDatabase db(kChunk, false);
  const auto shared = make_tokens(3 * kChunk, 41), own = make_tokens(3 * kChunk, 42);
  {
    HiddenStateStore writer(remote_config(server.url()), db);
    store_prompt(writer, shared);
  }
  HiddenStateStore reader(remote_config(reader_url), db);
  EXPECT_EQ(reader.stats().remote.servers_connected, 1U);  // +@read cannot PING: still up
  expect_prefix(reader, shared, 3 * kChunk);               // reads work
  EXPECT_EQ(reader.stats().remote.hits, 3U);
  store_prompt(reader, own);
  reader.flush();
  store_prompt(reader, make_tokens(2 * kChunk, 43));
  reader.flush();
  const RemoteStats s = reader.stats().remote;
  EXPECT_EQ(s.writes_sent, 0U);
  EXPECT_EQ(s.writes_denied, 5U);  // the first refused by the server, the rest never queued
  EXPECT_FALSE(server.get(detail::remote_key(db.process_tokens(own)[0].key, "hidden", 0)));
  expect_prefix(reader, own, 3 * kChunk);  // nothing lost locally
  EXPECT_EQ(reader.stats().remote.errors, 0U);
}

#endif  // HSS_HAVE_REMOTE

}  // namespace
}  // namespace hss
