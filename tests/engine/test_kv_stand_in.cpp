#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "hss/cache_key.hpp"
#include "hss/error.hpp"
#include "hss/local_cpu_backend.hpp"

namespace {

using hss::CacheEngineKey;
using hss::KvStats;
using hss::LocalCpuBackend;

CacheEngineKey key_of(uint64_t hash, int64_t worker = 0) {
  CacheEngineKey key;
  key.model_name = "test-model";
  key.worker_id = worker;
  key.chunk_hash = hash;
  return key;
}

// Bytes that depend on the key and the position, so a chunk returned for the wrong key or with
// shifted contents cannot match by accident.
std::vector<std::byte> payload(uint64_t hash, size_t size, uint64_t salt = 0) {
  std::vector<std::byte> bytes(size);
  uint64_t state = hash * 0x9E3779B97F4A7C15ULL + salt * 0xBF58476D1CE4E5B9ULL + 1;
  for (size_t i = 0; i < size; ++i) {
    state ^= state >> 31;
    state *= 0x94D049BB133111EBULL;
    bytes[i] = static_cast<std::byte>(state >> 56);
  }
  return bytes;
}

std::vector<uint64_t> lru_hashes(const LocalCpuBackend& backend) {
  std::vector<uint64_t> hashes;
  for (const CacheEngineKey& key : backend.keys_lru_order()) hashes.push_back(key.chunk_hash);
  return hashes;
}

// Gets the chunk and checks it byte for byte against the expected contents.
void expect_chunk(LocalCpuBackend& backend, const CacheEngineKey& key,
                  const std::vector<std::byte>& expected) {
  std::vector<std::byte> out(expected.size() + 8, std::byte{0xEE});
  const std::optional<size_t> got = backend.get(key, out);
  ASSERT_TRUE(got.has_value()) << "chunk " << key.chunk_hash << " missing";
  ASSERT_EQ(*got, expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(out[i], expected[i]) << "chunk " << key.chunk_hash << " differs at byte " << i;
  }
  // Bytes past the chunk are not written.
  for (size_t i = expected.size(); i < out.size(); ++i) ASSERT_EQ(out[i], std::byte{0xEE});
}

TEST(LocalCpuBackend, ZeroCapacityIsInvalidArgument) {
  try {
    LocalCpuBackend backend(0);
    FAIL() << "expected hss::InvalidArgument";
  } catch (const hss::InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("capacity_bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find('0'), std::string::npos) << msg;
  }
}

TEST(LocalCpuBackend, PutGetRoundTrip) {
  LocalCpuBackend backend(1 << 20);
  const auto a = payload(1, 1000);
  const auto b = payload(2, 4096);
  ASSERT_TRUE(backend.put(key_of(1), a));
  ASSERT_TRUE(backend.put(key_of(2), b));
  expect_chunk(backend, key_of(1), a);
  expect_chunk(backend, key_of(2), b);
  EXPECT_EQ(backend.size_of(key_of(1)), std::optional<size_t>(1000));
  EXPECT_EQ(backend.size_of(key_of(2)), std::optional<size_t>(4096));
  EXPECT_FALSE(backend.size_of(key_of(3)).has_value());

  std::vector<std::byte> out(16);
  EXPECT_FALSE(backend.get(key_of(3), out).has_value());
}

TEST(LocalCpuBackend, PutCopiesTheInput) {
  LocalCpuBackend backend(1024);
  auto data = payload(1, 64);
  const auto original = data;
  ASSERT_TRUE(backend.put(key_of(1), data));
  data.assign(data.size(), std::byte{0});
  expect_chunk(backend, key_of(1), original);
}

TEST(LocalCpuBackend, KeysDifferingOnlyInIdentityAreDistinct) {
  LocalCpuBackend backend(1024);
  const auto w0 = payload(7, 32, 0);
  const auto w1 = payload(7, 32, 1);
  ASSERT_TRUE(backend.put(key_of(7, 0), w0));
  ASSERT_TRUE(backend.put(key_of(7, 1), w1));
  CacheEngineKey other_dtype = key_of(7, 0);
  other_dtype.kv_dtype = "float16";
  EXPECT_FALSE(backend.contains(other_dtype));
  expect_chunk(backend, key_of(7, 0), w0);
  expect_chunk(backend, key_of(7, 1), w1);
}

TEST(LocalCpuBackend, EmptyChunk) {
  LocalCpuBackend backend(16);
  ASSERT_TRUE(backend.put(key_of(1), std::span<const std::byte>{}));
  EXPECT_TRUE(backend.contains(key_of(1)));
  std::vector<std::byte> none;
  EXPECT_EQ(backend.get(key_of(1), none), std::optional<size_t>(0));
  EXPECT_EQ(backend.stats().bytes_held, 0u);
}

TEST(LocalCpuBackend, GetIntoTooSmallBufferThrowsAndChangesNothing) {
  LocalCpuBackend backend(1024);
  ASSERT_TRUE(backend.put(key_of(1), payload(1, 100)));
  ASSERT_TRUE(backend.put(key_of(2), payload(2, 100)));
  const KvStats before = backend.stats();
  std::vector<std::byte> small(99);
  try {
    (void)backend.get(key_of(1), small);
    FAIL() << "expected hss::InvalidArgument";
  } catch (const hss::InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out"), std::string::npos) << msg;
    EXPECT_NE(msg.find("99"), std::string::npos) << msg;
    EXPECT_NE(msg.find("100"), std::string::npos) << msg;
  }
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(backend.stats().hits, before.hits);
  EXPECT_EQ(backend.stats().misses, before.misses);
}

TEST(LocalCpuBackend, ReplaceUpdatesContentsSizeAndRecency) {
  LocalCpuBackend backend(1000);
  ASSERT_TRUE(backend.put(key_of(1), payload(1, 300)));
  ASSERT_TRUE(backend.put(key_of(2), payload(2, 300)));
  const auto replacement = payload(1, 500, /*salt=*/9);
  ASSERT_TRUE(backend.put(key_of(1), replacement));
  EXPECT_EQ(backend.size_of(key_of(1)), std::optional<size_t>(500));
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{2, 1}));
  const KvStats s = backend.stats();
  EXPECT_EQ(s.chunks_held, 2u);
  EXPECT_EQ(s.bytes_held, 800u);
  EXPECT_EQ(s.evictions, 0u);
  expect_chunk(backend, key_of(1), replacement);
}

