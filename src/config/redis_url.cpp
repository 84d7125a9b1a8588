#include "config/redis_url.hpp"

#include <charconv>
#include <set>

#include "hss/error.hpp"

namespace hss::detail {
namespace {

constexpr std::string_view kScheme = "redis://";

[[noreturn]] void bad_url(std::string_view url, std::string_view problem) {
  throw ConfigError("remote URL '" + mask_redis_url(url) + "': " + std::string(problem) +
                    " (expected redis://[user:password@]host:port[/db])");
}

template <typename Int>
bool parse_decimal(std::string_view text, Int& out) {
  if (text.empty()) return false;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && ptr == text.data() + text.size();
}

}  // namespace

std::string RedisEndpoint::display() const {
  return host + ":" + std::to_string(port) + "/" + std::to_string(db);
}

std::string mask_redis_url(std::string_view url) {
  const size_t at = url.rfind('@');
  if (!url.starts_with(kScheme) || at == std::string_view::npos) return std::string(url);
  const std::string_view userinfo = url.substr(kScheme.size(), at - kScheme.size());
  const size_t colon = userinfo.find(':');
  if (colon == std::string_view::npos) return std::string(url);
  return std::string(url.substr(0, kScheme.size() + colon + 1)) + "***" +
         std::string(url.substr(at));
}

RedisEndpoint parse_redis_url(std::string_view url) {
  if (!url.starts_with(kScheme)) bad_url(url, "the scheme must be redis://");
  std::string_view rest = url.substr(kScheme.size());
  RedisEndpoint ep;
  // The password may itself contain '@' or ':'; the host part cannot, so split at the last '@'.
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest.remove_prefix(at + 1);
    const size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      bad_url(url, "credentials need a ':' before the password (redis://:password@...)");
    }
    ep.user = std::string(userinfo.substr(0, colon));
    ep.password = std::string(userinfo.substr(colon + 1));
    if (ep.password.empty()) bad_url(url, "the password is empty");
  }
  std::string_view hostport = rest;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    hostport = rest.substr(0, slash);
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!parse_decimal(db, ep.db) || ep.db < 0)) {
      bad_url(url, "the database '" + std::string(db) + "' is not a non-negative integer");
    }
  }
  const size_t colon = hostport.rfind(':');
  if (colon == std::string_view::npos) bad_url(url, "the port is missing");
  ep.host = std::string(hostport.substr(0, colon));
  if (ep.host.starts_with('[') && ep.host.ends_with(']')) {
    ep.host = ep.host.substr(1, ep.host.size() - 2);  // [::1]:6379
  }
  if (ep.host.empty()) bad_url(url, "the host is empty");
  const std::string_view port = hostport.substr(colon + 1);
  if (!parse_decimal(port, ep.port) || ep.port <= 0 || ep.port > 65535) {
    bad_url(url, "the port '" + std::string(port) + "' is not in [1, 65535]");
  }
  return ep;
}

std::vector<RedisEndpoint> parse_redis_urls(std::span<const std::string> urls) {
  std::vector<RedisEndpoint> endpoints;
  std::set<std::string> seen;
  endpoints.reserve(urls.size());
  for (const std::string& url : urls) {
    RedisEndpoint ep = parse_redis_url(url);
    if (!seen.insert(ep.display()).second) {
      bad_url(url, "server " + ep.display() + " is listed twice");
    }
    endpoints.push_back(std::move(ep));
  }
  return endpoints;
}

}  // namespace hss::detail
