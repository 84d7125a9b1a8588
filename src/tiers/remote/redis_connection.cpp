#include "tiers/remote/redis_connection.hpp"

#if HSS_HAVE_REMOTE

#include <hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>
#include <ctime>

namespace hss::detail {
namespace {

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

// hiredis writes with write(2): a peer that went away would raise SIGPIPE and kill the host
// process. Block it on this thread for the scope and discard one raised meanwhile.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    (void)sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    active_ = pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask_) == 0;
  }
  ~ScopedSigpipeBlock() {
    if (!active_) return;
    sigset_t pending;
    sigemptyset(&pending);
    if (!was_pending_ && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      sigset_t pipe_set;
      sigemptyset(&pipe_set);
      sigaddset(&pipe_set, SIGPIPE);
      const timespec zero{};
      while (sigtimedwait(&pipe_set, nullptr, &zero) == -1 && errno == EINTR) {
      }
    }
    (void)pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t old_mask_{};
  bool was_pending_ = false;
  bool active_ = false;
};

void append_bulk_header(std::string& out, size_t bytes) {
  out += '$';
  out += std::to_string(bytes);
  out += "\r\n";
}

}  // namespace

// ---------------------------------------------------------------------------------------------

RedisReply::RedisReply(redisReply* reply)
    : reply_(reply, [](redisReply* r) { freeReplyObject(r); }) {
  if (reply == nullptr) return;
  switch (reply->type) {
    case REDIS_REPLY_NIL:
      type_ = Type::kNil;
      break;
    case REDIS_REPLY_STRING:
      type_ = Type::kString;
      break;
    case REDIS_REPLY_STATUS:
      type_ = Type::kStatus;
      break;
    case REDIS_REPLY_ERROR:
      type_ = Type::kError;
      break;
    case REDIS_REPLY_INTEGER:
      type_ = Type::kInteger;
      break;
    default:
      type_ = Type::kOther;
      break;
  }
}

std::span<const std::byte> RedisReply::bytes() const {
  if (!reply_ || (type_ != Type::kString && type_ != Type::kStatus && type_ != Type::kError)) {
    return {};
  }
  return {reinterpret_cast<const std::byte*>(reply_->str), static_cast<size_t>(reply_->len)};
}

std::string_view RedisReply::text() const {
  const auto b = bytes();
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

long long RedisReply::integer() const {
  return reply_ && type_ == Type::kInteger ? reply_->integer : 0;
}

// ---------------------------------------------------------------------------------------------

RespCommand::RespCommand(size_t args, size_t reserve_bytes) {
  text_.reserve(reserve_bytes + 16 * args + 16);
  text_ += '*';
  text_ += std::to_string(args);
  text_ += "\r\n";
}

RespCommand& RespCommand::arg(std::string_view value) {
  append_bulk_header(text_, value.size());
  text_ += value;
  text_ += "\r\n";
  return *this;
}

RespCommand& RespCommand::arg(std::span<const std::span<const std::byte>> pieces) {
  size_t total = 0;
  for (const auto piece : pieces) total += piece.size();
  append_bulk_header(text_, total);
  for (const auto piece : pieces) {
    text_.append(reinterpret_cast<const char*>(piece.data()), piece.size());
  }
  text_ += "\r\n";
  return *this;
}

// ---------------------------------------------------------------------------------------------

void RedisConnection::ContextDeleter::operator()(redisContext* context) const {
  redisFree(context);
}

RedisConnection::RedisConnection(RedisEndpoint endpoint, std::chrono::milliseconds timeout)
    : endpoint_(std::move(endpoint)), timeout_(timeout) {}
RedisConnection::~RedisConnection() = default;
RedisConnection::RedisConnection(RedisConnection&&) noexcept = default;
RedisConnection& RedisConnection::operator=(RedisConnection&&) noexcept = default;

void RedisConnection::disconnect() { context_.reset(); }

std::string RedisConnection::context_error() const {
  if (!context_) return "not connected";
  const std::string text = context_->errstr;  // I/O errors already carry strerror's text
  return text.empty() ? std::string("unknown hiredis error") : text;
}

std::optional<std::string> RedisConnection::connect() {
  context_.reset();
  const timeval tv = to_timeval(timeout_);
  std::unique_ptr<redisContext, ContextDeleter> context(
      redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port, tv));
  if (!context) return "cannot allocate a hiredis context";
  if (context->err != 0) return "connect to " + endpoint_.display() + ": " + context->errstr;
  if (redisSetTimeout(context.get(), tv) != REDIS_OK) {
    return "set timeout on " + endpoint_.display() + ": " + context->errstr;
  }
  (void)redisEnableKeepAlive(context.get());
  context_ = std::move(context);

  std::vector<RespCommand> setup;
  if (!endpoint_.password.empty()) {
    if (endpoint_.user.empty()) {
      setup.emplace_back(2).arg("AUTH").arg(endpoint_.password);
    } else {
      setup.emplace_back(3).arg("AUTH").arg(endpoint_.user).arg(endpoint_.password);
    }
  }
  if (endpoint_.db != 0) setup.emplace_back(2).arg("SELECT").arg(std::to_string(endpoint_.db));
  setup.emplace_back(1).arg("PING");  // proves the server answers (and that AUTH is not needed)
  PipelineResult result = pipeline(setup);
  if (!result.error.empty()) return "handshake with " + endpoint_.display() + ": " + result.error;
  for (size_t i = 0; i < result.replies.size(); ++i) {
    // A read-only ACL user (e.g. +@read) may not PING; the server answered, so it is up.
    const bool ping = i + 1 == result.replies.size();
    if (ping && result.replies[i].text().starts_with("NOPERM")) continue;
    if (result.replies[i].type() == RedisReply::Type::kError) {
      const bool auth = !endpoint_.password.empty() && i == 0;
      std::string message = std::string(auth ? "authentication with " : "handshake with ") +
                            endpoint_.display() +
                            " failed: " + std::string(result.replies[i].text());
      context_.reset();
      return message;
    }
  }
  return std::nullopt;
}

RedisConnection::PipelineResult RedisConnection::pipeline(
    std::span<const RespCommand> commands,
    const std::function<void(size_t, RedisReply&&)>& on_reply) {
  PipelineResult result;
  if (!context_) {
    result.error = "not connected";
    return result;
  }
  ScopedSigpipeBlock no_sigpipe;
  for (const RespCommand& command : commands) {
    if (redisAppendFormattedCommand(context_.get(), command.text().data(), command.text().size()) !=
        REDIS_OK) {
      result.error = context_error();
      context_.reset();
      return result;
    }
  }
  if (!on_reply) result.replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(context_.get(), &raw) != REDIS_OK || raw == nullptr) {
      result.error = context_error();
      if (raw != nullptr) freeReplyObject(raw);
      context_.reset();  // the stream is out of step now: never reuse it
      return result;
    }
    ++result.answered;
    if (on_reply) {
      on_reply(i, RedisReply(static_cast<redisReply*>(raw)));
    } else {
      result.replies.emplace_back(static_cast<redisReply*>(raw));
    }
  }
  return result;
}

}  // namespace hss::detail

#endif  // HSS_HAVE_REMOTE