TEST(LocalCpuBackend, ReplaceInFullPoolDoesNotEvictNeighbours) {
  LocalCpuBackend backend(300);
  for (uint64_t h = 1; h <= 3; ++h) ASSERT_TRUE(backend.put(key_of(h), payload(h, 100)));
  // The pool is full; the new version of 1 fits in the space of the old one.
  ASSERT_TRUE(backend.put(key_of(1), payload(1, 100, 5)));
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{2, 3, 1}));
  EXPECT_EQ(backend.stats().evictions, 0u);
  expect_chunk(backend, key_of(1), payload(1, 100, 5));
}

TEST(LocalCpuBackend, Remove) {
  LocalCpuBackend backend(1000);
  ASSERT_TRUE(backend.put(key_of(1), payload(1, 100)));
  ASSERT_TRUE(backend.put(key_of(2), payload(2, 200)));
  EXPECT_TRUE(backend.remove(key_of(1)));
  EXPECT_FALSE(backend.remove(key_of(1)));
  EXPECT_FALSE(backend.contains(key_of(1)));
  EXPECT_FALSE(backend.size_of(key_of(1)).has_value());
  std::vector<std::byte> out(100);
  EXPECT_FALSE(backend.get(key_of(1), out).has_value());
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{2}));
  EXPECT_EQ(backend.stats().bytes_held, 200u);
  EXPECT_EQ(backend.stats().chunks_held, 1u);
  expect_chunk(backend, key_of(2), payload(2, 200));
  EXPECT_FALSE(backend.remove(key_of(99)));
}

TEST(LocalCpuBackend, ContainsAndSizeOfDoNotTouchLru) {
  LocalCpuBackend backend(1000);
  for (uint64_t h = 1; h <= 3; ++h) ASSERT_TRUE(backend.put(key_of(h), payload(h, 10)));
  EXPECT_TRUE(backend.contains(key_of(1)));
  EXPECT_TRUE(backend.size_of(key_of(1)).has_value());
  EXPECT_FALSE(backend.contains(key_of(4)));
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{1, 2, 3}));
  // And so, under pressure, 1 is still the first (and only) one to go.
  ASSERT_TRUE(backend.put(key_of(4), payload(4, 980)));
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{2, 3, 4}));
}

