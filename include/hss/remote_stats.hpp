#pragma once
// Counters of the shared remote tier (hidden_state_remote_url), part of HiddenStateStats.
// A plain value: safe to copy and read from any thread.

#include <cstdint>

#include "hss/detail/stats_fields.hpp"

namespace hss {

struct RemoteStats {
  bool enabled = false;  ///< a remote URL is configured (and the build has the tier)
  uint64_t servers = 0;
  uint64_t servers_connected = 0;  ///< servers whose read connection is up now
  uint64_t hits = 0;               ///< (chunk, slot) values fetched and checked
  uint64_t misses = 0;             ///< values asked for and not returned (absent, down, corrupt)
  uint64_t corrupt_values = 0;     ///< present but failing a check (also counted as misses)
  uint64_t unauthenticated_values = 0;  ///< failing the MAC (also in corrupt_values and misses)
  uint64_t bytes_read = 0;              ///< payload bytes of the hits
  uint64_t read_through_chunks = 0;  ///< (chunk, slot) entries inserted into the pool by retrieves
  uint64_t writes_enqueued = 0;
  uint64_t writes_sent = 0;  ///< acknowledged by the server
  uint64_t bytes_written = 0;
  uint64_t dropped_writes = 0;  ///< over the queue budget, or their server was down or failed
  uint64_t writes_denied = 0;   ///< refused by the server's ACL (NOPERM: a read-only user)
  uint64_t reconnects = 0;      ///< connections (re)established after a failure
  uint64_t errors = 0;          ///< connection failures, timeouts and error replies
  uint64_t queue_bytes = 0;     ///< payload bytes waiting in the write-behind queue now
};

/// RemoteStats's fields, each once, in the order stats() reports them: the Python dict is
/// built from this list, the stub and docs/stats.md are checked against it
/// (hss/detail/stats_fields.hpp).
template <detail::MaybeConst<RemoteStats> Self, class Visit>
constexpr void for_each_field(Self& s, Visit&& visit) {
  visit("enabled", s.enabled);
  visit("servers", s.servers);
  visit("servers_connected", s.servers_connected);
  visit("hits", s.hits);
  visit("misses", s.misses);
  visit("corrupt_values", s.corrupt_values);
  visit("unauthenticated_values", s.unauthenticated_values);
  visit("bytes_read", s.bytes_read);
  visit("read_through_chunks", s.read_through_chunks);
  visit("writes_enqueued", s.writes_enqueued);
  visit("writes_sent", s.writes_sent);
  visit("bytes_written", s.bytes_written);
  visit("dropped_writes", s.dropped_writes);
  visit("writes_denied", s.writes_denied);
  visit("reconnects", s.reconnects);
  visit("errors", s.errors);
  visit("queue_bytes", s.queue_bytes);
}

}  // namespace hss
