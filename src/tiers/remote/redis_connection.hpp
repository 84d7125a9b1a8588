#pragma once
// One blocking connection to a Redis/Valkey server through hiredis, with connect and command
// timeouts, AUTH and SELECT, and pipelining. The redisContext is owned (RAII); a failed call
// leaves the connection closed, and the caller (RemoteTier) decides when to connect again.
//
// Thread safety: one RedisConnection is used by one thread at a time (the caller locks). Every
// call blocks the calling thread on the network, each socket operation for at most the timeout.
// Writes never raise SIGPIPE in the process: the signal is blocked and discarded around them.
// Built only with hiredis (HSS_HAVE_REMOTE).

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/redis_url.hpp"

struct redisContext;
struct redisReply;

namespace hss::detail {

/// An owned hiredis reply. Copies share the reply; bytes() stays valid while any copy lives.
class RedisReply {
 public:
  enum class Type { kNil, kString, kStatus, kError, kInteger, kOther };

  explicit RedisReply(redisReply* reply);  // takes ownership

  [[nodiscard]] Type type() const { return type_; }
  /// The string, status or error text; empty for other types.
  [[nodiscard]] std::span<const std::byte> bytes() const;
  [[nodiscard]] std::string_view text() const;
  [[nodiscard]] long long integer() const;
  /// Keeps the reply alive (for values handed out without a copy).
  [[nodiscard]] std::shared_ptr<const void> owner() const { return reply_; }

 private:
  std::shared_ptr<redisReply> reply_;
  Type type_ = Type::kNil;
};

/// Builds commands in the Redis protocol (RESP), so a large value is copied once into the
/// command rather than once into a value and again by hiredis's formatter.
class RespCommand {
 public:
  explicit RespCommand(size_t args, size_t reserve_bytes = 0);
  RespCommand& arg(std::string_view text);
  /// One bulk argument made of several pieces (e.g. a header and the payload).
  RespCommand& arg(std::span<const std::span<const std::byte>> pieces);
  [[nodiscard]] const std::string& text() const { return text_; }

 private:
  std::string text_;
};

class RedisConnection {
 public:
  RedisConnection(RedisEndpoint endpoint, std::chrono::milliseconds timeout);
  ~RedisConnection();
  RedisConnection(RedisConnection&&) noexcept;
  RedisConnection& operator=(RedisConnection&&) noexcept;
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  /// Opens the connection (closing any old one), authenticates and selects the database.
  /// Returns an error text on failure (the connection stays closed), nothing on success.
  [[nodiscard]] std::optional<std::string> connect();
  [[nodiscard]] bool connected() const { return context_ != nullptr; }
  void disconnect();
  [[nodiscard]] const RedisEndpoint& endpoint() const { return endpoint_; }

  struct PipelineResult {
    std::vector<RedisReply> replies;  ///< one per command read before any failure (no on_reply)
    size_t answered = 0;              ///< replies read before any failure
    std::string error;                ///< empty on success; the connection is closed otherwise
  };
  /// Sends every command in one batch, then reads every reply in order. With `on_reply`, each
  /// reply goes to it as soon as it is read (index, reply) and is not kept, so a large reply's
  /// memory is reused by the next one.
  [[nodiscard]] PipelineResult pipeline(
      std::span<const RespCommand> commands,
      const std::function<void(size_t, RedisReply&&)>& on_reply = {});

 private:
  struct ContextDeleter {
    void operator()(redisContext* context) const;
  };
  std::string context_error() const;

  RedisEndpoint endpoint_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<redisContext, ContextDeleter> context_;
};

}  // namespace hss::detail