TEST(LocalCpuBackend, GetRefreshesLru) {
  LocalCpuBackend backend(1000);
  for (uint64_t h = 1; h <= 4; ++h) ASSERT_TRUE(backend.put(key_of(h), payload(h, 10)));
  expect_chunk(backend, key_of(2), payload(2, 10));
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{1, 3, 4, 2}));
  expect_chunk(backend, key_of(1), payload(1, 10));
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{3, 4, 2, 1}));
  // A miss changes no order.
  std::vector<std::byte> out(10);
  EXPECT_FALSE(backend.get(key_of(9), out).has_value());
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{3, 4, 2, 1}));
}

TEST(LocalCpuBackend, EvictsLeastRecentlyUsedFirst) {
  LocalCpuBackend backend(400);
  for (uint64_t h = 1; h <= 4; ++h) ASSERT_TRUE(backend.put(key_of(h), payload(h, 100)));
  expect_chunk(backend, key_of(1), payload(1, 100));  // order now 2 3 4 1

  // One chunk's room is needed: exactly 2 goes.
  ASSERT_TRUE(backend.put(key_of(5), payload(5, 100)));
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{3, 4, 1, 5}));
  EXPECT_FALSE(backend.contains(key_of(2)));
  EXPECT_EQ(backend.stats().evictions, 1u);

  // 250 bytes need three victims in order: 3, 4, 1.
  ASSERT_TRUE(backend.put(key_of(6), payload(6, 250)));
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{5, 6}));
  for (uint64_t gone : {1, 2, 3, 4}) EXPECT_FALSE(backend.contains(key_of(gone))) << gone;
  const KvStats s = backend.stats();
  EXPECT_EQ(s.evictions, 4u);
  EXPECT_EQ(s.bytes_held, 350u);
  EXPECT_EQ(s.chunks_held, 2u);
  expect_chunk(backend, key_of(5), payload(5, 100));
  expect_chunk(backend, key_of(6), payload(6, 250));
}

TEST(LocalCpuBackend, ChunkLargerThanCapacityFailsAndChangesNothing) {
  LocalCpuBackend backend(256);
  ASSERT_TRUE(backend.put(key_of(1), payload(1, 100)));
  ASSERT_TRUE(backend.put(key_of(2), payload(2, 100)));
  EXPECT_FALSE(backend.put(key_of(3), payload(3, 257)));
  // Not even an existing entry under the same key is dropped.
  EXPECT_FALSE(backend.put(key_of(1), payload(1, 1000)));
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{1, 2}));
  expect_chunk(backend, key_of(1), payload(1, 100));
  const KvStats s = backend.stats();
  EXPECT_EQ(s.put_failures, 2u);
  EXPECT_EQ(s.puts, 2u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.bytes_held, 200u);
  EXPECT_FALSE(backend.contains(key_of(3)));
}

TEST(LocalCpuBackend, ChunkOfExactlyCapacityFits) {
  LocalCpuBackend backend(256);
  ASSERT_TRUE(backend.put(key_of(1), payload(1, 100)));
  ASSERT_TRUE(backend.put(key_of(2), payload(2, 256)));
  EXPECT_EQ(lru_hashes(backend), (std::vector<uint64_t>{2}));
  expect_chunk(backend, key_of(2), payload(2, 256));
}

TEST(LocalCpuBackend, CapacityOfExactlyNChunksHoldsN) {
  constexpr size_t kChunk = 4096;
  constexpr uint64_t kN = 8;
  LocalCpuBackend backend(kChunk * kN);
  for (uint64_t h = 0; h < kN; ++h) ASSERT_TRUE(backend.put(key_of(h), payload(h, kChunk)));
  KvStats s = backend.stats();
  EXPECT_EQ(s.chunks_held, kN);
  EXPECT_EQ(s.bytes_held, kChunk * kN);
  EXPECT_EQ(s.evictions, 0u);
  for (uint64_t h = 0; h < kN; ++h) expect_chunk(backend, key_of(h), payload(h, kChunk));
  // One more evicts exactly the least recent one (0, as the gets above ran in order).
  ASSERT_TRUE(backend.put(key_of(kN), payload(kN, kChunk)));
  s = backend.stats();
  EXPECT_EQ(s.chunks_held, kN);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_FALSE(backend.contains(key_of(0)));
  for (uint64_t h = 1; h <= kN; ++h) EXPECT_TRUE(backend.contains(key_of(h))) << h;
}

