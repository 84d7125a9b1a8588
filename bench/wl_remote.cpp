// Workload `remote`: the shared Redis/Valkey tier over loopback.
//
//  * read-through: a fresh store (empty pool) restores a 16K-token prefix (h4096, float32) from
//    the server, against raw pipelined GETs of the same values with hiredis (the engine's own
//    limit on this machine), and the tier's fetch alone (checked, no copy) against the same GETs.
//  * store: store_hidden_states with the tier on (write-behind) against the same store with the
//    tier off.
// The server is HSS_BENCH_REDIS_URL when set, else a redis-server started here on a free port
// (no persistence) and stopped at the end. Skipped without hiredis or redis-server.

#include "common.hpp"

#if HSS_BENCH_WITH_REMOTE

#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <thread>

#include "config/redis_url.hpp"
#include "format/value_codec.hpp"
#include "tiers/remote/remote_tier.hpp"

namespace hss::bench {
namespace {

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using RedisPtr = std::unique_ptr<redisContext, ContextDeleter>;

std::optional<std::filesystem::path> find_redis_server() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    const auto p = std::filesystem::path(dir) / "redis-server";
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return std::nullopt;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

/// A redis-server child process on 127.0.0.1, stopped and cleaned up on destruction.
class LocalServer {
 public:
  explicit LocalServer(const std::filesystem::path& binary)
      : dir_(std::filesystem::temp_directory_path() /
             ("hss-bench-redis-" + std::to_string(::getpid()))),
        port_(free_port()) {
    std::filesystem::create_directories(dir_);
    std::vector<std::string> args = {
        binary.string(), "--port", std::to_string(port_), "--bind", "127.0.0.1", "--dir",
        dir_.string(), "--save", "", "--appendonly", "no",
        // Freed values are purged inline, not by a background
        // thread running beside the next timed call.
        "--jemalloc-bg-thread", "no", "--logfile", (dir_ / "redis.log").string()};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 1000; ++i) {
      RedisPtr c(redisConnect("127.0.0.1", port_));
      if (c && c->err == 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    throw std::runtime_error("redis-server did not start on port " + std::to_string(port_));
  }
  ~LocalServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  LocalServer(const LocalServer&) = delete;
  LocalServer& operator=(const LocalServer&) = delete;
  [[nodiscard]] std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  std::filesystem::path dir_;
  int port_;
  pid_t pid_ = -1;
};

Config remote_store_config(int64_t chunk, uint64_t pool_bytes, const std::string& url) {
  Config c;
  c.chunk_size = chunk;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = static_cast<double>((pool_bytes >> 20) + 1) / 1024.0;
  if (!url.empty()) {
    c.hidden_state_remote_url = {url};
    c.hidden_state_remote_queue_bytes = static_cast<int64_t>(pool_bytes) * 2;
    c.hidden_state_remote_timeout_ms = 5000;
  }
  return c;
}

// Raw pipelined GETs of `keys` on one hiredis connection: what any client pays for the bytes.
Timed raw_gets(const std::shared_ptr<redisContext>& c,
               const std::shared_ptr<std::vector<std::string>>& keys, double bytes) {
  Timed t;
  t.name = "raw GETs";
  t.run = [c, keys] {
    for (const std::string& k : *keys) {
      if (redisAppendCommand(c.get(), "GET %b", k.data(), k.size()) != REDIS_OK) {
        throw std::runtime_error("hiredis append failed");
      }
    }
    for (size_t i = 0; i < keys->size(); ++i) {
      void* reply = nullptr;
      if (redisGetReply(c.get(), &reply) != REDIS_OK || reply == nullptr) {
        throw std::runtime_error(std::string("raw GET failed: ") + c->errstr);
      }
      if (static_cast<redisReply*>(reply)->type != REDIS_REPLY_STRING) {
        freeReplyObject(reply);
        throw std::runtime_error("raw GET: a value is missing on the server");
      }
      do_not_optimize(static_cast<redisReply*>(reply)->str);
      freeReplyObject(reply);
    }
  };
  t.bytes = bytes;
  return t;
}

}  // namespace

void run_remote(Context& ctx) {
  std::unique_ptr<LocalServer> local;
  std::string url;
  if (const char* given = std::getenv("HSS_BENCH_REDIS_URL"); given != nullptr && *given) {
    url = given;
  } else if (const auto bin = find_redis_server()) {
    local = std::make_unique<LocalServer>(*bin);
    url = local->url();
  } else {
    ctx.report.skip("remote", "all figures", "redis-server is not installed");
    return;
  }
  const detail::RedisEndpoint ep = detail::parse_redis_url(url);

  const int64_t chunk = 256;
  const int64_t hidden = ctx.quick ? 1024 : 4096;
  const int64_t n = ctx.quick ? 2048 : 16384;
  const uint64_t pool = pool_bytes_for(n / chunk, chunk, hidden, 4);
  const double bytes = static_cast<double>(n * hidden * 4);
  auto tokens = std::make_shared<std::vector<int32_t>>(make_tokens(n, 23));
  const std::vector<float> rows = random_f32(n * hidden, 29);

  // Process A's role: store the prefix once and let the write-behind reach the server.
  {
    ChunkedTokenDatabase db(chunk, false);
    HiddenStateStore writer(remote_store_config(chunk, pool, url), db);
    (void)writer.store_hidden_states(*tokens, host_view(rows.data(), DType::kFloat32, n, hidden));
    writer.flush();
    if (writer.stats().remote.writes_sent != static_cast<uint64_t>(n / chunk)) {
      throw std::runtime_error("the write-behind did not reach the server: " +
                               std::to_string(writer.stats().remote.writes_sent) + " writes sent");
    }
  }

  // Process B's role: a fresh store whose pool is emptied before every rep.
  auto db = std::make_shared<ChunkedTokenDatabase>(chunk, false);
  auto reader = std::make_shared<HiddenStateStore>(remote_store_config(chunk, pool, url), *db);
  auto chunks = std::make_shared<std::vector<Chunk>>(db->process_tokens(*tokens));
  {
    const auto restored = reader->retrieve_hidden_states(*tokens);
    if (!restored || restored->rows() != n ||
        std::memcmp(restored->data(), rows.data(), rows.size() * sizeof(float)) != 0) {
      throw std::runtime_error("read-through did not restore the prefix bit-identically");
    }
  }
  auto keys = std::make_shared<std::vector<std::string>>();
  for (const Chunk& c : *chunks) keys->push_back(detail::remote_key(c.key, "hidden", 0));
  const timeval tv{5, 0};
  std::shared_ptr<redisContext> raw(redisConnectWithTimeout(ep.host.c_str(), ep.port, tv),
                                    [](redisContext* c) { redisFree(c); });
  if (!raw || raw->err != 0) throw std::runtime_error("cannot connect to " + ep.display());
  const Timed gets = raw_gets(raw, keys, bytes);

  Params p;
  p.chunk_size = chunk;
  p.hidden_dim = hidden;
  p.tokens = n;
  p.dtype = "float32";
  p.storage = "float32";
  p.output = "fresh";
  Timed read_through = prefix_retrieve("read-through", reader, tokens, n, [reader, chunks] {
    for (const Chunk& c : *chunks) (void)reader->drop_key(c.key);
  });
  read_through.bytes = bytes;
  (void)ctx.report.measure("remote", "read-through f32", p, read_through,
                           std::span<const Timed>(&gets, 1));

  // The tier alone: one pipelined fetch, every value checked (header, shape, xxHash3) and
  // dropped as it arrives, as read-through consumes them.
  Config tier_cfg = remote_store_config(chunk, pool, url);
  std::shared_ptr<detail::RemoteTier> tier = detail::RemoteTier::create(tier_cfg);
  auto requests = std::make_shared<std::vector<detail::RemoteRequest>>();
  for (const Chunk& c : *chunks) requests->push_back({c.key, Slot{ActivationKind::kHidden, 0}, chunk, hidden});
  Timed fetch;
  fetch.name = "tier fetch";
  fetch.run = [tier, requests] {
    size_t got = 0;
    tier->fetch_each(*requests, [&](size_t, const detail::RemoteValue& v) {
      do_not_optimize(v.payload.data());
      ++got;
    });
    if (got != requests->size()) throw std::runtime_error("tier fetch missed");
  };
  fetch.bytes = bytes;
  p.output = "checked values";
  (void)ctx.report.measure("remote", "tier fetch f32", p, fetch, std::span<const Timed>(&gets, 1));

  // Store with the write-behind on vs off. Each rep writes fresh keys. Untimed between reps,
  // whichever side comes next: the tier's queue is drained (so no rep runs beside another rep's
  // sending), the local keys are dropped and the previous rep's values deleted on the server.
  // Pools of twice the prefix: queued writes may pin half a pool (beyond that the store copies
  // them), so a whole prefix can wait for the network without a copy on the storing thread.
  auto on = std::make_shared<HiddenStateStore>(remote_store_config(chunk, 2 * pool, url), *db);
  auto off = std::make_shared<HiddenStateStore>(remote_store_config(chunk, 2 * pool, ""), *db);
  const TensorView view = host_view(rows.data(), DType::kFloat32, n, hidden);
  auto make_store = [&](const std::shared_ptr<HiddenStateStore>& store, const char* name,
                        bool then_flush) {
    return fresh_store(name, store, on, db, *tokens, view, bytes, then_flush,
                       [raw](const Chunk& c) {
                         const std::string key = detail::remote_key(c.key, "hidden", 0);
                         freeReplyObject(redisCommand(raw.get(), "DEL %b", key.data(), key.size()));
                       });
  };
  const Timed store_off = make_store(off, "remote off", false);
  p.output.clear();
  (void)ctx.report.measure("remote", "store f32 remote on", p, make_store(on, "remote on", false),
                           std::span<const Timed>(&store_off, 1));
  // The whole cost: the store returns only once the write-behind reached the server.
  (void)ctx.report.measure("remote", "store f32 remote on + flush", p,
                           make_store(on, "remote on + flush", true),
                           std::span<const Timed>(&store_off, 1));
  on->flush();
  const HiddenStateStats s = on->stats();
  ctx.report.note("remote", "store with the tier on: " + std::to_string(s.remote.writes_sent) +
                                " writes sent, " + std::to_string(s.remote.dropped_writes) +
                                " dropped");
  ctx.report.print_workload("remote");
}

}  // namespace hss::bench

#else  // !HSS_BENCH_WITH_REMOTE

namespace hss::bench {
void run_remote(Context& ctx) {
  ctx.report.skip("remote", "all figures", "built without hiredis (no remote tier)");
}
}  // namespace hss::bench

#endif
