#pragma once
// hss::detail::RemoteTier: hidden-state chunks shared across processes and hosts through one or
// more Redis/Valkey servers (hidden_state_remote_url), sharded client-side by rendezvous hashing
// of the chunk key.
//
// * Write-behind: enqueue_write() puts a chunk on the shared bounded queue (tiers/write_behind.hpp,
//   one writer thread) and returns at once; the writer sends it in batches of pipelined SETs
//   (SET .. EX ttl when a TTL is set) and reconnects between batches.
//   When the byte budget is exceeded the oldest pending writes are dropped and counted; a write
//   for a server that is down is dropped and counted too. Writes are best effort.
// * Read-through: fetch() asks every server for its share of a request list with one pipelined
//   round trip per server and returns, per request, the value or nothing. A value that fails any
//   check (see format/value_codec.hpp) is a counted miss, never returned.
// * Faults: a server that is down at start is logged once (warning) and the tier runs without
//   it; the background thread reconnects with exponential backoff (50 ms .. 2 s). A server lost
//   mid-run turns its requests into misses and its writes into drops until it is back.
//
// Thread safety: every method may be called from many threads at once. enqueue_write never
// touches the network. fetch blocks the calling thread on the network: per server, each socket
// operation is bounded by hidden_state_remote_timeout_ms, and a server known to be down costs
// nothing (its requests miss at once). Fetches to one server are serialised on its connection.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hss/config.hpp"
#include "hss/remote_stats.hpp"
#include "tiers/backing_tier.hpp"

namespace hss::detail {

// The seam's value types under the names the Redis code and its tests grew up with.
using RemoteRequest = TierRequest;
using RemoteValue = TierValue;
using RemoteWrite = TierWrite;

/// The Redis/Valkey tier: a BackingTier (write-behind every store, read-through, shared by every
/// process that names the same servers, so discard keeps values) plus what only a sharded
/// network tier has (servers, reconnects, the last connection error).
class RemoteTier : public BackingTier {
 public:
  /// nullptr when config.hidden_state_remote_url is empty. With URLs but built without hiredis:
  /// ConfigError. Connects to every server now (each bounded by the timeout); a server that is
  /// down is a warning, not an error.
  [[nodiscard]] static std::unique_ptr<RemoteTier> create(const Config& config);

  [[nodiscard]] std::string_view name() const noexcept final { return "remote"; }

  // BackingTier, with what Redis adds to it:
  //  * enqueue_write: the bounded queue drops its oldest writes beyond
  //    hidden_state_remote_queue_bytes; a server that refused a write (NOPERM) takes none.
  //  * contains: EXISTS, one pipelined round trip per server involved; a server down: false.
  //  * fetch_each: GET, one pipelined round trip per server involved (servers in turn, requests
  //    of one server in order); the value is valid during the callback only, and the callback
  //    runs under that server's read lock.
  //  * stats: the one shape; remote_stats adds the Redis fields (HiddenStateStats::remote).

  /// One result per request, in order. Keeps every value's reply alive: for many large values
  /// prefer fetch_each.
  [[nodiscard]] virtual std::vector<std::optional<RemoteValue>> fetch(
      std::span<const RemoteRequest> requests) = 0;

  /// The tier's counters with the Redis fields (read_through_chunks stays 0: the chain counts
  /// promotions).
  [[nodiscard]] virtual RemoteStats remote_stats() const = 0;
  /// The one shape, from remote_stats.
  [[nodiscard]] TierStats stats() const final;
  /// HiddenStateStats::remote: remote_stats, read_through_chunks the chain's promotions.
  void add_store_view(HiddenStateStats& stats, uint64_t promotions) const final;
  /// The last connection or authentication error (empty when none), password-free.
  [[nodiscard]] virtual std::string last_error() const = 0;
  /// Asks the background thread to retry down servers now instead of after the backoff.
  virtual void reconnect_now() = 0;
  /// Index of the server (in URL order) that holds the chunk.
  [[nodiscard]] virtual size_t shard_of(const CacheEngineKey& key) const = 0;
};

/// True when this build has the remote tier (hiredis was found).
[[nodiscard]] bool remote_tier_available();

}  // namespace hss::detail