TEST(LocalCpuBackend, StatsCounters) {
  LocalCpuBackend backend(300);
  KvStats s = backend.stats();
  EXPECT_EQ(s.capacity_bytes, 300u);
  EXPECT_EQ(s.chunks_held, 0u);
  EXPECT_EQ(s.bytes_held, 0u);
  EXPECT_EQ(s.puts, 0u);
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.put_failures, 0u);

  ASSERT_TRUE(backend.put(key_of(1), payload(1, 100)));
  ASSERT_TRUE(backend.put(key_of(2), payload(2, 100)));
  ASSERT_TRUE(backend.put(key_of(3), payload(3, 100)));
  ASSERT_TRUE(backend.put(key_of(4), payload(4, 100)));  // evicts 1
  EXPECT_FALSE(backend.put(key_of(5), payload(5, 301)));
  std::vector<std::byte> out(100);
  EXPECT_TRUE(backend.get(key_of(2), out).has_value());
  EXPECT_TRUE(backend.get(key_of(3), out).has_value());
  EXPECT_FALSE(backend.get(key_of(1), out).has_value());
  (void)backend.contains(key_of(4));  // not a hit
  (void)backend.size_of(key_of(4));   // not a hit
  EXPECT_TRUE(backend.remove(key_of(4)));

  s = backend.stats();
  EXPECT_EQ(s.capacity_bytes, 300u);
  EXPECT_EQ(s.chunks_held, 2u);
  EXPECT_EQ(s.bytes_held, 200u);
  EXPECT_EQ(s.puts, 4u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.put_failures, 1u);
}

TEST(LocalCpuBackend, UsableThroughStorageManager) {
  LocalCpuBackend backend(64);
  const hss::StorageManager& manager = backend;
  ASSERT_TRUE(backend.put(key_of(1), payload(1, 8)));
  EXPECT_TRUE(manager.contains(key_of(1)));
  EXPECT_FALSE(manager.contains(key_of(2)));
}

// Sizes vary per key so evictions free uneven amounts; contents are a function of the key, so
// any chunk read back, whoever wrote it, must match exactly.
size_t threaded_size(uint64_t hash) { return 512 + (hash * 37) % 1536; }

TEST(LocalCpuBackend, ConcurrentPutGetRemove) {
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 2000;
  constexpr uint64_t kKeys = 64;
  // Room for about a third of the keys, so puts keep evicting while others copy out.
  constexpr uint64_t kCapacity = 24 * 1024;
  LocalCpuBackend backend(kCapacity);

  std::vector<std::vector<std::byte>> expected(kKeys);
  for (uint64_t h = 0; h < kKeys; ++h) expected[h] = payload(h, threaded_size(h));

  std::atomic<uint64_t> gets{0};
  std::atomic<uint64_t> found{0};
  std::atomic<uint64_t> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::vector<std::byte> out(2048);
      for (int i = 0; i < kOpsPerThread; ++i) {
        const uint64_t h = rng() % kKeys;
        const int op = static_cast<int>(rng() % 10);
        if (op < 4) {
          if (!backend.put(key_of(h), expected[h])) bad.fetch_add(1);
        } else if (op < 9) {
          gets.fetch_add(1);
          std::fill(out.begin(), out.end(), std::byte{0});
          const std::optional<size_t> got = backend.get(key_of(h), out);
          if (!got) continue;
          found.fetch_add(1);
          if (*got != expected[h].size() ||
              !std::equal(expected[h].begin(), expected[h].end(), out.begin())) {
            bad.fetch_add(1);
          }
        } else {
          (void)backend.remove(key_of(h));
        }
        if (i % 256 == 0) {
          const KvStats s = backend.stats();
          if (s.bytes_held > kCapacity) bad.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();

  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(found.load(), 0u);
  const KvStats s = backend.stats();
  EXPECT_EQ(s.hits, found.load());
  EXPECT_EQ(s.hits + s.misses, gets.load());
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.put_failures, 0u);
  EXPECT_LE(s.bytes_held, kCapacity);

  // The index, the LRU list and the byte count still agree, and every survivor is intact.
  const std::vector<CacheEngineKey> keys = backend.keys_lru_order();
  EXPECT_EQ(keys.size(), s.chunks_held);
  uint64_t bytes = 0;
  for (const CacheEngineKey& key : keys) {
    ASSERT_LT(key.chunk_hash, kKeys);
    bytes += expected[key.chunk_hash].size();
    expect_chunk(backend, key, expected[key.chunk_hash]);
  }
  EXPECT_EQ(bytes, s.bytes_held);
}

}  // namespace
