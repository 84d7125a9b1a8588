#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hss/config.hpp"
#include "hss/error.hpp"
#include "config_errors.hpp"
#include "scoped_env.hpp"

namespace {

using hss::Config;
using hss::ConfigError;
using hss::StorageDType;

using hss::test::config_error_of;
using hss::test::expect_mentions;
using hss::test::yaml_error;

using hss::test::ScopedEnv;

constexpr const char* kAllKeyVars[] = {
    "LMCACHE_CONFIG_FILE",
    "LMCACHE_CHUNK_SIZE",
    "LMCACHE_SAVE_UNFULL_CHUNK",
    "LMCACHE_MAX_LOCAL_CPU_SIZE",
    "LMCACHE_ENABLE_HIDDEN_STATE_CACHE",
    "LMCACHE_MAX_HIDDEN_STATE_CPU_SIZE",
    "LMCACHE_HIDDEN_STATE_LAYERS",
    "LMCACHE_HIDDEN_STATE_STORAGE_DTYPE",
    "LMCACHE_HIDDEN_STATE_BLOCK_BYTES",
    "LMCACHE_HIDDEN_STATE_REMOTE_URL",
    "LMCACHE_HIDDEN_STATE_REMOTE_TTL_S",
    "LMCACHE_HIDDEN_STATE_REMOTE_TIMEOUT_MS",
    "LMCACHE_HIDDEN_STATE_REMOTE_QUEUE_BYTES",
};

// Clears every variable from_env reads, whatever the calling shell exported, for one test.
class CleanEnv {
 public:
  CleanEnv() {
    for (const char* name : kAllKeyVars)
      saved_.emplace_back(std::make_unique<ScopedEnv>(name, std::nullopt));
  }

 private:
  std::vector<std::unique_ptr<ScopedEnv>> saved_;
};

// A file under the test temp directory, removed at scope exit.
class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    path_ =
        std::filesystem::temp_directory_path() / ("hss_test_config_" + std::to_string(::getpid()) +
                                                  "_" + std::to_string(counter_++) + ".yaml");
    std::ofstream out(path_, std::ios::binary);
    out << contents;
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

void expect_defaults(const Config& c) {
  EXPECT_EQ(c.chunk_size, 256);
  EXPECT_FALSE(c.save_unfull_chunk);
  EXPECT_DOUBLE_EQ(c.max_local_cpu_size, 5.0);
  EXPECT_FALSE(c.enable_hidden_state_cache);
  EXPECT_DOUBLE_EQ(c.max_hidden_state_cpu_size, 0.0);
  EXPECT_FALSE(c.hidden_state_layers.has_value());
  EXPECT_EQ(c.hidden_state_storage_dtype, StorageDType::kFloat32);
  EXPECT_EQ(c.hidden_state_block_bytes, 0);
  EXPECT_TRUE(c.unknown_keys.empty());
}

constexpr const char* kFullYaml =
    "chunk_size: 128\n"
    "save_unfull_chunk: true\n"
    "max_local_cpu_size: 2.5\n"
    "enable_hidden_state_cache: true\n"
    "max_hidden_state_cpu_size: 4\n"
    "hidden_state_layers: [0, 3, -1]\n"
    "hidden_state_storage_dtype: native\n"
    "hidden_state_block_bytes: 4096\n";

// ---------------------------------------------------------------------------------------------
// Defaults and parsing

TEST(Config, DefaultConstructedHasLmcacheDefaults) {
  const Config c;
  expect_defaults(c);
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.hidden_state_pool_bytes(), 0u);
  EXPECT_EQ(c.kv_pool_bytes(), 5ull << 30);
}

TEST(Config, EmptyDocumentsGiveDefaults) {
  expect_defaults(Config::from_yaml(""));
  expect_defaults(Config::from_yaml("\n\n"));
  expect_defaults(Config::from_yaml("# only a comment\n"));
  expect_defaults(Config::from_yaml("~\n"));
  expect_defaults(Config::from_yaml("{}"));
}

