#include "hss/token_database.hpp"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

#include "hss/config.hpp"
#include "hss/detail/checked.hpp"
#include "hss/detail/file_reader.hpp"
#include "hss/error.hpp"

namespace hss {

std::string CacheEngineKey::to_string() const {
  char hash_hex[17];
  std::snprintf(hash_hex, sizeof hash_hex, "%016llx", static_cast<unsigned long long>(chunk_hash));
  return fmt + "@" + model_name + "@" + std::to_string(world_size) + "@" +
         std::to_string(worker_id) + "@" + hash_hex + "@" + kv_dtype;
}

namespace {

// Domain separation of the root seed from the key (ASCII "hss-chk1"): the key's other uses
// (none today) would derive differently.
constexpr uint64_t kKeyDomain = 0x6873732d63686b31ULL;

}  // namespace

ChunkedTokenDatabase::ChunkedTokenDatabase(int64_t chunk_size, bool save_unfull_chunk,
                                           Metadata metadata, std::string_view hash_key)
    : chunk_size_(chunk_size),
      save_unfull_chunk_(save_unfull_chunk),
      metadata_(std::move(metadata)) {
  if (chunk_size <= 0 || chunk_size > limits::kMaxChunkSize) {
    throw InvalidArgument("chunk_size must be in [1, 2^20], got " + std::to_string(chunk_size));
  }
  if (!hash_key.empty()) {
    if (hash_key.size() < kMinHashKeyBytes) {
      throw InvalidArgument("hash_key has " + std::to_string(hash_key.size()) +
                            " bytes, at least 16 are needed");
    }
    root_seed_ = XXH3_64bits_withSeed(hash_key.data(), hash_key.size(), kKeyDomain);
    if (root_seed_ == kRootSeed) root_seed_ = kKeyDomain;  // keyed() stays true
  }
}

ChunkedTokenDatabase ChunkedTokenDatabase::from_config(const Config& config, Metadata metadata) {
  const std::string& file = config.hidden_state_chunk_hash_key_file;
  if (file.empty()) {
    return ChunkedTokenDatabase(config.chunk_size, config.save_unfull_chunk, std::move(metadata));
  }
  std::string key;
  try {
    key = detail::read_regular_file(file, "chunk hash key file", 4096);
  } catch (const Error& e) {
    throw ConfigError(std::string("config key 'hidden_state_chunk_hash_key_file': ") + e.what());
  }
  if (!key.empty() && key.back() == '\n') key.pop_back();
  if (key.size() < kMinHashKeyBytes) {
    throw ConfigError("config key 'hidden_state_chunk_hash_key_file': the key in '" + file +
                      "' has " + std::to_string(key.size()) + " bytes, at least " +
                      std::to_string(kMinHashKeyBytes) + " are needed");
  }
  return ChunkedTokenDatabase(config.chunk_size, config.save_unfull_chunk, std::move(metadata),
                              key);
}

CacheEngineKey ChunkedTokenDatabase::make_key(uint64_t chunk_hash) const {
  return CacheEngineKey{metadata_.fmt,       metadata_.model_name, metadata_.world_size,
                        metadata_.worker_id, chunk_hash,           metadata_.kv_dtype};
}

namespace {

static_assert(std::endian::native == std::endian::little,
              "token canonicalisation assumes a little-endian host");

// Token ids are hashed as little-endian uint32. int32 ids are that already (after the sign
// check); int64 ids are narrowed into a small stack buffer per chunk.
template <typename Token>
std::vector<Chunk> chunk_tokens(const ChunkedTokenDatabase& db, std::span<const Token> tokens,
                                bool save_unfull_chunk) {
  const auto n = static_cast<int64_t>(tokens.size());
  // Every id in [0, 2^32): the bits above an id's low 32 (int64) or its sign bit (int32) are
  // OR-ed over the list in a loop the compiler vectorises (a branch per id did not: it was the
  // larger part of a short prompt's key cost); the first bad id is looked for only on a failure.
  using Unsigned = std::make_unsigned_t<Token>;
  constexpr int kHighShift = sizeof(Token) == sizeof(uint32_t) ? 31 : 32;
  Unsigned outside = 0;
  for (const Token token : tokens) outside |= static_cast<Unsigned>(token) >> kHighShift;
  if (outside != 0) [[unlikely]] {
    for (int64_t i = 0; i < n; ++i) {
      const auto t = static_cast<int64_t>(tokens[static_cast<size_t>(i)]);
      if (t < 0 || t > static_cast<int64_t>(UINT32_MAX)) {
        throw InvalidArgument("token_ids[" + std::to_string(i) + "] = " + std::to_string(t) +
                              " is outside [0, 2^32)");
      }
    }
  }
  const int64_t chunk = db.chunk_size();
  const int64_t full = n / chunk;
  const int64_t count = full + ((save_unfull_chunk && n % chunk != 0) ? 1 : 0);
  std::vector<Chunk> chunks;
  chunks.reserve(static_cast<size_t>(count));
  uint64_t seed = db.root_seed();
  // int64 ids narrow into a stack buffer for chunks up to kStackTokens (the common sizes), a
  // heap one beyond.
  constexpr int64_t kStackTokens = 512;
  std::array<uint32_t, kStackTokens> stack_buffer;
  std::vector<uint32_t> heap_buffer;
  for (int64_t c = 0; c < count; ++c) {
    const int64_t start = c * chunk;
    const int64_t end = std::min(n, start + chunk);
    const void* bytes = nullptr;
    if constexpr (sizeof(Token) == sizeof(uint32_t)) {
      bytes = tokens.data() + start;
    } else if (end - start <= kStackTokens) {
      std::copy(tokens.begin() + start, tokens.begin() + end, stack_buffer.begin());
      bytes = stack_buffer.data();
    } else {
      heap_buffer.assign(tokens.begin() + start, tokens.begin() + end);
      bytes = heap_buffer.data();
    }
    seed = XXH3_64bits_withSeed(bytes, static_cast<size_t>(end - start) * sizeof(uint32_t), seed);
    chunks.push_back(Chunk{start, end, db.make_key(seed)});
  }
  return chunks;
}

}  // namespace

std::vector<Chunk> ChunkedTokenDatabase::process_tokens(std::span<const int32_t> tokens) const {
  return chunk_tokens(*this, tokens, save_unfull_chunk_);
}

std::vector<Chunk> ChunkedTokenDatabase::process_tokens(std::span<const int64_t> tokens) const {
  return chunk_tokens(*this, tokens, save_unfull_chunk_);
}

std::vector<Chunk> ChunkedTokenDatabase::process_hashes(std::span<const uint64_t> hashes,
                                                        std::span<const int64_t> counts) const {
  if (hashes.size() != counts.size()) {
    throw InvalidArgument("process_hashes: hashes has " + std::to_string(hashes.size()) +
                          " entries but offsets (token counts) has " +
                          std::to_string(counts.size()));
  }
  std::vector<Chunk> chunks;
  chunks.reserve(hashes.size());
  int64_t start = 0;
  for (size_t i = 0; i < hashes.size(); ++i) {
    // LMCache: offsets[i] is the token count of chunk i, end = start + offsets[i].
    if (counts[i] <= 0 || counts[i] > INT64_MAX - start) {
      throw InvalidArgument("process_hashes: offsets[" + std::to_string(i) +
                            "] = " + std::to_string(counts[i]) +
                            " must be a token count > 0 (the chunk's length)");
    }
    chunks.push_back(Chunk{start, start + counts[i], make_key(hashes[i])});
    start += counts[i];
  }
  return chunks;
}

}  // namespace hss
