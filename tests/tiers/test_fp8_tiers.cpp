// FP8 storage (hidden_state_storage_dtype fp8_e4m3 / fp8_e5m2) through the backing tiers: an
// entry's codes and float32 row scales are written to the disk tier and to Redis as one value
// (wire code 3 or 4), a restarted store re-indexes and promotes them with their format, and a
// retrieve dequantises a promoted entry bit-identically to the same entry read from the pool that
// stored it, into every output dtype. A value whose format code no build writes is a counted miss.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "format/value_codec.hpp"
#include "hss/hss.hpp"
#include "test_util.hpp"
#include "tier_test_dir.hpp"
#include "tiers/disk/disk_tier.hpp"

#if HSS_HAVE_REMOTE
#include "redis_test_server.hpp"
#endif

namespace hss {
namespace {

namespace fs = std::filesystem;
using test::make_tokens;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;
// One FP8 chunk: 512 codes (a multiple of 16) + 16 float32 scales.
constexpr uint64_t kFp8Payload = kChunk * kCols + 4 * kChunk;
static_assert(kFp8Payload % 64 == 0);

using test::TempDir;

/// A store of FP8 storage whose pool holds `pool_chunks` FP8 chunks exactly (one granule each).
Config fp8_config(StorageDType storage, int64_t pool_chunks) {
  Config c = test::store_config(kChunk, kCols, 1);
  c.hidden_state_storage_dtype = storage;
  c.hidden_state_block_bytes = static_cast<int64_t>(kFp8Payload);
  c.max_hidden_state_cpu_size =
      static_cast<double>(kFp8Payload * static_cast<uint64_t>(pool_chunks)) /
      static_cast<double>(1ULL << 30);
  return c;
}

/// rows x kCols of normal(0, 1) values times a per-row magnitude spanning 1e-3 .. 1e3, so every
/// row has its own scale.
constexpr int kMaxExponent = 3;
std::vector<float> scaled_rows(int64_t rows, uint32_t seed) {
  return test::scaled_rows(rows, kCols, seed, kMaxExponent);
}

/// The rows a retrieve writes into an output of `dtype` (empty on a miss).
std::vector<std::byte> read_as(HiddenStateStore& store, const std::vector<int32_t>& tokens,
                               DType dtype) {
  const auto rows = static_cast<int64_t>(tokens.size());
  std::vector<std::byte> out(static_cast<size_t>(rows * kCols) * element_size(dtype));
  const MutableTensorView view{out.data(), dtype, rows, kCols, 0, Device::kHost, 0};
  const int64_t got = store.retrieve_hidden_states_into(tokens, view);
  if (got != rows) return {};
  return out;
}

constexpr DType kOutputs[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

/// What a store that never spilled serves for (tokens, x): the reference of every promoted read.
std::vector<std::vector<std::byte>> host_hits(StorageDType storage,
                                              const std::vector<int32_t>& tokens,
                                              const std::vector<float>& x) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(fp8_config(storage, 64), db);
  EXPECT_EQ(store.store_hidden_states(tokens, test::view_of(x, kCols)).cached,
            static_cast<int64_t>(tokens.size()) / kChunk);
  std::vector<std::vector<std::byte>> out;
  for (const DType dtype : kOutputs) out.push_back(read_as(store, tokens, dtype));
  return out;
}

void expect_host_hits(HiddenStateStore& store, const std::vector<int32_t>& tokens,
                      const std::vector<std::vector<std::byte>>& expected) {
  for (size_t i = 0; i < std::size(kOutputs); ++i) {
    const auto got = read_as(store, tokens, kOutputs[i]);
    ASSERT_EQ(got.size(), expected[i].size()) << "output " << to_string(kOutputs[i]);
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(std::memcmp(got.data(), expected[i].data(), got.size()), 0)
        << "output " << to_string(kOutputs[i]) << " differs from the host-pool hit";
  }
}

uint8_t code_of(StorageDType storage) { return storage == StorageDType::kFp8E5M2 ? 4 : 3; }

class Fp8DiskTier : public ::testing::TestWithParam<StorageDType> {};

TEST_P(Fp8DiskTier, SpilledRestartedAndPromotedEntriesReadAsTheHostPoolHit) {
  const StorageDType storage = GetParam();
  const TempDir dir;
  ChunkedTokenDatabase db(kChunk, false);
  const auto a = make_tokens(4 * kChunk, 31);
  const auto b = make_tokens(4 * kChunk, 32);
  const auto xa = scaled_rows(4 * kChunk, 31);
  const auto xb = scaled_rows(4 * kChunk, 32);
  const auto expected_a = host_hits(storage, a, xa);
  const auto expected_b = host_hits(storage, b, xb);
  // The host-pool hit is the FP8 rows dequantised: not the input (lossy), but close to it.
  {
    std::vector<float> f32(xa.size());
    std::memcpy(f32.data(), expected_a[0].data(), expected_a[0].size());
    EXPECT_NE(std::memcmp(f32.data(), xa.data(), expected_a[0].size()), 0);
    for (size_t i = 0; i < xa.size(); ++i) {
      const auto r = static_cast<int64_t>(i) / kCols;
      const double amax = 4.0 * std::pow(10.0, test::row_exponent(r, kMaxExponent));  // generous
      ASSERT_LE(std::fabs(f32[i] - xa[i]), amax / 2) << i;
    }
  }

  Config config = fp8_config(storage, 4);  // room for one prompt
  config.local_disk = dir.root;
  {
    HiddenStateStore store(config, db);
    ASSERT_EQ(store.store_hidden_states(a, test::view_of(xa, kCols)).cached, 4);
    store.flush();  // a's writes landed: its granules are no longer pinned by the queue
    ASSERT_EQ(store.store_hidden_states(b, test::view_of(xb, kCols)).cached, 4);  // evicts a
    store.flush();
    const TierStats disk = store.stats().tiers.at(0);
    EXPECT_EQ(disk.writes_done, 8U);
    EXPECT_EQ(disk.bytes_written, 8 * kFp8Payload);  // codes and scales, nothing else
    EXPECT_EQ(disk.entries_held, 8U);
    EXPECT_EQ(disk.bytes_held, 8 * (detail::kRemoteHeaderBytes + kFp8Payload));
    // a is gone from the pool and comes back from disk, in its format, within this retrieve.
    expect_host_hits(store, a, expected_a);
    EXPECT_EQ(store.stats().tiers.at(0).promotions, 4U);
    EXPECT_EQ(store.stats().bytes_held, 4 * kFp8Payload);  // a promoted as FP8, b evicted
    store.check_invariants();
  }
  // Each file: the header naming the format, then the codes and scales.
  const auto chunks = db.process_tokens(std::span<const int32_t>(a));
  const std::string path =
      dir.values() + "/" +
      detail::DiskTier::file_name(chunks[0].key, Slot{ActivationKind::kHidden, 0});
  ASSERT_EQ(fs::file_size(path), detail::kRemoteHeaderBytes + kFp8Payload);
  {
    std::ifstream f(path, std::ios::binary);
    char header[8] = {};
    ASSERT_TRUE(f.read(header, sizeof header));
    EXPECT_EQ(std::string(header, 4), "HSSR");
    EXPECT_EQ(static_cast<uint8_t>(header[6]), code_of(storage));
  }

  // A restarted store re-indexes the directory and serves both prompts as the host pool did.
  {
    HiddenStateStore restarted(config, db);
    EXPECT_EQ(restarted.stats().tiers.at(0).entries_held, 8U);
    EXPECT_EQ(restarted.num_entries(), 0U);
    expect_host_hits(restarted, b, expected_b);
    expect_host_hits(restarted, a, expected_a);
    const TierStats s = restarted.stats().tiers.at(0);
    EXPECT_EQ(s.corrupt_values, 0U);
    EXPECT_EQ(s.promotions, 8U);
    restarted.check_invariants();
  }

  // A store of lossless storage on the same directory reads the FP8 values in their format too.
  Config lossless = test::store_config(kChunk, kCols, 16);
  lossless.local_disk = dir.root;
  HiddenStateStore other(lossless, db);
  expect_host_hits(other, a, expected_a);
}

TEST_P(Fp8DiskTier, AnUnknownFormatCodeOnDiskIsACountedMissNeverServed) {
  const StorageDType storage = GetParam();
  const TempDir dir;
  ChunkedTokenDatabase db(kChunk, false);
  const auto tokens = make_tokens(2 * kChunk, 41);
  const auto x = scaled_rows(2 * kChunk, 41);
  Config config = fp8_config(storage, 8);
  config.local_disk = dir.root;
  {
    HiddenStateStore store(config, db);
    ASSERT_EQ(store.store_hidden_states(tokens, test::view_of(x, kCols)).cached, 2);
  }
  const auto chunks = db.process_tokens(std::span<const int32_t>(tokens));
  const std::string path =
      dir.values() + "/" +
      detail::DiskTier::file_name(chunks[1].key, Slot{ActivationKind::kHidden, 0});
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f);
    f.seekp(6);
    const char code = 9;  // no build writes it
    f.write(&code, 1);
  }
  HiddenStateStore restarted(config, db);
  // Prefix-strict: chunk 0 alone, never chunk 1 read as some other type.
  const auto got = restarted.retrieve_hidden_states(tokens);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->rows(), kChunk);
  const TierStats s = restarted.stats().tiers.at(0);
  EXPECT_EQ(s.hits, 1U);
  EXPECT_EQ(s.corrupt_values, 1U);
  EXPECT_EQ(s.misses, 1U);
  EXPECT_FALSE(fs::exists(path));  // a rejected file is deleted
  EXPECT_EQ(restarted.num_entries(), 1U);
  restarted.check_invariants();
}

