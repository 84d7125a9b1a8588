#include "tiers/remote/remote_tier.hpp"

#include "config/redis_url.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"

namespace hss::detail {

TierStats RemoteTier::stats() const {
  const RemoteStats r = remote_stats();
  TierStats s;
  s.name = std::string(name());
  s.hits = r.hits;
  s.misses = r.misses;
  s.corrupt_values = r.corrupt_values;
  s.unauthenticated_values = r.unauthenticated_values;
  s.bytes_read = r.bytes_read;
  s.writes_enqueued = r.writes_enqueued;
  s.writes_done = r.writes_sent;
  s.bytes_written = r.bytes_written;
  // A write the server's ACL refused is a dropped write in the one shape.
  s.dropped_writes = r.dropped_writes + r.writes_denied;
  s.errors = r.errors;
  s.queue_bytes = r.queue_bytes;
  return s;  // entries_held, bytes_held: a shared server's contents are not ours to count
}

void RemoteTier::add_store_view(HiddenStateStats& stats, uint64_t promotions) const {
  stats.remote = remote_stats();
  stats.remote.read_through_chunks = promotions;
}

}  // namespace hss::detail

#if HSS_HAVE_REMOTE

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>

#include "base/log.hpp"
#include "format/value_codec.hpp"
#include "format/value_mac.hpp"
#include "tiers/remote/redis_connection.hpp"
#include "tiers/remote/remote_shard.hpp"
#include "tiers/write_behind.hpp"

namespace hss::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kBackoffMin{50};
constexpr milliseconds kBackoffMax{2000};
// One pipelined batch of the writer: bounded so a drop-oldest can still act on most of a burst.
constexpr size_t kMaxBatchWrites = 256;
constexpr uint64_t kMaxBatchBytes = 32ULL << 20;

std::string key_of(const TierWrite& w) {
  return remote_key(w.key, to_string(w.slot.kind), w.slot.layer_idx);
}

struct Shard {
  Shard(RedisEndpoint ep, milliseconds timeout)
      : endpoint(std::move(ep)), writer(endpoint, timeout), reader(endpoint, timeout) {}

  RedisEndpoint endpoint;
  RedisConnection writer;  // background thread only

  std::mutex reader_mutex;  // serialises fetches on `reader`
  RedisConnection reader;
  std::atomic<bool> reader_up{false};
  // The server refused a SET with NOPERM: the ACL user may only read. Writes for this server are
  // dropped (counted as denied) without being queued until the writer reconnects.
  std::atomic<bool> writes_denied{false};

  // Reconnect state: background thread (and the constructor before it starts) only.
  milliseconds backoff = kBackoffMin;
  Clock::time_point next_attempt{};
  bool outage_logged = false;
};

class RedisRemoteTier final : public RemoteTier, private WriteBehindIo {
 public:
  explicit RedisRemoteTier(const Config& config)
      : ttl_s_(config.hidden_state_remote_ttl_s),
        timeout_(config.hidden_state_remote_timeout_ms),
        sharding_(server_ids(config)),
        mac_(ValueMac::from_config(config)),
        queue_(WriteBehindOptions{
                   .budget_bytes = static_cast<uint64_t>(config.hidden_state_remote_queue_bytes),
                   .writer_threads = 1,
                   .max_batch_writes = kMaxBatchWrites,
                   .max_batch_bytes = kMaxBatchBytes,
                   .maintains = true},
               *this) {
    for (RedisEndpoint& ep : parse_redis_urls(config.hidden_state_remote_url)) {
      shards_.push_back(std::make_unique<Shard>(std::move(ep), timeout_));
    }
    (void)maintain_connections(/*initial=*/true, /*force=*/true);
    queue_.start();
  }

  ~RedisRemoteTier() override { queue_.stop(); }

