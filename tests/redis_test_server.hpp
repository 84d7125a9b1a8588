#pragma once
// A real redis-server for the remote-tier tests: started by the test on 127.0.0.1 and a free
// port, in its own temporary directory, without persistence; stopped (or killed) and restarted
// on the same port by the test; always stopped and cleaned up by the destructor. Tests call
// HSS_REQUIRE_REDIS() first: without redis-server installed they are skipped.

#include <gtest/gtest.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace hss::test {

/// Polls `done` every 5 ms until it holds or `limit` passes. For waiting on background work
/// (a reconnect), not for measuring it: the limit is generous and only ends a broken test.
inline bool wait_until(const std::function<bool()>& done,
                       std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

/// A port nobody listens on right now (the kernel's choice for an ephemeral bind).
inline int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

inline std::optional<std::filesystem::path> find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::filesystem::path candidate =
        std::filesystem::path(dirs.substr(start, end - start)) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

struct RedisContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
struct RedisReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyDeleter>;

class RedisTestServer {
 public:
  static std::optional<std::filesystem::path> binary() { return find_in_path("redis-server"); }

  explicit RedisTestServer(std::string password = {}) : password_(std::move(password)) {
    dir_ = std::filesystem::temp_directory_path() /
           ("hss-redis-" + std::to_string(::getpid()) + "-" + std::to_string(next_id()));
    std::filesystem::create_directories(dir_);
    // A port another process grabs between our probe and the server's bind: try a few.
    for (int attempt = 0; attempt < 5 && pid_ <= 0; ++attempt) {
      port_ = free_tcp_port();
      if (!start()) stop();
    }
    if (pid_ <= 0) ADD_FAILURE() << "redis-server did not start; see " << (dir_ / "redis.log");
  }
  ~RedisTestServer() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  RedisTestServer(const RedisTestServer&) = delete;
  RedisTestServer& operator=(const RedisTestServer&) = delete;

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] bool running() const { return pid_ > 0; }
  /// redis://[:password@]127.0.0.1:port
  [[nodiscard]] std::string url(const std::optional<std::string>& password = std::nullopt) const {
    const std::string pw = password.value_or(password_);
    return "redis://" + (pw.empty() ? std::string() : ":" + pw + "@") +
           "127.0.0.1:" + std::to_string(port_);
  }

  /// Starts the server on this object's port (again, after stop()). True once it answers PING.
  bool start() {
    if (pid_ > 0) return true;
    const auto bin = binary();
    if (!bin) return false;
    std::vector<std::string> args = {bin->string(),  "--port",    std::to_string(port_),
                                     "--bind",       "127.0.0.1", "--dir",
                                     dir_.string(),  "--save",    "",
                                     "--appendonly", "no",        "--daemonize",
                                     "no",           "--logfile", (dir_ / "redis.log").string()};
    if (!password_.empty()) {
      args.push_back("--requirepass");
      args.push_back(password_);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (pid < 0) return false;
    pid_ = pid;
    return wait_until([&] { return child_exited() || ping(); }, std::chrono::seconds(15)) &&
           !child_exited();
  }

  /// SIGTERM (clean) or SIGKILL (crash), then reaps the process.
  void stop(bool kill = false) {
    if (pid_ <= 0) return;
    ::kill(pid_, kill ? SIGKILL : SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
  }

  /// One command through a fresh hiredis connection (authenticated); null on failure.
  RedisReplyPtr command(const std::vector<std::string>& args) const {
    std::unique_ptr<redisContext, RedisContextDeleter> c(
        redisConnectWithTimeout("127.0.0.1", port_, timeval{2, 0}));
    if (!c || c->err != 0) return nullptr;
    if (!password_.empty()) {
      RedisReplyPtr auth(
          static_cast<redisReply*>(redisCommand(c.get(), "AUTH %s", password_.c_str())));
      if (!auth || auth->type == REDIS_REPLY_ERROR) return nullptr;
    }
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    return RedisReplyPtr(static_cast<redisReply*>(
        redisCommandArgv(c.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
  }

  [[nodiscard]] std::optional<std::string> get(const std::string& key) const {
    const RedisReplyPtr r = command({"GET", key});
    if (!r || r->type != REDIS_REPLY_STRING) return std::nullopt;
    return std::string(r->str, static_cast<size_t>(r->len));
  }
  bool set(const std::string& key, const std::string& value) const {
    const RedisReplyPtr r = command({"SET", key, value});
    return r && r->type == REDIS_REPLY_STATUS;
  }

 private:
  static int next_id() {
    static int id = 0;
    return ++id;
  }
  bool child_exited() {
    if (pid_ <= 0) return true;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      return true;
    }
    return false;
  }
  bool ping() const {
    const RedisReplyPtr r = command({"PING"});
    return r && r->type == REDIS_REPLY_STATUS;
  }

  std::string password_;
  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = 0;
};

}  // namespace hss::test

#define HSS_REQUIRE_REDIS()                                                            \
  do {                                                                                 \
    if (!::hss::test::RedisTestServer::binary()) {                                     \
      GTEST_SKIP() << "redis-server is not installed (scripts/bootstrap installs it)"; \
    }                                                                                  \
  } while (0)
