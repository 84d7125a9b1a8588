#pragma once
// hss::detail::RemoteTier: hidden-state chunks shared across processes and hosts through one or
// more Redis/Valkey servers (hidden_state_remote_url), sharded client-side by rendezvous hashing
// of the chunk key.
//
// * Write-behind: enqueue_write() puts a chunk on a bounded queue and returns at once; one
//   background thread sends the queue with pipelined SETs (SET .. EX ttl when a TTL is set).
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
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hss/cache_key.hpp"
#include "hss/config.hpp"
#include "hss/remote_stats.hpp"
#include "hss/tensor.hpp"

namespace hss::detail {

struct RemoteRequest {
  CacheEngineKey key;
  std::string kind = "hidden";  ///< activation kind name (part of the remote key)
  int64_t layer = 0;
  int64_t rows = 0;  ///< expected rows; 0 accepts any
  int64_t cols = 0;  ///< expected cols; 0 accepts any
};

/// A checked value. payload stays valid while `owner` lives (no copy is made on the way in).
struct RemoteValue {
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::span<const std::byte> payload;
  std::shared_ptr<const void> owner;
};

/// What a write needs besides its bytes.
struct RemoteWrite {
  CacheEngineKey key;
  std::string kind = "hidden";
  int64_t layer = 0;
  DType dtype = DType::kFloat32;  ///< storage dtype of the payload
  int64_t rows = 0;
  int64_t cols = 0;
};

class RemoteTier {
 public:
  /// nullptr when config.hidden_state_remote_url is empty. With URLs but built without hiredis:
  /// ConfigError. Connects to every server now (each bounded by the timeout); a server that is
  /// down is a warning, not an error.
  [[nodiscard]] static std::unique_ptr<RemoteTier> create(const Config& config);

  /// Sends what is still queued (each server bounded by the timeout), then stops the thread.
  virtual ~RemoteTier() = default;

  /// Queues one chunk for the background thread. `pieces` (in order) make up the payload, whose
  /// size must match the shape (InvalidArgument otherwise, nothing queued). With `owner` null the
  /// bytes are copied now; with an owner, the pieces are borrowed and `owner` is held until the
  /// write is sent or dropped. `ready`, when given, runs on the background thread before the
  /// bytes are read (e.g. waits for a device copy); false drops the write. Returns false when
  /// the write was dropped at once (budget smaller than the value, or write-behind disabled).
  virtual bool enqueue_write(const RemoteWrite& write,
                             std::span<const std::span<const std::byte>> pieces,
                             std::shared_ptr<const void> owner = {},
                             std::function<bool()> ready = {}) = 0;

  /// Per request, whether the server holds a value under its key (EXISTS; unchecked). A server
  /// that is down answers false. One pipelined round trip per server involved.
  [[nodiscard]] virtual std::vector<bool> contains(std::span<const RemoteRequest> requests) = 0;

  /// Streams the checked values: on_value(request index, value) for each hit, as its reply
  /// arrives (servers in turn, requests of one server in order). The value (and its payload) is
  /// valid during the call only, and the call holds that server's read connection: it must not
  /// call back into the tier. Misses are not reported. One pipelined round trip per server.
  virtual void fetch_each(std::span<const RemoteRequest> requests,
                          const std::function<void(size_t, const RemoteValue&)>& on_value) = 0;

  /// One result per request, in order. One pipelined round trip per server involved. Keeps every
  /// value's reply alive: for many large values prefer fetch_each.
  [[nodiscard]] virtual std::vector<std::optional<RemoteValue>> fetch(
      std::span<const RemoteRequest> requests) = 0;

  /// Counts writes the caller dropped before queueing them (in dropped_writes).
  virtual void count_dropped(uint64_t writes) = 0;

  /// Waits until every write queued before the call was sent or dropped.
  virtual void flush() = 0;

  /// The tier's counters (read_through_chunks stays 0: the store counts it).
  [[nodiscard]] virtual RemoteStats stats() const = 0;
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