  bool enqueue_write(const RemoteWrite& write, std::span<const std::span<const std::byte>> pieces,
                     std::shared_ptr<const void> owner, std::function<bool()> ready) override;
  std::vector<bool> contains(std::span<const RemoteRequest> requests) override;
  std::vector<std::optional<RemoteValue>> fetch(std::span<const RemoteRequest> requests) override;
  void fetch_each(std::span<const RemoteRequest> requests,
                  const std::function<void(size_t, const RemoteValue&)>& on_value) override;
  void count_dropped(uint64_t writes) noexcept override { queue_.count_dropped(writes); }
  void flush() override { queue_.flush(); }
  void close() override { queue_.close(); }
  RemoteStats remote_stats() const override;
  std::string last_error() const override {
    std::lock_guard lock(error_mutex_);
    return last_error_;
  }
  void reconnect_now() override { queue_.wake(/*force=*/true); }
  size_t shard_of(const CacheEngineKey& key) const override {
    return sharding_.shard_of(key.to_string());
  }

 private:
  static std::vector<std::string> server_ids(const Config& config) {
    std::vector<std::string> ids;
    for (const RedisEndpoint& ep : parse_redis_urls(config.hidden_state_remote_url)) {
      ids.push_back(ep.display());
    }
    return ids;
  }

  void set_error(std::string text) {
    std::lock_guard lock(error_mutex_);
    last_error_ = std::move(text);
  }

  /// Connects what is down and due. Returns the earliest time a down server is due again.
  std::optional<Clock::time_point> maintain_connections(bool initial, bool force);
  // WriteBehindIo: the writer thread's reconnects, and its batches as pipelined SETs.
  std::optional<Clock::time_point> maintain(bool force) override {
    return maintain_connections(/*initial=*/false, force);
  }
  void write_batch(std::span<QueuedWrite> batch) noexcept override;
  /// One `verb key` command per request on the reader of its server, pipelined per server;
  /// on_reply(request index, reply) for each reply received. A server that is down or fails
  /// answers nothing for its requests.
  void on_readers(std::span<const RemoteRequest> requests, std::string_view verb,
                  const std::function<void(size_t, const RedisReply&)>& on_reply);
  void send_to(Shard& shard, std::vector<QueuedWrite*>& writes);

  const int64_t ttl_s_;
  const milliseconds timeout_;
  const RendezvousSharding sharding_;
  const std::shared_ptr<const ValueMac> mac_;  // null: values unauthenticated (xxHash3 only)
  std::vector<std::unique_ptr<Shard>> shards_;

  mutable std::mutex error_mutex_;
  std::string last_error_;

  struct Counters {
    std::atomic<uint64_t> hits{0}, misses{0}, corrupt{0}, bytes_read{0}, sent{0},
        bytes_written{0}, reconnects{0}, errors{0}, unauthenticated{0}, denied{0};
  };
  Counters counters_;
  WriteBehind queue_;  // last: its writer stops before the shards go
};

// ---------------------------------------------------------------------------------------------
// connections

std::optional<Clock::time_point> RedisRemoteTier::maintain_connections(bool initial, bool force) {
  std::optional<Clock::time_point> next_due;
  const auto now = Clock::now();
  for (auto& shard_ptr : shards_) {
    Shard& shard = *shard_ptr;
    const bool writer_down = !shard.writer.connected();
    const bool reader_down = !shard.reader_up.load(std::memory_order_acquire);
    if (!writer_down && !reader_down) continue;
    if (!force && now < shard.next_attempt) {
      next_due = next_due ? std::min(*next_due, shard.next_attempt) : shard.next_attempt;
      continue;
    }
    std::optional<std::string> error;
    if (writer_down) error = shard.writer.connect();
    if (!error && reader_down) {
      // Connect a fresh one outside the reader lock, so fetches never wait on a connect.
      RedisConnection fresh(shard.endpoint, timeout_);
      error = fresh.connect();
      if (!error) {
        std::lock_guard lock(shard.reader_mutex);
        shard.reader = std::move(fresh);
        shard.reader_up.store(true, std::memory_order_release);
      }
    }
    if (!error) {
      if (writer_down)
        shard.writes_denied.store(false, std::memory_order_relaxed);  // ACL may change
      if (!initial) {
        counters_.reconnects.fetch_add(1, std::memory_order_relaxed);
        log(LogLevel::kInfo, "remote tier: connected to " + shard.endpoint.display());
      }
      shard.backoff = kBackoffMin;
      shard.outage_logged = false;
      continue;
    }
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
    set_error(*error);
    if (!shard.outage_logged) {
      log(LogLevel::kWarn, "remote tier: " + *error + (initial ? "; running without it" : "") +
                               "; reconnecting in the background");
      shard.outage_logged = true;
    }
    shard.next_attempt = Clock::now() + shard.backoff;
    shard.backoff = std::min(kBackoffMax, shard.backoff * 2);
    next_due = next_due ? std::min(*next_due, shard.next_attempt) : shard.next_attempt;
  }
  return next_due;
}