TEST(Config, EveryKeyParsed) {
  const Config c = Config::from_yaml(kFullYaml);
  EXPECT_EQ(c.chunk_size, 128);
  EXPECT_TRUE(c.save_unfull_chunk);
  EXPECT_DOUBLE_EQ(c.max_local_cpu_size, 2.5);
  EXPECT_TRUE(c.enable_hidden_state_cache);
  EXPECT_DOUBLE_EQ(c.max_hidden_state_cpu_size, 4.0);
  ASSERT_TRUE(c.hidden_state_layers.has_value());
  EXPECT_EQ(*c.hidden_state_layers, (std::vector<int64_t>{0, 3, -1}));
  EXPECT_EQ(c.hidden_state_storage_dtype, StorageDType::kNative);
  EXPECT_EQ(c.hidden_state_block_bytes, 4096);
  EXPECT_TRUE(c.unknown_keys.empty());
  EXPECT_EQ(c.hidden_state_pool_bytes(), 4ull << 30);
  EXPECT_EQ(c.kv_pool_bytes(), 5ull << 29);
}

TEST(Config, SeedDocumentExampleParses) {
  const Config c = Config::from_yaml(
      "chunk_size: 256\n"
      "\n"
      "enable_hidden_state_cache: true\n"
      "max_hidden_state_cpu_size: 4          # GiB, pinned CPU pool size\n"
      "# hidden_state_layers: [0, 1]         # optional allowlist (see below)\n");
  EXPECT_EQ(c.chunk_size, 256);
  EXPECT_TRUE(c.enable_hidden_state_cache);
  EXPECT_EQ(c.hidden_state_pool_bytes(), 4ull << 30);
  EXPECT_FALSE(c.hidden_state_layers.has_value());
}

