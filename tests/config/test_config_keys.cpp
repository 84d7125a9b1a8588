// The key table (src/config/config_keys.cpp) against what is written elsewhere: README's key table row by
// row (name, default, meaning), Config::keys/doc/value, and the HSS_* debugging variables, which
// reach a store only through Config::with_env_overrides (src/config/config_env.hpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "config/config_env.hpp"
#include "config/config_keys.hpp"
#include "hss/config.hpp"
#include "hss/engine.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"
#include "base/log.hpp"
#include "scoped_env.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using detail::KeySpec;

using EnvVar = test::ScopedEnv;

/// None of the HSS_* debugging variables set (whatever the test's environment exports).
struct NoDebugVars {
  EnvVar restore{"HSS_RESTORE_IMPL", std::nullopt};
  EnvVar output{"HSS_OUTPUT_CACHE_MB", std::nullopt};
  EnvVar stream{"HSS_STREAM_THRESHOLD_KB", std::nullopt};
  EnvVar copy_threads{"HSS_COPY_THREADS", std::nullopt};
  EnvVar log{"HSS_LOG_LEVEL", std::nullopt};
};

TEST(ConfigEnvOverrides, CopyThreadsTakesAutoOrACountAndIgnoresTheRest) {
  const NoDebugVars none;
  Config c;
  c.tuning.copy_threads = 3;
  {
    const EnvVar set("HSS_COPY_THREADS", "1");
    const Config o = c.with_env_overrides();
    EXPECT_EQ(o.tuning.copy_threads, 1);
    EXPECT_EQ(o.env_overrides, std::vector<std::string>{"HSS_COPY_THREADS"});
    EXPECT_NE(o.to_yaml().find("hidden_state_copy_threads: 1  # HSS_COPY_THREADS\n"),
              std::string::npos);
  }
  {
    const EnvVar set("HSS_COPY_THREADS", "auto");
    EXPECT_EQ(c.with_env_overrides().tuning.copy_threads, std::nullopt);
  }
  for (const char* bad : {"0", "65", "two", "", "2x"}) {
    const EnvVar set("HSS_COPY_THREADS", bad);
    const Config o = c.with_env_overrides();
    EXPECT_EQ(o.tuning.copy_threads, 3) << bad;
    EXPECT_TRUE(o.env_overrides.empty()) << bad;
  }
}

struct ReadmeRow {
  std::string name, default_text, meaning;
};

/// The rows of README.md's "## Configuration keys" table.
std::vector<ReadmeRow> readme_rows() {
  std::ifstream in(std::string(HSS_SOURCE_DIR) + "/README.md");
  EXPECT_TRUE(in) << "cannot read README.md under " << HSS_SOURCE_DIR;
  std::string line;
  while (std::getline(in, line) && line != "## Configuration keys") {
  }
  std::vector<ReadmeRow> rows;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("| ", 0) != 0) {
      if (in_table) break;
      continue;
    }
    in_table = true;
    // "| `name` | default | meaning |": the meaning may hold '|' only inside backticks, which
    // the table does not use, so the first two separators split it.
    const size_t a = line.find(" | ");
    const size_t b = line.find(" | ", a + 3);
    if (line.rfind("| `", 0) != 0 || a == std::string::npos || b == std::string::npos) continue;
    const std::string name = line.substr(2, a - 2);
    rows.push_back({name.substr(1, name.size() - 2), line.substr(a + 3, b - a - 3),
                    line.substr(b + 3, line.size() - b - 3 - 2)});
  }
  return rows;
}

/// A key's default as README shows it: to_yaml's text in backticks. (Appended piecewise: GCC 12
/// at -O3 misreads "literal" + std::string as overlapping copies, -Wrestrict.)
std::string readme_default(const KeySpec& spec) {
  std::string text = "`";
  text += spec.format(Config{});
  text += '`';
  return text;
}