// ---------------------------------------------------------------------------------------------
// write-behind

bool RedisRemoteTier::enqueue_write(const RemoteWrite& write,
                                    std::span<const std::span<const std::byte>> pieces,
                                    std::shared_ptr<const void> owner,
                                    std::function<bool()> ready) {
  const size_t bytes = WriteBehind::payload_bytes(name(), write, pieces);
  if (!queue_.admits(bytes)) return false;  // over the budget, or closed: counted
  const size_t shard = sharding_.shard_of(write.key.to_string());
  if (shards_[shard]->writes_denied.load(std::memory_order_relaxed)) {
    counters_.denied.fetch_add(1, std::memory_order_relaxed);
    return false;  // a read-only ACL user: nothing queued, nothing pinned
  }
  return queue_.enqueue(write, bytes, pieces, std::move(owner), std::move(ready), shard);
}

void RedisRemoteTier::write_batch(std::span<QueuedWrite> batch) noexcept {
  std::vector<std::vector<QueuedWrite*>> by_shard(shards_.size());
  for (QueuedWrite& w : batch) by_shard[w.lane].push_back(&w);
  for (size_t s = 0; s < shards_.size(); ++s) {
    if (!by_shard[s].empty()) send_to(*shards_[s], by_shard[s]);
  }
}

