#pragma once
// Client-side sharding of chunk keys over the remote servers by rendezvous (highest random
// weight) hashing: each key goes to the server with the highest hash(server, key). Adding or
// removing a server moves only the keys whose winner changes, i.e. that server's share. A plain
// value once built: safe to read from many threads.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hss::detail {

class RendezvousSharding {
 public:
  /// One identity per server (its "host:port/db"); at least one (InvalidArgument otherwise).
  explicit RendezvousSharding(std::span<const std::string> server_ids);

  /// The server index of a chunk key. Every layer and kind of one chunk shares the chunk's key
  /// string, so they land on one server and a prefix needs one round trip per server.
  [[nodiscard]] size_t shard_of(std::string_view chunk_key) const;
  [[nodiscard]] size_t size() const { return seeds_.size(); }

 private:
  std::vector<uint64_t> seeds_;  // per-server hash seeds derived from the identities
};

}  // namespace hss::detail
