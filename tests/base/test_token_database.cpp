// Chunk keys: determinism, the prefix property, partial chunks, engine-provided hashes.
#include <gtest/gtest.h>

#include <xxhash.h>

#include <fstream>
#include <limits>
#include <string>

#include "hss/config.hpp"
#include "hss/error.hpp"
#include "hss/token_database.hpp"
#include "test_util.hpp"
#include "tier_test_dir.hpp"

namespace hss {
namespace {

TEST(TokenDatabase, OneChunkPerFullChunkAndNoPartialByDefault) {
  ChunkedTokenDatabase db(256, false);
  const auto chunks = db.process_tokens(test::make_tokens(1000, 1));
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].start, 0);
  EXPECT_EQ(chunks[0].end, 256);
  EXPECT_EQ(chunks[2].start, 512);
  EXPECT_EQ(chunks[2].end, 768);
}

TEST(TokenDatabase, PartialChunkOnlyWithSaveUnfullChunk) {
  ChunkedTokenDatabase db(256, true);
  const auto chunks = db.process_tokens(test::make_tokens(1000, 1));
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[3].start, 768);
  EXPECT_EQ(chunks[3].end, 1000);
  EXPECT_EQ(chunks[3].size(), 232);
}

TEST(TokenDatabase, HashIsXxh3OfLittleEndianUint32ChainedBySeed) {
  ChunkedTokenDatabase db(4, false);
  const std::vector<int32_t> tokens{1, 2, 3, 4, 5, 6, 7, 8};
  const auto chunks = db.process_tokens(tokens);
  ASSERT_EQ(chunks.size(), 2u);
  const uint32_t first[4] = {1, 2, 3, 4};
  const uint32_t second[4] = {5, 6, 7, 8};
  const uint64_t h0 = XXH3_64bits_withSeed(first, sizeof first, ChunkedTokenDatabase::kRootSeed);
  EXPECT_EQ(chunks[0].key.chunk_hash, h0);
  EXPECT_EQ(chunks[1].key.chunk_hash, XXH3_64bits_withSeed(second, sizeof second, h0));
}

TEST(TokenDatabase, DeterministicAcrossInstancesAndTokenWidths) {
  Metadata m;
  m.model_name = "Qwen/Qwen2.5-Omni-7B";
  ChunkedTokenDatabase a(16, true, m), b(16, true, m);
  const auto tokens = test::make_tokens(100, 7);
  const std::vector<int64_t> wide(tokens.begin(), tokens.end());
  const auto ka = a.process_tokens(tokens);
  const auto kb = b.process_tokens(std::span<const int64_t>(wide));
  ASSERT_EQ(ka.size(), kb.size());
  for (size_t i = 0; i < ka.size(); ++i) EXPECT_EQ(ka[i].key, kb[i].key);
}

TEST(TokenDatabase, ChangingOneTokenChangesThatChunkAndEveryLaterOneOnly) {
  ChunkedTokenDatabase db(16, false);
  auto tokens = test::make_tokens(5 * 16, 3);
  const auto before = db.process_tokens(tokens);
  tokens[2 * 16 + 5] += 1;
  const auto after = db.process_tokens(tokens);
  ASSERT_EQ(before.size(), after.size());
  EXPECT_EQ(before[0].key, after[0].key);
  EXPECT_EQ(before[1].key, after[1].key);
  for (size_t i = 2; i < before.size(); ++i) EXPECT_NE(before[i].key, after[i].key) << i;
}

TEST(TokenDatabase, KeyCarriesMetadataAndFormatsLikeLmcache) {
  Metadata m{"vllm", "llama", 2, 1, "bfloat16"};
  ChunkedTokenDatabase db(4, false, m);
  const auto chunks = db.process_tokens(std::vector<int32_t>{0, 1, 2, 3});
  const CacheEngineKey& key = chunks.at(0).key;
  EXPECT_EQ(key.model_name, "llama");
  EXPECT_EQ(key.world_size, 2);
  EXPECT_EQ(key.worker_id, 1);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key.chunk_hash));
  EXPECT_EQ(key.to_string(), std::string("vllm@llama@2@1@") + hex + "@bfloat16");
  CacheEngineKey other = key;
  other.worker_id = 0;
  EXPECT_NE(key, other);
}

TEST(TokenDatabase, TokensOutsideUint32AreRejected) {
  ChunkedTokenDatabase db(4, false);
  EXPECT_THROW((void)db.process_tokens(std::vector<int32_t>{1, -1, 2, 3}), InvalidArgument);
  EXPECT_THROW((void)db.process_tokens(std::vector<int64_t>{1, 2, int64_t{1} << 32, 3}),
               InvalidArgument);
  const auto ok = db.process_tokens(std::vector<int64_t>{1, 2, int64_t{UINT32_MAX}, 3});
  EXPECT_EQ(ok.size(), 1u);
}