void RedisRemoteTier::send_to(Shard& shard, std::vector<QueuedWrite*>& writes) {
  if (shard.writes_denied.load(std::memory_order_relaxed)) {
    counters_.denied.fetch_add(writes.size(), std::memory_order_relaxed);
    return;
  }
  if (!shard.writer.connected()) {
    queue_.count_dropped(writes.size());
    return;
  }
  std::vector<RespCommand> commands;
  std::vector<const QueuedWrite*> sent;
  std::vector<std::string> keys;  // alive until the pipeline is sent
  keys.reserve(writes.size());
  commands.reserve(writes.size());
  const std::string ttl = std::to_string(ttl_s_);
  for (QueuedWrite* w : writes) {
    if (w->ready && !w->ready()) {
      queue_.count_dropped(1);
      continue;
    }
    const std::span<const std::span<const std::byte>> payload = w->payload();
    const std::string& key = keys.emplace_back(key_of(w->write));
    TierHeader header{w->write.format, w->write.rows, w->write.cols, hash_pieces(payload),
                      mac_ ? kTierFlagMac : uint8_t{0}};
    std::array<std::byte, kTierHeaderBytes> header_bytes{};
    encode_tier_header(header, header_bytes);
    Mac tag{};
    if (mac_) tag = mac_->compute(key, header_bytes, payload);
    std::vector<std::span<const std::byte>> value;
    value.reserve(payload.size() + 2);
    value.emplace_back(header_bytes);
    if (mac_) value.emplace_back(tag);
    value.insert(value.end(), payload.begin(), payload.end());
    RespCommand& command =
        commands.emplace_back(ttl_s_ > 0 ? 5 : 3, w->bytes + key.size() + kMacBytes);
    command.arg("SET").arg(key).arg(value);
    if (ttl_s_ > 0) command.arg("EX").arg(ttl);
    sent.push_back(w);
  }
  if (commands.empty()) return;
  const auto result = shard.writer.pipeline(commands);
  for (size_t i = 0; i < result.replies.size(); ++i) {
    if (result.replies[i].type() == RedisReply::Type::kStatus) {
      counters_.sent.fetch_add(1, std::memory_order_relaxed);
      counters_.bytes_written.fetch_add(sent[i]->bytes, std::memory_order_relaxed);
    } else if (result.replies[i].text().starts_with("NOPERM")) {
      // The ACL user may not write: a read-only tier, not a fault. Counted, logged once.
      counters_.denied.fetch_add(1, std::memory_order_relaxed);
      if (!shard.writes_denied.exchange(true, std::memory_order_relaxed)) {
        set_error("SET on " + shard.endpoint.display() + ": " +
                  std::string(result.replies[i].text()));
        log(LogLevel::kWarn, "remote tier: " + shard.endpoint.display() +
                                 " refuses writes for this user (" +
                                 std::string(result.replies[i].text()) +
                                 "); reading only, writes to it are dropped and counted");
      }
    } else {
      counters_.errors.fetch_add(1, std::memory_order_relaxed);
      queue_.count_dropped(1);
      set_error("SET on " + shard.endpoint.display() + ": " +
                std::string(result.replies[i].text()));
    }
  }
  if (!result.error.empty()) {
    counters_.errors.fetch_add(1, std::memory_order_relaxed);
    queue_.count_dropped(commands.size() - result.replies.size());
    set_error("write to " + shard.endpoint.display() + ": " + result.error);
    if (!shard.outage_logged) {
      log(LogLevel::kWarn, "remote tier: lost " + shard.endpoint.display() + " (" + result.error +
                               "); its writes are dropped until it is back");
      shard.outage_logged = true;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// read-through

void RedisRemoteTier::on_readers(std::span<const RemoteRequest> requests, std::string_view verb,
                                 const std::function<void(size_t, const RedisReply&)>& on_reply) {
  std::vector<std::vector<size_t>> by_shard(shards_.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    by_shard[sharding_.shard_of(requests[i].key.to_string())].push_back(i);
  }
  for (size_t s = 0; s < shards_.size(); ++s) {
    const std::vector<size_t>& mine = by_shard[s];
    if (mine.empty()) continue;
    Shard& shard = *shards_[s];
    if (!shard.reader_up.load(std::memory_order_acquire)) continue;  // down: no reply, no wait
    std::vector<RespCommand> commands;
    commands.reserve(mine.size());
    for (const size_t i : mine) {
      const RemoteRequest& r = requests[i];
      commands.emplace_back(2).arg(verb).arg(remote_key(r.key, to_string(r.slot.kind), r.slot.layer_idx));
    }
    std::lock_guard lock(shard.reader_mutex);
    if (!shard.reader.connected()) continue;
    // Replies are handed on as they arrive, under the reader lock: a fetch of many large values
    // never holds them all at once.
    size_t delivered = 0;
    const auto deliver = [&](size_t j, RedisReply&& reply) {
      ++delivered;
      if (reply.type() == RedisReply::Type::kError) {
        counters_.errors.fetch_add(1, std::memory_order_relaxed);
      }
      on_reply(mine[j], reply);
    };
    auto result = shard.reader.pipeline(commands, deliver);
    if (!result.error.empty() && delivered == 0) {
      // An idle connection the server dropped (a restart) fails on its first use, before any
      // reply: one fresh connect and one retry, each bounded by the timeout (a server that is
      // really down refuses the connect at once), before the shard counts as down.
      RedisConnection fresh(shard.endpoint, timeout_);
      if (!fresh.connect()) {
        shard.reader = std::move(fresh);
        counters_.reconnects.fetch_add(1, std::memory_order_relaxed);
        result = shard.reader.pipeline(commands, deliver);
      }
    }
    if (!result.error.empty()) {
      shard.reader_up.store(false, std::memory_order_release);
      counters_.errors.fetch_add(1, std::memory_order_relaxed);
      set_error("read from " + shard.endpoint.display() + ": " + result.error);
      log(LogLevel::kWarn, "remote tier: read from " + shard.endpoint.display() + " failed (" +
                               result.error + "); its chunks miss until it is back");
      queue_.wake();
    }
  }
}

std::vector<bool> RedisRemoteTier::contains(std::span<const RemoteRequest> requests) {
  std::vector<bool> present(requests.size(), false);
  on_readers(requests, "EXISTS", [&](size_t i, const RedisReply& reply) {
    present[i] = reply.type() == RedisReply::Type::kInteger && reply.integer() > 0;
  });
  return present;
}

void RedisRemoteTier::fetch_each(std::span<const RemoteRequest> requests,
                                 const std::function<void(size_t, const RemoteValue&)>& on_value) {
  uint64_t hits = 0, corrupt = 0, bytes = 0, unauthenticated = 0;
  on_readers(requests, "GET", [&](size_t i, const RedisReply& reply) {
    if (reply.type() != RedisReply::Type::kString) return;  // nil (absent) or an error reply
    const RemoteRequest& r = requests[i];
    const std::string name = mac_ ? remote_key(r.key, to_string(r.slot.kind), r.slot.layer_idx) : std::string();
    const DecodedValue decoded =
        decode_remote_value(reply.bytes(), r.rows, r.cols, mac_.get(), name);
    if (decoded.status != DecodeStatus::kOk) {
      ++corrupt;
      if (decoded.status == DecodeStatus::kUnauthenticated) ++unauthenticated;
      if (log_enabled(LogLevel::kDebug)) {
        log(LogLevel::kDebug, "remote tier: value of " + remote_key(r.key, to_string(r.slot.kind), r.slot.layer_idx) +
                                  " rejected: " + std::string(to_string(decoded.status)));
      }
      return;
    }
    ++hits;
    bytes += decoded.payload.size();
    on_value(i, RemoteValue{decoded.header.format, decoded.header.rows, decoded.header.cols,
                            decoded.payload, reply.owner()});
  });
  counters_.hits.fetch_add(hits, std::memory_order_relaxed);
  counters_.misses.fetch_add(requests.size() - hits, std::memory_order_relaxed);
  counters_.corrupt.fetch_add(corrupt, std::memory_order_relaxed);
  counters_.unauthenticated.fetch_add(unauthenticated, std::memory_order_relaxed);
  counters_.bytes_read.fetch_add(bytes, std::memory_order_relaxed);
}

std::vector<std::optional<RemoteValue>> RedisRemoteTier::fetch(
    std::span<const RemoteRequest> requests) {
  std::vector<std::optional<RemoteValue>> results(requests.size());
  fetch_each(requests, [&](size_t i, const RemoteValue& value) { results[i] = value; });
  return results;
}

RemoteStats RedisRemoteTier::remote_stats() const {
  RemoteStats s;
  s.enabled = true;
  s.servers = shards_.size();
  for (const auto& shard : shards_) {
    if (shard->reader_up.load(std::memory_order_acquire)) ++s.servers_connected;
  }
  s.hits = counters_.hits.load();
  s.misses = counters_.misses.load();
  s.corrupt_values = counters_.corrupt.load();
  s.bytes_read = counters_.bytes_read.load();
  s.writes_enqueued = queue_.writes_enqueued();
  s.writes_sent = counters_.sent.load();
  s.bytes_written = counters_.bytes_written.load();
  s.dropped_writes = queue_.dropped_writes();
  s.reconnects = counters_.reconnects.load();
  s.errors = counters_.errors.load();
  s.unauthenticated_values = counters_.unauthenticated.load();
  s.writes_denied = counters_.denied.load();
  s.queue_bytes = queue_.queue_bytes();
  return s;
}

}  // namespace

bool remote_tier_available() { return true; }

std::unique_ptr<RemoteTier> RemoteTier::create(const Config& config) {
  if (config.hidden_state_remote_url.empty()) return nullptr;
  return std::make_unique<RedisRemoteTier>(config);
}

}  // namespace hss::detail

#else  // !HSS_HAVE_REMOTE

namespace hss::detail {

bool remote_tier_available() { return false; }

std::unique_ptr<RemoteTier> RemoteTier::create(const Config& config) {
  if (config.hidden_state_remote_url.empty()) return nullptr;
  throw ConfigError(
      "config key 'hidden_state_remote_url': this build has no remote tier "
      "(hiredis was not found when it was built), got '" +
      mask_redis_url(config.hidden_state_remote_url.front()) + "'");
}

}  // namespace hss::detail

#endif  // HSS_HAVE_REMOTE