INSTANTIATE_TEST_SUITE_P(Storage, Fp8DiskTier,
                         ::testing::Values(StorageDType::kFp8E4M3, StorageDType::kFp8E5M2),
                         [](const auto& param_info) {
                           return std::string(to_string(param_info.param));
                         });

#if HSS_HAVE_REMOTE

TEST(Fp8RemoteTier, FreshStoresReadTheRedisValuesAsTheWritersHostPoolHit) {
  HSS_REQUIRE_REDIS();
  test::RedisTestServer server;
  ChunkedTokenDatabase db(kChunk, false);
  const auto tokens = make_tokens(4 * kChunk, 51);
  const auto x = scaled_rows(4 * kChunk, 51);
  const auto expected = host_hits(StorageDType::kFp8E4M3, tokens, x);

  Config config = fp8_config(StorageDType::kFp8E4M3, 8);
  config.hidden_state_remote_url = {server.url()};
  config.hidden_state_remote_timeout_ms = 500;
  {
    HiddenStateStore writer(config, db);
    ASSERT_EQ(writer.store_hidden_states(tokens, test::view_of(x, kCols)).cached, 4);
    writer.flush();
    EXPECT_EQ(writer.stats().tiers.at(0).writes_done, 4U);
    EXPECT_EQ(writer.stats().tiers.at(0).bytes_written, 4 * kFp8Payload);
  }
  const auto chunks = db.process_tokens(std::span<const int32_t>(tokens));
  const std::string key = detail::remote_key(chunks[0].key, "hidden", 0);
  const auto value = server.get(key);
  ASSERT_TRUE(value.has_value());
  ASSERT_EQ(value->size(), detail::kRemoteHeaderBytes + kFp8Payload);
  EXPECT_EQ(static_cast<uint8_t>((*value)[6]), 3);

  test::ControlledKv kv;
  {
    HiddenStateStore reader(config, db);
    reader.bind_storage_manager(&kv);
    EXPECT_EQ(reader.coverage(chunks, std::vector<int64_t>{0}, CoverageScope::kAllTiers),
              4 * kChunk);
    expect_host_hits(reader, tokens, expected);
    EXPECT_EQ(reader.stats().tiers.at(0).promotions, 4U);
    EXPECT_EQ(reader.stats().bytes_held, 4 * kFp8Payload);
  }
  {
    // A float32 store sharing the server takes the FP8 values as they are.
    Config lossless = test::store_config(kChunk, kCols, 16);
    lossless.hidden_state_remote_url = {server.url()};
    lossless.hidden_state_remote_timeout_ms = 500;
    HiddenStateStore reader(lossless, db);
    reader.bind_storage_manager(&kv);
    expect_host_hits(reader, tokens, expected);
  }

  // A value whose format code no build writes: a counted corrupt miss, the prefix stops there.
  std::string bad = *value;
  bad[6] = static_cast<char>(7);
  ASSERT_TRUE(server.set(key, bad));
  HiddenStateStore reader(config, db);
  reader.bind_storage_manager(&kv);
  EXPECT_FALSE(reader.retrieve_hidden_states(tokens).has_value());
  const TierStats s = reader.stats().tiers.at(0);
  EXPECT_GE(s.corrupt_values, 1U);
  EXPECT_EQ(reader.num_entries(), 3U);  // chunks 1..3 promoted; the walk stops at chunk 0
}

#endif  // HSS_HAVE_REMOTE

}  // namespace
}  // namespace hss
