#pragma once
// Chunk keys from token ids (or from an engine's own block hashes).
//
// A TokenDatabase is immutable after construction. Thread safety: docs/design.md, "What may run
// concurrently and what may block the host".

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "hss/cache_key.hpp"

namespace hss {

/// What the engine exposes and the hidden-state store takes to turn tokens into chunk keys.
class TokenDatabase {
 public:
  virtual ~TokenDatabase() = default;

  /// One Chunk per chunk_size tokens; the trailing partial chunk only with save_unfull_chunk.
  /// Token ids must lie in [0, 2^32): anything else is InvalidArgument.
  [[nodiscard]] virtual std::vector<Chunk> process_tokens(
      std::span<const int32_t> tokens) const = 0;
  [[nodiscard]] virtual std::vector<Chunk> process_tokens(
      std::span<const int64_t> tokens) const = 0;

  /// Keys for hashes an engine already has, with LMCache's meaning of offsets: offsets[i] is the
  /// token count of chunk i, so chunk i covers [start_i, start_i + offsets[i]) with start_0 = 0.
  /// As many counts as hashes, every count > 0, else InvalidArgument.
  [[nodiscard]] virtual std::vector<Chunk> process_hashes(
      std::span<const uint64_t> hashes, std::span<const int64_t> offsets) const = 0;

  [[nodiscard]] virtual int64_t chunk_size() const = 0;
};

struct Config;

/// Prefix-chained xxHash3-64: chunk i's hash covers its tokens as little-endian uint32, seeded
/// with chunk i-1's hash (chunk 0 with kRootSeed). Deterministic across processes and machines.
/// Keyed (`hash_key`, hidden_state_chunk_hash_key_file): chunk 0 is seeded from the key instead,
/// so the whole chain depends on it and nobody without it can compute a key (docs/design.md,
/// "Threat model": what that stops, and what a 64-bit non-cryptographic hash still allows).
class ChunkedTokenDatabase final : public TokenDatabase {
 public:
  static constexpr uint64_t kRootSeed = 0;
  static constexpr size_t kMinHashKeyBytes = 16;

  /// chunk_size > 0, else InvalidArgument; a `hash_key` that is not empty has at least
  /// kMinHashKeyBytes bytes, else InvalidArgument.
  ChunkedTokenDatabase(int64_t chunk_size, bool save_unfull_chunk, Metadata metadata = {},
                       std::string_view hash_key = {});
  /// chunk_size, save_unfull_chunk and, if set, the key of hidden_state_chunk_hash_key_file (read
  /// now: ConfigError naming the key for a file that cannot be read or is too short).
  [[nodiscard]] static ChunkedTokenDatabase from_config(const Config& config,
                                                        Metadata metadata = {});

  [[nodiscard]] std::vector<Chunk> process_tokens(std::span<const int32_t> tokens) const override;
  [[nodiscard]] std::vector<Chunk> process_tokens(std::span<const int64_t> tokens) const override;
  [[nodiscard]] std::vector<Chunk> process_hashes(std::span<const uint64_t> hashes,
                                                  std::span<const int64_t> offsets) const override;
  [[nodiscard]] int64_t chunk_size() const override { return chunk_size_; }
  [[nodiscard]] const Metadata& metadata() const { return metadata_; }

  /// The key this database gives a chunk hash.
  [[nodiscard]] CacheEngineKey make_key(uint64_t chunk_hash) const;
  /// The seed of chunk 0's hash: kRootSeed, or the key's.
  [[nodiscard]] uint64_t root_seed() const noexcept { return root_seed_; }
  [[nodiscard]] bool keyed() const noexcept { return root_seed_ != kRootSeed; }

 private:
  int64_t chunk_size_;
  bool save_unfull_chunk_;
  Metadata metadata_;
  uint64_t root_seed_ = kRootSeed;
};

}  // namespace hss
