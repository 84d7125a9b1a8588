#include "tiers/remote/remote_shard.hpp"

#include <xxhash.h>

#include "hss/error.hpp"

namespace hss::detail {

RendezvousSharding::RendezvousSharding(std::span<const std::string> server_ids) {
  if (server_ids.empty()) throw InvalidArgument("server_ids is empty: sharding needs a server");
  seeds_.reserve(server_ids.size());
  for (const std::string& id : server_ids) seeds_.push_back(XXH3_64bits(id.data(), id.size()));
}

size_t RendezvousSharding::shard_of(std::string_view chunk_key) const {
  if (seeds_.size() == 1) return 0;
  size_t best = 0;
  uint64_t best_score = 0;
  for (size_t i = 0; i < seeds_.size(); ++i) {
    // Seeded xxHash3 of the key: a per-(server, key) weight that is stable across processes.
    const uint64_t score = XXH3_64bits_withSeed(chunk_key.data(), chunk_key.size(), seeds_[i]);
    if (i == 0 || score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

}  // namespace hss::detail