/// The README row a key's table entry makes.
std::string expected_row(const KeySpec& spec) {
  std::string row = "| `";
  row += spec.name;
  row += "` | ";
  row += readme_default(spec);
  row += " | ";
  row += spec.doc;
  row += " |";
  return row;
}

TEST(ConfigKeys, ReadmeTableIsTheKeyTable) {
  const std::vector<ReadmeRow> rows = readme_rows();
  const auto table = detail::key_table();
  ASSERT_EQ(rows.size(), table.size()) << "README's key table and src/config/config_keys.cpp differ";
  for (size_t i = 0; i < table.size(); ++i) {
    const KeySpec& spec = table[i];
    const std::string want = expected_row(spec);
    EXPECT_EQ(rows[i].name, spec.name) << "README row " << i << " should be:\n" << want;
    EXPECT_EQ(rows[i].default_text, readme_default(spec)) << want;
    EXPECT_EQ(rows[i].meaning, spec.doc) << want;
  }
}

TEST(ConfigKeys, KeysDocAndValueComeFromTheTable) {
  const auto table = detail::key_table();
  const auto keys = Config::keys();
  ASSERT_EQ(keys.size(), table.size());
  Config c;
  c.chunk_size = 64;
  c.hidden_state_layers = std::vector<int64_t>{0, -1};
  c.hidden_state_kinds = std::vector<ActivationKind>{ActivationKind::kKey};
  c.tuning.restore_impl = RestoreImpl::kCub;
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(keys[i], table[i].name);
    EXPECT_EQ(Config::doc(keys[i]), table[i].doc);
    EXPECT_FALSE(table[i].doc.empty()) << keys[i];
    for (size_t j = 0; j < i; ++j) EXPECT_NE(keys[i], keys[j]);
    // Every value survives to_yaml and back, key by key.
    EXPECT_EQ(Config::from_yaml(c.to_yaml()).value(keys[i]), c.value(keys[i])) << keys[i];
  }
  EXPECT_EQ(c.value("chunk_size"), ConfigValue(int64_t{64}));
  EXPECT_EQ(c.value("hidden_state_layers"), ConfigValue(std::vector<int64_t>{0, -1}));
  EXPECT_EQ(c.value("hidden_state_kinds"), ConfigValue(std::vector<std::string>{"key"}));
  EXPECT_EQ(c.value("hidden_state_restore_impl"), ConfigValue(std::string("cub")));
  EXPECT_EQ(c.value("hidden_state_stream_threshold_bytes"), ConfigValue());
  EXPECT_EQ(c.value("max_local_cpu_size"), ConfigValue(5.0));
  EXPECT_EQ(c.value("save_unfull_chunk"), ConfigValue(false));
  EXPECT_THROW((void)c.value("chunk_sizes"), InvalidArgument);
  EXPECT_THROW((void)Config::doc("chunk_sizes"), InvalidArgument);
}

TEST(ConfigKeys, LogLevelKeyParsesAutoAndLevels) {
  EXPECT_EQ(Config().hidden_state_log_level, std::nullopt);
  EXPECT_EQ(Config::from_yaml("hidden_state_log_level: auto\n").hidden_state_log_level,
            std::nullopt);
  EXPECT_EQ(Config::from_yaml("hidden_state_log_level: null\n").hidden_state_log_level,
            std::nullopt);
  EXPECT_EQ(Config::from_yaml("hidden_state_log_level: warn\n").hidden_state_log_level,
            LogLevel::kWarn);
  try {
    (void)Config::from_yaml("hidden_state_log_level: loud\n");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "config key 'hidden_state_log_level': expected 'auto', 'debug', 'info', 'warn', "
                 "'error' or 'off', got 'loud' (line 1)");
  }
}

// ---- The HSS_* debugging variables.

TEST(ConfigEnvOverrides, NoneSetChangesNothing) {
  const NoDebugVars none;
  Config c;
  c.tuning.restore_impl = RestoreImpl::kCub;
  const Config o = c.with_env_overrides();
  EXPECT_EQ(o.to_yaml(), c.to_yaml());
  EXPECT_TRUE(o.env_overrides.empty());
}