TEST(Config, ScalarSpellings) {
  EXPECT_TRUE(Config::from_yaml("save_unfull_chunk: True").save_unfull_chunk);
  EXPECT_TRUE(Config::from_yaml("save_unfull_chunk: yes").save_unfull_chunk);
  EXPECT_TRUE(Config::from_yaml("save_unfull_chunk: ON").save_unfull_chunk);
  EXPECT_FALSE(Config::from_yaml("save_unfull_chunk: no").save_unfull_chunk);
  EXPECT_FALSE(Config::from_yaml("save_unfull_chunk: FALSE").save_unfull_chunk);
  EXPECT_EQ(Config::from_yaml("chunk_size: +64").chunk_size, 64);
  EXPECT_EQ(Config::from_yaml("chunk_size: 0x100").chunk_size, 256);
  EXPECT_DOUBLE_EQ(Config::from_yaml("max_local_cpu_size: 1e-3").max_local_cpu_size, 1e-3);
  try {
    (void)Config::from_yaml("max_local_cpu_size: 0");
    ADD_FAILURE() << "a KV pool of 0 bytes must be rejected";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("max_local_cpu_size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(Config::from_yaml("hidden_state_storage_dtype: float32").hidden_state_storage_dtype,
            StorageDType::kFloat32);
  EXPECT_EQ(Config::from_yaml("hidden_state_storage_dtype: 'native'").hidden_state_storage_dtype,
            StorageDType::kNative);
}

TEST(Config, HiddenStateLayersForms) {
  EXPECT_FALSE(Config::from_yaml("hidden_state_layers: null").hidden_state_layers.has_value());
  EXPECT_FALSE(Config::from_yaml("hidden_state_layers: ~").hidden_state_layers.has_value());
  EXPECT_FALSE(Config::from_yaml("hidden_state_layers:").hidden_state_layers.has_value());

  const Config block = Config::from_yaml("hidden_state_layers:\n  - 2\n  - -3\n");
  ASSERT_TRUE(block.hidden_state_layers.has_value());
  EXPECT_EQ(*block.hidden_state_layers, (std::vector<int64_t>{2, -3}));

  // An empty allowlist is set, and admits nothing.
  const Config empty = Config::from_yaml("hidden_state_layers: []");
  ASSERT_TRUE(empty.hidden_state_layers.has_value());
  EXPECT_TRUE(empty.hidden_state_layers->empty());
  EXPECT_FALSE(empty.layer_allowed(0));
}

TEST(Config, LayerAllowed) {
  const Config all;
  EXPECT_TRUE(all.layer_allowed(0));
  EXPECT_TRUE(all.layer_allowed(-7));
  EXPECT_TRUE(all.layer_allowed(1'000'000));

  const Config some = Config::from_yaml("hidden_state_layers: [0, 5, -1]");
  EXPECT_TRUE(some.layer_allowed(0));
  EXPECT_TRUE(some.layer_allowed(5));
  EXPECT_TRUE(some.layer_allowed(-1));
  EXPECT_FALSE(some.layer_allowed(1));
  EXPECT_FALSE(some.layer_allowed(-5));
}

TEST(Config, PoolBytesRoundDown) {
  Config c;
  c.max_hidden_state_cpu_size = 1.5;
  c.max_local_cpu_size = 0.25;
  EXPECT_EQ(c.hidden_state_pool_bytes(), 3ull << 29);
  EXPECT_EQ(c.kv_pool_bytes(), 1ull << 28);
  // One byte is 2^-30 GiB; a little less than two bytes rounds down to one.
  c.max_hidden_state_cpu_size = 1.9 / 1073741824.0;
  EXPECT_EQ(c.hidden_state_pool_bytes(), 1u);
  c.max_local_cpu_size = 0.0;
  EXPECT_EQ(c.kv_pool_bytes(), 0u);
}

TEST(Config, ToStringStorageDType) {
  EXPECT_EQ(hss::to_string(StorageDType::kFloat32), "float32");
  EXPECT_EQ(hss::to_string(StorageDType::kNative), "native");
}

// ---------------------------------------------------------------------------------------------
// Unknown keys

TEST(Config, UnknownKeysWarnedAndRecorded) {
  testing::internal::CaptureStderr();
  const Config c = Config::from_yaml(
      "chunk_size: 64\n"
      "local_cpu: true\n"
      "foo: [1, 2]\n");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(c.chunk_size, 64);
  EXPECT_EQ(c.unknown_keys, (std::vector<std::string>{"local_cpu", "foo"}));
  EXPECT_NE(err.find("hss: warning: unknown config key 'local_cpu' (line 2) ignored\n"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("hss: warning: unknown config key 'foo' (line 3) ignored\n"),
            std::string::npos)
      << err;
}

TEST(Config, KnownKeysDoNotWarn) {
  testing::internal::CaptureStderr();
  (void)Config::from_yaml(kFullYaml);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

// ---------------------------------------------------------------------------------------------
// Bad input: each message names the key, the value and the line.

TEST(ConfigErrors, ChunkSizeNotAnInteger) {
  expect_mentions(yaml_error("save_unfull_chunk: false\nchunk_size: abc\n"),
                  {"chunk_size", "abc", "line 2"});
  expect_mentions(yaml_error("chunk_size: 1.5\n"), {"chunk_size", "1.5", "line 1"});
  expect_mentions(yaml_error("chunk_size: '256'\n"), {"chunk_size", "256", "line 1"});
  expect_mentions(yaml_error("chunk_size: [1]\n"), {"chunk_size", "[1]", "line 1"});
  expect_mentions(yaml_error("chunk_size:\n"), {"chunk_size", "null", "line 1"});
  expect_mentions(yaml_error("chunk_size: 99999999999999999999\n"),
                  {"chunk_size", "99999999999999999999", "line 1"});
}

TEST(ConfigErrors, ChunkSizeNotPositive) {
  expect_mentions(yaml_error("\nchunk_size: 0\n"), {"chunk_size", "'0'", "line 2", "> 0"});
  expect_mentions(yaml_error("chunk_size: -16\n"), {"chunk_size", "-16", "line 1"});
}

TEST(ConfigErrors, BoolNotABool) {
  expect_mentions(yaml_error("chunk_size: 16\n\nenable_hidden_state_cache: maybe\n"),
                  {"enable_hidden_state_cache", "maybe", "line 3"});
  expect_mentions(yaml_error("save_unfull_chunk: 1\n"), {"save_unfull_chunk", "'1'", "line 1"});
  expect_mentions(yaml_error("save_unfull_chunk: 'true'\n"),
                  {"save_unfull_chunk", "true", "line 1"});
}

TEST(ConfigErrors, SizesNotNumbers) {
  expect_mentions(yaml_error("max_local_cpu_size: lots\n"),
                  {"max_local_cpu_size", "lots", "line 1"});
  expect_mentions(yaml_error("max_hidden_state_cpu_size: .inf\n"),
                  {"max_hidden_state_cpu_size", ".inf", "line 1"});
  expect_mentions(yaml_error("max_hidden_state_cpu_size: inf\n"),
                  {"max_hidden_state_cpu_size", "inf", "line 1", "finite"});
  expect_mentions(yaml_error("max_local_cpu_size: 4GiB\n"),
                  {"max_local_cpu_size", "4GiB", "line 1"});
}

TEST(ConfigErrors, NegativeSizes) {
  expect_mentions(yaml_error("chunk_size: 8\nmax_local_cpu_size: -1\n"),
                  {"max_local_cpu_size", "-1", "line 2", ">= 0"});
  expect_mentions(yaml_error("max_hidden_state_cpu_size: -0.5\n"),
                  {"max_hidden_state_cpu_size", "-0.5", "line 1"});
  expect_mentions(yaml_error("hidden_state_block_bytes: -16\n"),
                  {"hidden_state_block_bytes", "-16", "line 1"});
}

TEST(ConfigErrors, SizeTooLargeForBytes) {
  expect_mentions(yaml_error("max_local_cpu_size: 1e20\n"),
                  {"max_local_cpu_size", "'1e20'", "line 1"});
}

TEST(ConfigErrors, EnabledWithoutPool) {
  expect_mentions(yaml_error("enable_hidden_state_cache: true\nmax_hidden_state_cpu_size: 0\n"),
                  {"max_hidden_state_cpu_size", "'0'", "line 2", "enable_hidden_state_cache"});
  // With the size left at its default, the message points at the switch.
  expect_mentions(yaml_error("chunk_size: 16\nenable_hidden_state_cache: true\n"),
                  {"max_hidden_state_cpu_size", "'0'", "enable_hidden_state_cache", "line 2"});
  // Less than one byte is no pool either.
  expect_mentions(yaml_error("enable_hidden_state_cache: true\nmax_hidden_state_cpu_size: 1e-12\n"),
                  {"max_hidden_state_cpu_size", "1e-12", "line 2"});
  // Disabled, a zero pool is fine.
  EXPECT_NO_THROW((void)Config::from_yaml("enable_hidden_state_cache: false\n"));
}

TEST(ConfigErrors, UnknownStorageDType) {
  expect_mentions(yaml_error("chunk_size: 16\nhidden_state_storage_dtype: bfloat16\n"),
                  {"hidden_state_storage_dtype", "bfloat16", "line 2", "float32", "native"});
  expect_mentions(yaml_error("hidden_state_storage_dtype: Float32\n"),
                  {"hidden_state_storage_dtype", "Float32", "line 1"});
}

TEST(ConfigErrors, BlockBytesNotMultipleOf64) {
  expect_mentions(yaml_error("hidden_state_block_bytes: 100\n"),
                  {"hidden_state_block_bytes", "100", "line 1", "64"});
  expect_mentions(yaml_error("hidden_state_block_bytes: 16\n"),
                  {"hidden_state_block_bytes", "16", "line 1", "64"});
  expect_mentions(yaml_error("hidden_state_block_bytes: 134217728\n"),
                  {"hidden_state_block_bytes", "134217728", "64 MiB"});
  expect_mentions(yaml_error("hidden_state_block_bytes: big\n"),
                  {"hidden_state_block_bytes", "big", "line 1"});
  EXPECT_EQ(Config::from_yaml("hidden_state_block_bytes: 64").hidden_state_block_bytes, 64);
}

TEST(ConfigErrors, LayersNotAListOfInts) {
  expect_mentions(yaml_error("hidden_state_layers: 3\n"), {"hidden_state_layers", "3", "line 1"});
  expect_mentions(yaml_error("chunk_size: 16\nhidden_state_layers: [0, x, 2]\n"),
                  {"hidden_state_layers", "[0, x, 2]", "'x'", "line 2"});
  expect_mentions(yaml_error("hidden_state_layers: [0.5]\n"),
                  {"hidden_state_layers", "0.5", "line 1"});
  expect_mentions(yaml_error("hidden_state_layers: {a: 1}\n"),
                  {"hidden_state_layers", "a: 1", "line 1"});
  // In a block list the element's own line is reported.
  expect_mentions(yaml_error("hidden_state_layers:\n  - 1\n  - [2]\n"),
                  {"hidden_state_layers", "[2]", "line 3"});
}

TEST(ConfigErrors, MalformedYaml) {
  expect_mentions(yaml_error("chunk_size: 16\nhidden_state_layers: [0, 1\nfoo: 2\n"),
                  {"malformed YAML", "line 3"});
  expect_mentions(yaml_error("chunk_size: 16\n  bad indent: [\n"), {"malformed YAML", "line "});
}

TEST(ConfigErrors, DocumentNotAMap) {
  expect_mentions(yaml_error("- chunk_size\n- 16\n"), {"map", "chunk_size", "line 1"});
  expect_mentions(yaml_error("just text\n"), {"map", "just text", "line 1"});
}

TEST(ConfigErrors, DuplicateKey) {
  expect_mentions(yaml_error("chunk_size: 16\nsave_unfull_chunk: true\nchunk_size: 32\n"),
                  {"chunk_size", "twice", "32", "line 1", "line 3"});
}

TEST(ConfigErrors, ValidateWithoutSource) {
  Config c;
  c.chunk_size = 0;
  expect_mentions(config_error_of([&] { c.validate(); }), {"chunk_size", "0"});
  c = Config{};
  c.max_local_cpu_size = -2.0;
  expect_mentions(config_error_of([&] { c.validate(); }), {"max_local_cpu_size", "-2"});
  c = Config{};
  c.enable_hidden_state_cache = true;
  expect_mentions(config_error_of([&] { c.validate(); }), {"max_hidden_state_cpu_size", "0"});
  c.max_hidden_state_cpu_size = 0.5;
  EXPECT_NO_THROW(c.validate());
  c.hidden_state_block_bytes = 24;
  expect_mentions(config_error_of([&] { c.validate(); }), {"hidden_state_block_bytes", "24"});
  c = Config{};
  c.hidden_state_storage_dtype = static_cast<StorageDType>(7);
  expect_mentions(config_error_of([&] { c.validate(); }), {"hidden_state_storage_dtype", "7"});
}

TEST(ConfigErrors, IsAnHssError) {
  EXPECT_THROW((void)Config::from_yaml("chunk_size: abc"), hss::Error);
  EXPECT_THROW((void)Config::from_yaml("chunk_size: abc"), std::runtime_error);
}

// ---------------------------------------------------------------------------------------------
// Files

TEST(ConfigFile, ReadsFile) {
  const TempFile file(kFullYaml);
  const Config c = Config::from_file(file.path());
  EXPECT_EQ(c.chunk_size, 128);
  EXPECT_TRUE(c.enable_hidden_state_cache);
  ASSERT_TRUE(c.hidden_state_layers.has_value());
  EXPECT_EQ(*c.hidden_state_layers, (std::vector<int64_t>{0, 3, -1}));
  EXPECT_EQ(c.hidden_state_storage_dtype, StorageDType::kNative);
}

TEST(ConfigFile, EmptyFileGivesDefaults) {
  const TempFile file("");
  expect_defaults(Config::from_file(file.path()));
}

TEST(ConfigFile, MissingFileNamesPath) {
  const std::filesystem::path missing =
      std::filesystem::temp_directory_path() / "hss_test_config_does_not_exist.yaml";
  const std::string msg = config_error_of([&] { (void)Config::from_file(missing); });
  expect_mentions(msg, {missing.string(), "does not exist"});
}

TEST(ConfigFile, DirectoryIsAnError) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string msg = config_error_of([&] { (void)Config::from_file(dir); });
  expect_mentions(msg, {dir.string(), "directory"});
}

TEST(ConfigFile, ErrorsNameFileAndLine) {
  const TempFile bad("chunk_size: 16\n\nchunk_size_typo: 1\nmax_local_cpu_size: -3\n");
  testing::internal::CaptureStderr();
  const std::string msg = config_error_of([&] { (void)Config::from_file(bad.path()); });
  (void)testing::internal::GetCapturedStderr();
  expect_mentions(msg, {bad.path().string(), "max_local_cpu_size", "-3", "line 4"});

  const TempFile invalid("enable_hidden_state_cache: true\n");
  expect_mentions(config_error_of([&] { (void)Config::from_file(invalid.path()); }),
                  {invalid.path().string(), "max_hidden_state_cpu_size", "line 1"});
}

// ---------------------------------------------------------------------------------------------
// Environment

TEST(ConfigEnv, NothingSetGivesDefaults) {
  const CleanEnv clean;
  expect_defaults(Config::from_env());
}

TEST(ConfigEnv, OverridesWithoutFile) {
  const CleanEnv clean;
  const ScopedEnv a("LMCACHE_CHUNK_SIZE", "512");
  const ScopedEnv b("LMCACHE_ENABLE_HIDDEN_STATE_CACHE", "true");
  const ScopedEnv c("LMCACHE_MAX_HIDDEN_STATE_CPU_SIZE", "0.5");
  const ScopedEnv d("LMCACHE_HIDDEN_STATE_LAYERS", "[0, -1]");
  const ScopedEnv e("LMCACHE_HIDDEN_STATE_STORAGE_DTYPE", "native");
  const ScopedEnv f("LMCACHE_HIDDEN_STATE_BLOCK_BYTES", "1024");
  const ScopedEnv g("LMCACHE_SAVE_UNFULL_CHUNK", "True");
  const ScopedEnv h("LMCACHE_MAX_LOCAL_CPU_SIZE", "1");
  const Config cfg = Config::from_env();
  EXPECT_EQ(cfg.chunk_size, 512);
  EXPECT_TRUE(cfg.enable_hidden_state_cache);
  EXPECT_DOUBLE_EQ(cfg.max_hidden_state_cpu_size, 0.5);
  ASSERT_TRUE(cfg.hidden_state_layers.has_value());
  EXPECT_EQ(*cfg.hidden_state_layers, (std::vector<int64_t>{0, -1}));
  EXPECT_EQ(cfg.hidden_state_storage_dtype, StorageDType::kNative);
  EXPECT_EQ(cfg.hidden_state_block_bytes, 1024);
  EXPECT_TRUE(cfg.save_unfull_chunk);
  EXPECT_DOUBLE_EQ(cfg.max_local_cpu_size, 1.0);
}

TEST(ConfigEnv, FileThenSingleKeyOverrides) {
  const CleanEnv clean;
  const TempFile file(kFullYaml);
  const ScopedEnv a("LMCACHE_CONFIG_FILE", file.path().string());
  const ScopedEnv b("LMCACHE_CHUNK_SIZE", "64");
  const ScopedEnv c("LMCACHE_HIDDEN_STATE_LAYERS", "null");
  const Config cfg = Config::from_env();
  EXPECT_EQ(cfg.chunk_size, 64);                      // overridden
  EXPECT_FALSE(cfg.hidden_state_layers.has_value());  // overridden back to unset
  EXPECT_TRUE(cfg.save_unfull_chunk);                 // from the file
  EXPECT_DOUBLE_EQ(cfg.max_local_cpu_size, 2.5);      // from the file
  EXPECT_DOUBLE_EQ(cfg.max_hidden_state_cpu_size, 4.0);
  EXPECT_EQ(cfg.hidden_state_storage_dtype, StorageDType::kNative);
  EXPECT_EQ(cfg.hidden_state_block_bytes, 4096);
}

TEST(ConfigEnv, OverrideCanFixFileCombination) {
  // The file alone is invalid (enabled without a pool); validation runs after the overrides.
  const CleanEnv clean;
  const TempFile file("enable_hidden_state_cache: true\n");
  const ScopedEnv a("LMCACHE_CONFIG_FILE", file.path().string());
  const ScopedEnv b("LMCACHE_MAX_HIDDEN_STATE_CPU_SIZE", "2");
  const Config cfg = Config::from_env();
  EXPECT_TRUE(cfg.enable_hidden_state_cache);
  EXPECT_EQ(cfg.hidden_state_pool_bytes(), 2ull << 30);
}

TEST(ConfigEnv, BadOverrideNamesVariable) {
  const CleanEnv clean;
  {
    const ScopedEnv a("LMCACHE_CHUNK_SIZE", "abc");
    expect_mentions(config_error_of([] { (void)Config::from_env(); }),
                    {"chunk_size", "abc", "LMCACHE_CHUNK_SIZE"});
  }
  {
    const ScopedEnv a("LMCACHE_ENABLE_HIDDEN_STATE_CACHE", "maybe");
    expect_mentions(config_error_of([] { (void)Config::from_env(); }),
                    {"enable_hidden_state_cache", "maybe", "LMCACHE_ENABLE_HIDDEN_STATE_CACHE"});
  }
  {
    const ScopedEnv a("LMCACHE_HIDDEN_STATE_LAYERS", "[0, -1");
    expect_mentions(config_error_of([] { (void)Config::from_env(); }),
                    {"hidden_state_layers", "[0, -1", "LMCACHE_HIDDEN_STATE_LAYERS"});
  }
  {
    const ScopedEnv a("LMCACHE_HIDDEN_STATE_LAYERS", "[0, a]");
    expect_mentions(config_error_of([] { (void)Config::from_env(); }),
                    {"hidden_state_layers", "[0, a]", "LMCACHE_HIDDEN_STATE_LAYERS"});
  }
  {
    const ScopedEnv a("LMCACHE_MAX_LOCAL_CPU_SIZE", "-1");
    expect_mentions(config_error_of([] { (void)Config::from_env(); }),
                    {"max_local_cpu_size", "-1", "LMCACHE_MAX_LOCAL_CPU_SIZE"});
  }
  {
    const ScopedEnv a("LMCACHE_ENABLE_HIDDEN_STATE_CACHE", "true");
    expect_mentions(config_error_of([] { (void)Config::from_env(); }),
                    {"max_hidden_state_cpu_size", "0", "LMCACHE_ENABLE_HIDDEN_STATE_CACHE"});
  }
}

TEST(ConfigEnv, MissingConfigFileNamesPathAndVariable) {
  const CleanEnv clean;
  const std::string missing =
      (std::filesystem::temp_directory_path() / "hss_test_config_env_missing.yaml").string();
  const ScopedEnv a("LMCACHE_CONFIG_FILE", missing);
  expect_mentions(config_error_of([] { (void)Config::from_env(); }),
                  {"LMCACHE_CONFIG_FILE", missing});
}

TEST(ConfigEnv, FileErrorsNameFileAndLine) {
  const CleanEnv clean;
  const TempFile file("save_unfull_chunk: true\nchunk_size: 0\n");
  const ScopedEnv a("LMCACHE_CONFIG_FILE", file.path().string());
  expect_mentions(config_error_of([] { (void)Config::from_env(); }),
                  {"chunk_size", "'0'", "line 2", file.path().string()});
  // An override that fixes the value fixes the load.
  const ScopedEnv b("LMCACHE_CHUNK_SIZE", "32");
  EXPECT_EQ(Config::from_env().chunk_size, 32);
}

TEST(ConfigEnv, UnknownKeysInFileRecorded) {
  const CleanEnv clean;
  const TempFile file("chunk_size: 32\nremote_url: null\n");
  const ScopedEnv a("LMCACHE_CONFIG_FILE", file.path().string());
  testing::internal::CaptureStderr();
  const Config cfg = Config::from_env();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(cfg.chunk_size, 32);
  EXPECT_EQ(cfg.unknown_keys, (std::vector<std::string>{"remote_url"}));
  EXPECT_NE(err.find("unknown config key 'remote_url' (line 2) ignored"), std::string::npos) << err;
}

TEST(ConfigEnv, ScopedEnvRestores) {
  const CleanEnv clean;
  {
    const ScopedEnv a("LMCACHE_CHUNK_SIZE", "8");
    EXPECT_EQ(Config::from_env().chunk_size, 8);
  }
  EXPECT_EQ(std::getenv("LMCACHE_CHUNK_SIZE"), nullptr);
  EXPECT_EQ(Config::from_env().chunk_size, 256);
}

// ---------------------------------------------------------------------------------------------
// to_yaml

void expect_same_fields(const Config& a, const Config& b) {
  EXPECT_EQ(a.chunk_size, b.chunk_size);
  EXPECT_EQ(a.save_unfull_chunk, b.save_unfull_chunk);
  EXPECT_EQ(a.max_local_cpu_size, b.max_local_cpu_size);  // exact: the text must round-trip
  EXPECT_EQ(a.enable_hidden_state_cache, b.enable_hidden_state_cache);
  EXPECT_EQ(a.max_hidden_state_cpu_size, b.max_hidden_state_cpu_size);
  EXPECT_EQ(a.hidden_state_layers, b.hidden_state_layers);
  EXPECT_EQ(a.hidden_state_storage_dtype, b.hidden_state_storage_dtype);
  EXPECT_EQ(a.hidden_state_block_bytes, b.hidden_state_block_bytes);
}

TEST(ConfigToYaml, DefaultsRoundTrip) {
  const Config c;
  const std::string text = c.to_yaml();
  expect_same_fields(Config::from_yaml(text), c);
  EXPECT_NE(text.find("chunk_size: 256\n"), std::string::npos) << text;
  EXPECT_NE(text.find("hidden_state_layers: null\n"), std::string::npos) << text;
  EXPECT_NE(text.find("hidden_state_storage_dtype: float32\n"), std::string::npos) << text;
  EXPECT_NE(text.find("max_local_cpu_size: 5.0\n"), std::string::npos) << text;
}

TEST(ConfigToYaml, EveryFieldRoundTrips) {
  testing::internal::CaptureStderr();
  const Config c = Config::from_yaml(std::string(kFullYaml) + "extra_key: 1\n");
  (void)testing::internal::GetCapturedStderr();
  ASSERT_EQ(c.unknown_keys.size(), 1u);
  const std::string text = c.to_yaml();
  EXPECT_EQ(text.find("extra_key"), std::string::npos) << text;
  const Config back = Config::from_yaml(text);
  expect_same_fields(back, c);
  EXPECT_TRUE(back.unknown_keys.empty());
  EXPECT_NE(text.find("hidden_state_layers: [0, 3, -1]\n"), std::string::npos) << text;
}

TEST(ConfigToYaml, AwkwardDoublesRoundTripExactly) {
  Config c;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = 0.1 + 0.2;  // not representable in few digits
  c.max_local_cpu_size = 1e10;
  c.hidden_state_layers = std::vector<int64_t>{};
  c.hidden_state_block_bytes = 1 << 20;
  const Config back = Config::from_yaml(c.to_yaml());
  expect_same_fields(back, c);
  ASSERT_TRUE(back.hidden_state_layers.has_value());
  EXPECT_TRUE(back.hidden_state_layers->empty());
}

}  // namespace

namespace hss {
namespace {

// Found by the config fuzzer (2026-12-03): a line break inside a string value was written raw
// into its double-quoted scalar, which YAML folds into a space when read back.
TEST(Config, StringsWithControlCharactersRoundTripThroughToYaml) {
  const std::string odd = std::string("a\nb\tc\rd\x01") + '\x7f' + "e\\\"f\xff";
  Config c;
  c.local_disk = "/tmp/" + odd;
  c.hidden_state_mac_key_file = odd + std::string(1, '\0') + "g";
  const std::string yaml = c.to_yaml();
  const Config again = Config::from_yaml(yaml);
  EXPECT_EQ(again.local_disk, c.local_disk);
  EXPECT_EQ(again.hidden_state_mac_key_file, c.hidden_state_mac_key_file);
  EXPECT_EQ(again.to_yaml(), yaml);
  EXPECT_EQ(yaml.find("a\nb"), std::string::npos) << yaml;  // escaped, not raw
}

}  // namespace
}  // namespace hss
