// The remote tier's pure parts: redis:// URLs, the value codec and rendezvous sharding. No
// server needed; built with or without hiredis.

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "format/dtype_codes.hpp"
#include "hss/error.hpp"
#include "config/redis_url.hpp"
#include "format/value_codec.hpp"
#include "tiers/remote/remote_shard.hpp"

namespace hss::detail {
namespace {

TEST(RedisUrl, ParsesHostPortDbAndCredentials) {
  const RedisEndpoint plain = parse_redis_url("redis://127.0.0.1:6379");
  EXPECT_EQ(plain.host, "127.0.0.1");
  EXPECT_EQ(plain.port, 6379);
  EXPECT_EQ(plain.db, 0);
  EXPECT_TRUE(plain.user.empty());
  EXPECT_TRUE(plain.password.empty());

  const RedisEndpoint full = parse_redis_url("redis://alice:p@ss:w0rd@cache.local:7000/3");
  EXPECT_EQ(full.user, "alice");
  EXPECT_EQ(full.password, "p@ss:w0rd");  // split at the last '@', the first ':'
  EXPECT_EQ(full.host, "cache.local");
  EXPECT_EQ(full.port, 7000);
  EXPECT_EQ(full.db, 3);
  EXPECT_EQ(full.display(), "cache.local:7000/3");

  const RedisEndpoint password_only = parse_redis_url("redis://:secret@[::1]:6380/");
  EXPECT_EQ(password_only.user, "");
  EXPECT_EQ(password_only.password, "secret");
  EXPECT_EQ(password_only.host, "::1");
  EXPECT_EQ(password_only.port, 6380);
}

TEST(RedisUrl, RejectsBadUrlsNamingTheProblemWithoutThePassword) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"http://h:1", "scheme"},
      {"redis://h", "port is missing"},
      {"redis://h:0", "port '0'"},
      {"redis://h:70000", "port '70000'"},
      {"redis://:6379", "host"},
      {"redis://h:1/x", "database 'x'"},
      {"redis://h:1/-1", "database"},
      {"redis://user@h:1", "':'"},
      {"redis://u:@h:1", "password is empty"}};
  for (const auto& [url, fragment] : cases) {
    try {
      (void)parse_redis_url(url);
      ADD_FAILURE() << url << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  }
  try {
    (void)parse_redis_url("redis://u:topsecret@h");
    ADD_FAILURE() << "a URL without a port was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("topsecret"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("redis://u:***@h"), std::string::npos) << e.what();
  }
}

TEST(RedisUrl, ListRejectsTheSameServerTwice) {
  const std::vector<std::string> urls = {"redis://h:1", "redis://:pw@h:1/0"};
  EXPECT_THROW((void)parse_redis_urls(urls), ConfigError);
  const std::vector<std::string> two_dbs = {"redis://h:1/0", "redis://h:1/1"};
  EXPECT_EQ(parse_redis_urls(two_dbs).size(), 2U);
}

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return out;
}