TEST(TokenDatabase, TheFirstIdOutsideUint32IsNamedWhereverItIs) {
  // The range check ORs the ids' high bits over the list, then looks for the first bad one:
  // every kind of bad id is caught, in a long list too, and the message names the first.
  ChunkedTokenDatabase db(256, true);
  const auto message = [&](const auto& tokens) -> std::string {
    try {
      (void)db.process_tokens(tokens);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no InvalidArgument";
  };
  std::vector<int64_t> wide(10000, 7);
  wide[9999] = -1;
  wide[5003] = std::numeric_limits<int64_t>::min();
  wide[7000] = int64_t{1} << 40;
  EXPECT_NE(message(wide).find("token_ids[5003] = -9223372036854775808"), std::string::npos)
      << message(wide);
  wide[5003] = int64_t{UINT32_MAX} + 1;
  EXPECT_NE(message(wide).find("token_ids[5003] = 4294967296"), std::string::npos);
  std::vector<int32_t> narrow(1000, 3);
  narrow[999] = std::numeric_limits<int32_t>::min();
  narrow[998] = std::numeric_limits<int32_t>::max();  // in range
  EXPECT_NE(message(narrow).find("token_ids[999] = -2147483648"), std::string::npos);
  narrow[999] = 0;
  EXPECT_EQ(db.process_tokens(narrow).size(), 4U);  // 3 full chunks of 256 and the rest
  std::vector<int64_t> top(300, int64_t{UINT32_MAX});
  EXPECT_EQ(db.process_tokens(top).size(), 2U);
}

TEST(TokenDatabase, ChunkSizeMustBePositive) {
  EXPECT_THROW(ChunkedTokenDatabase(0, false), InvalidArgument);
}

TEST(TokenDatabase, ProcessHashesUsesEngineHashesAndOffsets) {
  ChunkedTokenDatabase db(16, false, Metadata{"vllm", "m", 1, 0, "float16"});
  const std::vector<uint64_t> hashes{11, 22, 33};
  // LMCache's meaning: offsets[i] is the token count of chunk i.
  const std::vector<int64_t> offsets{16, 16, 8};
  const auto chunks = db.process_hashes(hashes, offsets);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[1].start, 16);
  EXPECT_EQ(chunks[1].end, 32);
  EXPECT_EQ(chunks[2].size(), 8);
  EXPECT_EQ(chunks[2].key.chunk_hash, 33u);
  EXPECT_EQ(chunks[2].key.kv_dtype, "float16");
  EXPECT_THROW((void)db.process_hashes(hashes, std::vector<int64_t>{16, 16}), InvalidArgument);
  EXPECT_THROW((void)db.process_hashes(hashes, std::vector<int64_t>{16, 0, 8}), InvalidArgument);
  EXPECT_THROW((void)db.process_hashes(hashes, std::vector<int64_t>{16, -4, 8}), InvalidArgument);
}

TEST(TokenDatabase, ProcessHashesAcceptsLmcacheTokenCounts) {
  // The input LMCache's own tests pass: chunks of 8, 8 and 4 tokens.
  ChunkedTokenDatabase db(8, true);
  const std::vector<uint64_t> hashes{1, 2, 3};
  const auto chunks = db.process_hashes(hashes, std::vector<int64_t>{8, 8, 4});
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].start, 0);
  EXPECT_EQ(chunks[0].end, 8);
  EXPECT_EQ(chunks[1].start, 8);
  EXPECT_EQ(chunks[1].end, 16);
  EXPECT_EQ(chunks[2].start, 16);
  EXPECT_EQ(chunks[2].end, 20);
}

// hidden_state_chunk_hash_key_file: the chain's root seed comes from a secret, so a client that
// chooses prompts cannot compute their keys (docs/design.md, "Threat model").
TEST(TokenDatabase, AKeyedDatabaseSeedsTheChainFromItsKey) {
  const auto tokens = test::make_tokens(4 * 16, 5);
  const ChunkedTokenDatabase plain(16, false);
  const ChunkedTokenDatabase keyed(16, false, {}, "a deployment secret, 32 bytes..");
  const ChunkedTokenDatabase other(16, false, {}, "another deployment's secret.....");
  EXPECT_FALSE(plain.keyed());
  EXPECT_TRUE(keyed.keyed());
  const auto p = plain.process_tokens(tokens);
  const auto k = keyed.process_tokens(tokens);
  const auto o = other.process_tokens(tokens);
  ASSERT_EQ(k.size(), 4u);
  const uint64_t h0 = XXH3_64bits_withSeed(tokens.data(), 16 * sizeof(int32_t), keyed.root_seed());
  EXPECT_EQ(k[0].key.chunk_hash, h0);  // the same chain, from the key's seed
  EXPECT_EQ(k[1].key.chunk_hash, XXH3_64bits_withSeed(tokens.data() + 16, 16 * 4, h0));
  for (size_t i = 0; i < k.size(); ++i) {
    EXPECT_NE(k[i].key.chunk_hash, p[i].key.chunk_hash) << i;
    EXPECT_NE(k[i].key.chunk_hash, o[i].key.chunk_hash) << i;
  }
  const ChunkedTokenDatabase again(16, false, {}, "a deployment secret, 32 bytes..");
  EXPECT_EQ(again.process_tokens(tokens)[3].key, k[3].key);  // deterministic under one key
  EXPECT_THROW(ChunkedTokenDatabase(16, false, {}, "short"), InvalidArgument);
}

TEST(TokenDatabase, FromConfigReadsTheKeyFileAndRefusesAShortOne) {
  test::TempDir dir;
  const std::string file = dir.root + "/chunk.key";
  std::ofstream(file) << "a deployment secret, 32 bytes..\n";
  Config config;
  config.chunk_size = 16;
  config.save_unfull_chunk = false;
  EXPECT_FALSE(ChunkedTokenDatabase::from_config(config).keyed());
  config.hidden_state_chunk_hash_key_file = file;
  const auto tokens = test::make_tokens(16, 9);
  const ChunkedTokenDatabase direct(16, false, {}, "a deployment secret, 32 bytes..");
  EXPECT_EQ(ChunkedTokenDatabase::from_config(config).process_tokens(tokens)[0].key,
            direct.process_tokens(tokens)[0].key);  // one trailing newline ignored
  std::ofstream(file) << "too short\n";
  EXPECT_THROW((void)ChunkedTokenDatabase::from_config(config), ConfigError);
  config.hidden_state_chunk_hash_key_file = dir.root + "/missing.key";
  EXPECT_THROW((void)ChunkedTokenDatabase::from_config(config), ConfigError);
}

}  // namespace
}  // namespace hss