TEST(ConfigEnvOverrides, EachVariableSetsItsKeyAndToYamlSaysSo) {
  const NoDebugVars none;
  const EnvVar restore("HSS_RESTORE_IMPL", "memcpy");  // the old name of copy_engine
  const EnvVar output("HSS_OUTPUT_CACHE_MB", "3");
  const EnvVar stream("HSS_STREAM_THRESHOLD_KB", "0");
  const EnvVar log("HSS_LOG_LEVEL", "error");
  Config c;
  c.tuning.restore_impl = RestoreImpl::kCub;
  c.tuning.stream_threshold_bytes = 4096;
  const Config o = c.with_env_overrides();
  EXPECT_EQ(o.tuning.restore_impl, RestoreImpl::kCopyEngine);
  EXPECT_EQ(o.tuning.output_cache_bytes, int64_t{3} << 20);
  EXPECT_EQ(o.tuning.stream_threshold_bytes, 0);
  EXPECT_EQ(o.hidden_state_log_level, LogLevel::kError);
  EXPECT_EQ(o.env_overrides,
            (std::vector<std::string>{"HSS_RESTORE_IMPL", "HSS_OUTPUT_CACHE_MB",
                                      "HSS_STREAM_THRESHOLD_KB", "HSS_LOG_LEVEL"}));
  const std::string text = o.to_yaml();
  EXPECT_NE(text.find("hidden_state_restore_impl: copy_engine  # HSS_RESTORE_IMPL\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("hidden_state_output_cache_bytes: 3145728  # HSS_OUTPUT_CACHE_MB\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("hidden_state_stream_threshold_bytes: 0  # HSS_STREAM_THRESHOLD_KB\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("hidden_state_log_level: error  # HSS_LOG_LEVEL\n"), std::string::npos)
      << text;
  // The text still loads, with the values in effect.
  const Config back = Config::from_yaml(text);
  EXPECT_EQ(back.tuning.restore_impl, RestoreImpl::kCopyEngine);
  EXPECT_EQ(back.tuning.stream_threshold_bytes, 0);
  EXPECT_TRUE(back.env_overrides.empty());
  // Applying twice lists each variable once.
  EXPECT_EQ(o.with_env_overrides().env_overrides.size(), 4u);
}

TEST(ConfigEnvOverrides, SpellingsAreAsLenientAsTheyWere) {
  const NoDebugVars none;
  Config c;
  c.tuning.restore_impl = RestoreImpl::kCub;
  {
    const EnvVar restore("HSS_RESTORE_IMPL", "warp_drive");  // unknown: warned, the config's
    const Config o = c.with_env_overrides();
    EXPECT_EQ(o.tuning.restore_impl, RestoreImpl::kCub);
    EXPECT_TRUE(o.env_overrides.empty());
  }
  {
    const EnvVar restore("HSS_RESTORE_IMPL", "");  // empty: unset
    EXPECT_EQ(c.with_env_overrides().tuning.restore_impl, RestoreImpl::kCub);
  }
  {
    const EnvVar log("HSS_LOG_LEVEL", "chatty");  // unknown: info, as the logger always read it
    EXPECT_EQ(c.with_env_overrides().hidden_state_log_level, LogLevel::kInfo);
    EXPECT_EQ(detail::log_level_from_env(), LogLevel::kInfo);
  }
  {
    const EnvVar output("HSS_OUTPUT_CACHE_MB", "99999999999999999999");  // saturates
    const Config o = c.with_env_overrides();
    EXPECT_EQ(o.tuning.output_cache_bytes, std::numeric_limits<int64_t>::max());
    EXPECT_NO_THROW(o.validate());
  }
  {
    const EnvVar stream("HSS_STREAM_THRESHOLD_KB", "64");
    EXPECT_EQ(c.with_env_overrides().tuning.stream_threshold_bytes, 64 << 10);
  }
  EXPECT_EQ(detail::key_overridden_by("HSS_STREAM_THRESHOLD_KB"),
            "hidden_state_stream_threshold_bytes");
  EXPECT_EQ(detail::key_overridden_by("HSS_POOL_MEMORY_CHECK"), "");
}

TEST(ConfigEnvOverrides, FromEnvAppliesThemOverLmcacheVariables) {
  const NoDebugVars none;
  const EnvVar file("LMCACHE_CONFIG_FILE", std::nullopt);
  const EnvVar lmcache("LMCACHE_HIDDEN_STATE_RESTORE_IMPL", "cub");
  EXPECT_EQ(Config::from_env().tuning.restore_impl, RestoreImpl::kCub);
  const EnvVar restore("HSS_RESTORE_IMPL", "kernel");
  const Config c = Config::from_env();
  EXPECT_EQ(c.tuning.restore_impl, RestoreImpl::kKernel);
  EXPECT_EQ(c.env_overrides, std::vector<std::string>{"HSS_RESTORE_IMPL"});
}

TEST(ConfigEnvOverrides, AStoreRunsWithThemWhateverItsConfigsSource) {
  const NoDebugVars none;
  Config c = test::store_config(16, 8, 4);
  c.tuning.stream_threshold_bytes = 1 << 20;
  ChunkedTokenDatabase db(16, false);
  {
    HiddenStateStore store(c, db);
    EXPECT_EQ(store.stats().host_copy.chosen_by, HostCopySource::kConfig);
    EXPECT_EQ(store.stats().host_copy.stream_threshold_bytes, uint64_t{1} << 20);
  }
  const EnvVar stream("HSS_STREAM_THRESHOLD_KB", "2");
  HiddenStateStore store(c, db);
  EXPECT_EQ(store.stats().host_copy.chosen_by, HostCopySource::kEnvironment);
  EXPECT_EQ(store.stats().host_copy.stream_threshold_bytes, 2048u);
}

TEST(ConfigEnvOverrides, AnEngineShowsTheConfigItsStoreRunsWith) {
  const NoDebugVars none;
  Config c = test::store_config(16, 8, 4);
  c.tuning.restore_impl = RestoreImpl::kCub;
  const EnvVar restore("HSS_RESTORE_IMPL", "kernel");
  const auto engine = Engine::create(c, Metadata{});
  EXPECT_EQ(engine->config().tuning.restore_impl, RestoreImpl::kKernel);
  const std::string text = engine->config().to_yaml();
  EXPECT_NE(text.find("hidden_state_restore_impl: kernel  # HSS_RESTORE_IMPL\n"), std::string::npos)
      << text;
}

TEST(ConfigEnvOverrides, AStoreAppliesItsLogLevelToTheProcess) {
  const LogLevel before = detail::log_level_from_env().value_or(LogLevel::kInfo);
  const NoDebugVars none;
  Config c = test::store_config(16, 8, 4);
  ChunkedTokenDatabase db(16, false);
  c.hidden_state_log_level = LogLevel::kDebug;
  { HiddenStateStore store(c, db); }
  EXPECT_TRUE(detail::log_enabled(LogLevel::kDebug));
  c.hidden_state_log_level = LogLevel::kError;
  { HiddenStateStore store(c, db); }
  EXPECT_FALSE(detail::log_enabled(LogLevel::kWarn));
  EXPECT_TRUE(detail::log_enabled(LogLevel::kError));
  c.hidden_state_log_level.reset();  // auto: left as it is
  { HiddenStateStore store(c, db); }
  EXPECT_FALSE(detail::log_enabled(LogLevel::kWarn));
  {
    const EnvVar log("HSS_LOG_LEVEL", "warn");  // wins over the key
    c.hidden_state_log_level = LogLevel::kDebug;
    HiddenStateStore store(c, db);
    EXPECT_FALSE(detail::log_enabled(LogLevel::kInfo));
    EXPECT_TRUE(detail::log_enabled(LogLevel::kWarn));
  }
  // Back to the process default the test started with.
  detail::set_log_level(before);
}

}  // namespace
}  // namespace hss