std::span<const std::byte> as_span(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

TEST(RemoteCodec, RoundTripsPiecesBitIdentically) {
  const auto payload = pattern(4 * 3 * 2, 7);  // 4 rows x 3 cols of bf16
  const std::span<const std::byte> whole(payload);
  const std::vector<std::span<const std::byte>> pieces = {whole.first(5), whole.subspan(5)};
  const std::string value = encode_remote_value(DType::kBFloat16, 4, 3, pieces);
  ASSERT_EQ(value.size(), kRemoteHeaderBytes + payload.size());
  EXPECT_EQ(value.substr(0, 4), "HSSR");

  const DecodedValue d = decode_remote_value(as_span(value), 4, 3);
  ASSERT_EQ(d.status, DecodeStatus::kOk);
  EXPECT_EQ(d.header.format, to_row_format(DType::kBFloat16));
  EXPECT_EQ(d.header.rows, 4);
  EXPECT_EQ(d.header.cols, 3);
  ASSERT_EQ(d.payload.size(), payload.size());
  EXPECT_EQ(std::memcmp(d.payload.data(), payload.data(), payload.size()), 0);
  // The streamed hash of pieces equals the one-shot hash of the whole.
  EXPECT_EQ(hash_pieces(pieces), d.header.payload_hash);
  // 0 = any shape.
  EXPECT_EQ(decode_remote_value(as_span(value), 0, 0).status, DecodeStatus::kOk);
}

TEST(RemoteCodec, RejectsEveryDamagedValue) {
  const auto payload = pattern(2 * 8 * 4, 3);
  const std::vector<std::span<const std::byte>> pieces = {std::span<const std::byte>(payload)};
  const std::string good = encode_remote_value(DType::kFloat32, 2, 8, pieces);

  std::string flipped = good;
  flipped[kRemoteHeaderBytes + 9] = static_cast<char>(flipped[kRemoteHeaderBytes + 9] ^ 0x01);
  EXPECT_EQ(decode_remote_value(as_span(flipped), 2, 8).status, DecodeStatus::kBadChecksum);

  EXPECT_EQ(decode_remote_value(as_span(good.substr(0, good.size() - 1)), 2, 8).status,
            DecodeStatus::kTruncated);
  EXPECT_EQ(decode_remote_value(as_span(good + "x"), 2, 8).status, DecodeStatus::kOverlong);
  EXPECT_EQ(decode_remote_value(as_span(good.substr(0, 10)), 2, 8).status, DecodeStatus::kForeign);
  EXPECT_EQ(decode_remote_value(as_span(std::string(64, 'x')), 2, 8).status,
            DecodeStatus::kForeign);
  EXPECT_EQ(decode_remote_value(as_span(good), 2, 16).status, DecodeStatus::kWrongShape);
  EXPECT_EQ(decode_remote_value(as_span(good), 4, 8).status, DecodeStatus::kWrongShape);

  std::string version = good;
  version[4] = 2;
  EXPECT_EQ(decode_remote_value(as_span(version), 2, 8).status, DecodeStatus::kUnsupportedVersion);
  std::string dtype = good;
  dtype[6] = 9;
  EXPECT_EQ(decode_remote_value(as_span(dtype), 2, 8).status, DecodeStatus::kBadHeader);
  std::string huge = good;
  for (int i = 8; i < 16; ++i) huge[static_cast<size_t>(i)] = static_cast<char>(0x7f);
  EXPECT_EQ(decode_remote_value(as_span(huge), 0, 0).status, DecodeStatus::kBadHeader);
}

// The element type is byte 6 of every value, as a fixed wire code, not an enumerator ordinal:
// values already in Redis/Valkey and peers on other builds read these bytes.
TEST(RemoteCodec, ElementTypesHaveFixedWireCodes) {
  const std::pair<DType, uint8_t> codes[] = {
      {DType::kFloat32, 0}, {DType::kFloat16, 1}, {DType::kBFloat16, 2}};
  for (const auto& [dtype, code] : codes) {
    EXPECT_EQ(wire_code(dtype), code) << to_string(dtype);
    EXPECT_EQ(dtype_from_wire(code), dtype) << to_string(dtype);
    EXPECT_EQ(to_dtype(to_elem_type(dtype)), dtype) << to_string(dtype);
    EXPECT_EQ(kernels::elem_bytes(to_elem_type(dtype)), element_size(dtype)) << to_string(dtype);
    RemoteHeader header{to_row_format(dtype), 3, 5, 0x1122334455667788ULL};
    std::array<std::byte, kRemoteHeaderBytes> bytes{};
    encode_remote_header(header, bytes);
    EXPECT_EQ(static_cast<uint8_t>(bytes[6]), code) << to_string(dtype);
    const auto back = decode_remote_header(bytes);
    ASSERT_TRUE(back.has_value()) << to_string(dtype);
    EXPECT_EQ(back->format, to_row_format(dtype));
    EXPECT_EQ(back->rows, 3);
    EXPECT_EQ(back->cols, 5);
  }
  for (int code = 3; code < 256; ++code) {
    EXPECT_FALSE(dtype_from_wire(static_cast<uint8_t>(code)).has_value()) << code;
  }
  for (int code = 5; code < 256; ++code) {  // 3 and 4: FP8 rows (test_fp8_codec.cpp)
    EXPECT_FALSE(row_format_from_wire(static_cast<uint8_t>(code)).has_value()) << code;
    RemoteHeader header{RowFormat{}, 1, 1, 0};
    std::array<std::byte, kRemoteHeaderBytes> bytes{};
    encode_remote_header(header, bytes);
    bytes[6] = static_cast<std::byte>(code);
    EXPECT_FALSE(decode_remote_header(bytes).has_value()) << code;
  }
  EXPECT_EQ(to_elem_type(DType::kFloat16), kernels::ElemType::kFloat16);
  EXPECT_EQ(to_elem_type(DType::kBFloat16), kernels::ElemType::kBFloat16);
}

TEST(RemoteCodec, RejectsPiecesThatDoNotMatchTheShape) {
  const auto payload = pattern(10, 1);
  const std::vector<std::span<const std::byte>> pieces = {std::span<const std::byte>(payload)};
  EXPECT_THROW((void)encode_remote_value(DType::kFloat32, 1, 3, pieces), InvalidArgument);
  EXPECT_THROW((void)remote_payload_bytes(DType::kFloat32, -1, 3), InvalidArgument);
}

TEST(RemoteCodec, KeyIsVersionedAndNamesKindAndLayer) {
  CacheEngineKey key;
  key.model_name = "m";
  key.chunk_hash = 0xabcULL;
  EXPECT_EQ(remote_key(key, "hidden", -1), "hss:v1:" + key.to_string() + ":hidden:-1");
}

TEST(RendezvousSharding, SpreadsKeysAndMovesOnlyTheRemovedServersShare) {
  const std::vector<std::string> three = {"a:1/0", "b:1/0", "c:1/0"};
  const std::vector<std::string> two = {"a:1/0", "c:1/0"};  // b removed
  const RendezvousSharding s3(three);
  const RendezvousSharding s2(two);
  std::map<size_t, int> counts;
  for (int i = 0; i < 3000; ++i) {
    const std::string key = "vllm@m@1@0@" + std::to_string(i) + "@bfloat16";
    const size_t owner3 = s3.shard_of(key);
    ++counts[owner3];
    const std::string& server3 = three[owner3];
    const std::string& server2 = two[s2.shard_of(key)];
    // A key whose server survives stays there; only b's keys move.
    if (server3 != "b:1/0") {
      EXPECT_EQ(server2, server3) << key;
    }
    EXPECT_EQ(s3.shard_of(key), owner3);  // deterministic
  }
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_GT(counts[s], 800) << "server " << s;  // roughly a third each
    EXPECT_LT(counts[s], 1200) << "server " << s;
  }
  EXPECT_THROW(RendezvousSharding(std::vector<std::string>{}), InvalidArgument);
}

}  // namespace
}  // namespace hss::detail
