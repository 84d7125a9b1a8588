// The remote-tier configuration keys (hidden_state_remote_*): parsing, validation, environment
// overrides and to_yaml, in the style of test_config.cpp.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "hss/config.hpp"
#include "hss/error.hpp"
#include "config_errors.hpp"

namespace {

using hss::Config;
using hss::ConfigError;
using hss::test::expect_mentions;
using hss::test::yaml_error;

TEST(RemoteConfig, DefaultsMeanNoRemoteTier) {
  const Config c;
  EXPECT_TRUE(c.hidden_state_remote_url.empty());
  EXPECT_EQ(c.hidden_state_remote_ttl_s, 0);
  EXPECT_EQ(c.hidden_state_remote_timeout_ms, 1000);
  EXPECT_EQ(c.hidden_state_remote_queue_bytes, 256LL << 20);
  EXPECT_TRUE(Config::from_yaml("hidden_state_remote_url: null\n").hidden_state_remote_url.empty());
  EXPECT_TRUE(Config::from_yaml("hidden_state_remote_url: []\n").hidden_state_remote_url.empty());
}

TEST(RemoteConfig, UrlAsStringOrListAndEveryKey) {
  const Config one = Config::from_yaml("hidden_state_remote_url: redis://127.0.0.1:6379\n");
  EXPECT_EQ(one.hidden_state_remote_url, std::vector<std::string>{"redis://127.0.0.1:6379"});
  const Config many = Config::from_yaml(
      "hidden_state_remote_url:\n"
      "  - redis://a:7000\n"
      "  - redis://:pw@b:7001/2\n"
      "hidden_state_remote_ttl_s: 3600\n"
      "hidden_state_remote_timeout_ms: 250\n"
      "hidden_state_remote_queue_bytes: 0x1000000\n");
  EXPECT_EQ(many.hidden_state_remote_url,
            (std::vector<std::string>{"redis://a:7000", "redis://:pw@b:7001/2"}));
  EXPECT_EQ(many.hidden_state_remote_ttl_s, 3600);
  EXPECT_EQ(many.hidden_state_remote_timeout_ms, 250);
  EXPECT_EQ(many.hidden_state_remote_queue_bytes, 16 << 20);
  EXPECT_TRUE(many.unknown_keys.empty());
}

TEST(RemoteConfig, BadValuesNameKeyValueAndLine) {
  expect_mentions(yaml_error("chunk_size: 16\nhidden_state_remote_url: http://x:1\n"),
                  {"hidden_state_remote_url", "http://x:1", "scheme", "line 2"});
  expect_mentions(yaml_error("hidden_state_remote_url: redis://:hunter2@x\n"),
                  {"hidden_state_remote_url", "port is missing", "redis://:***@x"});
  EXPECT_EQ(yaml_error("hidden_state_remote_url: redis://:hunter2@x\n").find("hunter2"),
            std::string::npos);
  expect_mentions(yaml_error("hidden_state_remote_url: [redis://a:1, redis://a:1]\n"),
                  {"listed twice"});
  expect_mentions(yaml_error("hidden_state_remote_url: {a: 1}\n"),
                  {"hidden_state_remote_url", "expected a URL or a list of URLs"});
  expect_mentions(yaml_error("hidden_state_remote_ttl_s: -1\n"),
                  {"hidden_state_remote_ttl_s", "must be >= 0", "'-1'", "line 1"});
  expect_mentions(yaml_error("hidden_state_remote_timeout_ms: 0\n"),
                  {"hidden_state_remote_timeout_ms", "[1, 600000]", "'0'"});
  expect_mentions(yaml_error("hidden_state_remote_timeout_ms: 600001\n"),
                  {"hidden_state_remote_timeout_ms", "'600001'"});
  expect_mentions(yaml_error("hidden_state_remote_queue_bytes: -5\n"),
                  {"hidden_state_remote_queue_bytes", "'-5'"});
  expect_mentions(yaml_error("hidden_state_remote_ttl_s: soon\n"),
                  {"hidden_state_remote_ttl_s", "expected an integer"});
}

TEST(RemoteConfig, ValidateChecksValuesSetInCode) {
  Config c;
  c.hidden_state_remote_url = {"redis://h"};
  EXPECT_THROW(c.validate(), ConfigError);
  c.hidden_state_remote_url = {"redis://h:1"};
  c.validate();
  c.hidden_state_remote_timeout_ms = -3;
  EXPECT_THROW(c.validate(), ConfigError);
}

TEST(RemoteConfig, EnvironmentOverride) {
  ::setenv("LMCACHE_HIDDEN_STATE_REMOTE_URL", "[redis://e:1, redis://f:2]", 1);
  ::setenv("LMCACHE_HIDDEN_STATE_REMOTE_TTL_S", "60", 1);
  Config c;
  try {
    c = Config::from_env();
  } catch (...) {
    ::unsetenv("LMCACHE_HIDDEN_STATE_REMOTE_URL");
    ::unsetenv("LMCACHE_HIDDEN_STATE_REMOTE_TTL_S");
    throw;
  }
  ::unsetenv("LMCACHE_HIDDEN_STATE_REMOTE_URL");
  ::unsetenv("LMCACHE_HIDDEN_STATE_REMOTE_TTL_S");
  EXPECT_EQ(c.hidden_state_remote_url, (std::vector<std::string>{"redis://e:1", "redis://f:2"}));
  EXPECT_EQ(c.hidden_state_remote_ttl_s, 60);
}

TEST(RemoteConfig, ToYamlRoundTripsIncludingAwkwardPasswords) {
  Config c;
  c.hidden_state_remote_url = {"redis://a:1", R"(redis://u:p"w\#: x@b:2/1)"};
  c.hidden_state_remote_ttl_s = 5;
  c.hidden_state_remote_timeout_ms = 42;
  c.hidden_state_remote_queue_bytes = 123;
  const Config back = Config::from_yaml(c.to_yaml());
  EXPECT_EQ(back.hidden_state_remote_url, c.hidden_state_remote_url) << c.to_yaml();
  EXPECT_EQ(back.hidden_state_remote_ttl_s, 5);
  EXPECT_EQ(back.hidden_state_remote_timeout_ms, 42);
  EXPECT_EQ(back.hidden_state_remote_queue_bytes, 123);
  EXPECT_NE(Config().to_yaml().find("hidden_state_remote_url: null\n"), std::string::npos);
}

}  // namespace
