#include "hss/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>

#include "config/config_env.hpp"
#include "config/config_keys.hpp"
#include "config/config_yaml.hpp"
#include "config/copy_threads.hpp"
#include "hss/detail/file_reader.hpp"
#include "hss/error.hpp"

// Loading and writing a Config. What each key is, how its value reads and writes and what it
// may hold is the key table's (config_keys.cpp); this file walks documents, files and the
// environment through it.

namespace hss {
namespace {

using detail::KeyOrigins;
using detail::KeySource;
using detail::KeySpec;

constexpr double kBytesPerGiB = 1073741824.0;  // 2^30
// 2^64 as a double: the first byte count a uint64_t cannot hold.
constexpr double kUint64Limit = 18446744073709551616.0;

uint64_t gib_to_bytes(double gib) {
  // validate() rejects what is clamped here; the accessors stay total for unvalidated Configs.
  if (!(gib > 0.0)) return 0;
  const double bytes = std::floor(gib * kBytesPerGiB);
  if (bytes >= kUint64Limit) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(bytes);
}

const KeySpec& spec_of(std::string_view key) {
  const KeySpec* spec = detail::find_key(key);
  if (spec == nullptr)
    throw InvalidArgument("config key '" + std::string(key) + "' is not one hsstore reads");
  return *spec;
}

// Parses YAML text into cfg, recording where each key came from. Does not validate.
void parse_document(Config& cfg, KeyOrigins& origins, std::string_view yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    throw ConfigError("malformed YAML at " + detail::line_of(e.mark) + ", column " +
                      std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  if (root.IsNull()) return;  // empty document, or only comments: every key keeps its default
  if (!root.IsMap()) {
    throw ConfigError("config document must be a map of keys to values, got '" +
                      detail::describe(root) + "' (" + detail::line_of(root.Mark()) + ")");
  }
  std::map<std::string, std::string, std::less<>> seen;  // key -> line, to report duplicates
  for (const auto& pair : root) {
    const YAML::Node& key_node = pair.first;
    // The key's line, not the value's: a missing value (`key:`) is marked on the next line.
    const std::string where = detail::line_of(key_node.Mark());
    if (!key_node.IsScalar()) {
      throw ConfigError("config key '" + detail::describe(key_node) + "' is not a string (" +
                        where + ")");
    }
    const std::string& key = key_node.Scalar();
    if (const auto [it, inserted] = seen.emplace(key, where); !inserted) {
      // yaml-cpp keeps both entries; silently taking either would surprise someone.
      throw ConfigError("config key '" + key + "' appears twice, got '" +
                        detail::describe(pair.second) + "' (" + it->second + " and " + where + ")");
    }
    if (const KeySpec* spec = detail::find_key(key)) {
      spec->parse(cfg, key, pair.second, detail::ValueWhere{where, /*is_line=*/true});
      origins[key] = KeySource{where, detail::describe(pair.second)};
    } else {
      std::cerr << "hss: warning: unknown config key '" << key << "' (" << where << ") ignored\n";
      cfg.unknown_keys.push_back(key);
    }
  }
}

void parse_file(Config& cfg, KeyOrigins& origins, const std::filesystem::path& path) {
  const std::string name = path.string();
  std::string text;
  try {
    // Regular files only, at most 64 MiB (hss/detail/file_reader.hpp): a FIFO, a device or
    // /proc/self/mem is refused before a byte is read.
    text = detail::read_regular_file(path, "config file");
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
  try {
    parse_document(cfg, origins, text);
  } catch (const ConfigError& e) {
    throw ConfigError("config file '" + name + "': " + e.what());
  }
  // Validation runs later, possibly after environment overrides, so each key carries its file.
  for (auto& [key, source] : origins) source.where += " of config file '" + name + "'";
}

std::string env_name(std::string_view key) {
  std::string name = "LMCACHE_";
  for (const char c : key) name += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace

std::string_view to_string(StorageDType dtype) {
  switch (dtype) {
    case StorageDType::kFloat32:
      return "float32";
    case StorageDType::kNative:
      return "native";
    case StorageDType::kFp8E4M3:
      return "fp8_e4m3";
    case StorageDType::kFp8E5M2:
      return "fp8_e5m2";
  }
  return "unknown";
}

std::string_view to_string(RestoreImpl impl) {
  switch (impl) {
    case RestoreImpl::kKernel:
      return "kernel";
    case RestoreImpl::kCopyEngine:
      return "copy_engine";
    case RestoreImpl::kCub:
      return "cub";
  }
  return "unknown";
}

std::optional<RestoreImpl> restore_impl_from_string(std::string_view name) {
  for (RestoreImpl impl : {RestoreImpl::kKernel, RestoreImpl::kCopyEngine, RestoreImpl::kCub}) {
    if (name == to_string(impl)) return impl;
  }
  return std::nullopt;
}

std::string_view to_string(StoreImpl impl) {
  switch (impl) {
    case StoreImpl::kStaging:
      return "staging";
    case StoreImpl::kMapped:
      return "mapped";
  }
  return "unknown";
}

std::string_view to_string(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      return "off";
  }
  return "unknown";
}

std::optional<LogLevel> log_level_from_string(std::string_view name) {
  for (LogLevel level :
       {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError, LogLevel::kOff}) {
    if (name == to_string(level)) return level;
  }
  return std::nullopt;
}

std::string_view to_string(TransferKind kind) {
  switch (kind) {
    case TransferKind::kNone:
      return "none";
    case TransferKind::kNixl:
      return "nixl";
  }
  return "unknown";
}

std::optional<TransferKind> transfer_kind_from_string(std::string_view name) {
  for (TransferKind kind : {TransferKind::kNone, TransferKind::kNixl}) {
    if (name == to_string(kind)) return kind;
  }
  return std::nullopt;
}

std::optional<StoreImpl> store_impl_from_string(std::string_view name) {
  for (StoreImpl impl : {StoreImpl::kStaging, StoreImpl::kMapped}) {
    if (name == to_string(impl)) return impl;
  }
  return std::nullopt;
}

Config::Config() = default;
Config::Config(const Config&) = default;
Config::Config(Config&&) noexcept = default;
Config& Config::operator=(const Config&) = default;
Config& Config::operator=(Config&&) noexcept = default;
Config::~Config() = default;

Config Config::from_yaml(std::string_view yaml_text) {
  Config cfg;
  KeyOrigins origins;
  parse_document(cfg, origins, yaml_text);
  detail::validate_keys(cfg, origins);
  return cfg;
}

Config Config::from_file(const std::filesystem::path& path) {
  Config cfg;
  KeyOrigins origins;
  parse_file(cfg, origins, path);
  detail::validate_keys(cfg, origins);
  return cfg;
}

Config Config::from_env() {
  Config cfg;
  KeyOrigins origins;
  if (const char* file = std::getenv("LMCACHE_CONFIG_FILE"); file != nullptr && *file != '\0') {
    try {
      parse_file(cfg, origins, file);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("LMCACHE_CONFIG_FILE: ") + e.what());
    }
  }
  // Only hsstore's own keys are looked up: the environment of an LMCache worker carries many
  // LMCACHE_* variables meant for LMCache itself, and warning about each would be noise.
  for (const KeySpec& spec : detail::key_table()) {
    const std::string var = env_name(spec.name);
    const char* raw = std::getenv(var.c_str());
    if (raw == nullptr) continue;
    const std::string where = "environment variable " + var;
    YAML::Node value;
    try {
      // Parsed as YAML so "[0, -1]" is a list and "true" a bool, as in the file.
      value = YAML::Load(raw);
    } catch (const YAML::Exception& e) {
      detail::fail_config_key(spec.name, "malformed YAML value (" + e.msg + ")", raw, where);
    }
    spec.parse(cfg, spec.name, value, detail::ValueWhere{where, /*is_line=*/false});
    origins[std::string(spec.name)] = KeySource{where, raw};
  }
  // Last, as for any store: the HSS_* debugging variables win over every source.
  detail::apply_env_overrides(cfg);
  detail::validate_keys(cfg, origins);
  return cfg;
}

Config Config::with_env_overrides() const {
  Config cfg = *this;
  detail::apply_env_overrides(cfg);
  return cfg;
}

void Config::validate() const { detail::validate_keys(*this, KeyOrigins{}); }

uint64_t Config::hidden_state_pool_bytes() const { return gib_to_bytes(max_hidden_state_cpu_size); }

uint64_t Config::device_cache_bytes() const {
  return gib_to_bytes(hidden_state_device_cache_size);
}
uint64_t Config::kv_pool_bytes() const { return gib_to_bytes(max_local_cpu_size); }

uint64_t Config::disk_tier_bytes() const { return gib_to_bytes(max_local_disk_size); }

std::string Config::hidden_state_disk_dir() const {
  // Read as LMCache's _parse_local_disk reads local_disk: comma-separated paths, each maybe
  // prefixed with file:// (stripped, so "file://local_disk/" is relative). Hidden states take the
  // first (an engine that stripes KV over several disks keeps its hidden states on one).
  const std::string& value = hidden_state_disk_path.empty() ? local_disk : hidden_state_disk_path;
  const std::vector<std::string_view> dirs = detail::disk_paths(value);
  if (dirs.empty()) return {};
  std::string dir(dirs.front());
  if (dir.back() != '/') dir += '/';
  return dir + "hsstore";
}

bool Config::layer_allowed(int64_t layer_idx) const {
  return !hidden_state_layers ||
         std::ranges::find(*hidden_state_layers, layer_idx) != hidden_state_layers->end();
}

bool Config::slot_allowed(ActivationKind kind, int64_t layer_idx) const {
  return layer_allowed(layer_idx) &&
         (!hidden_state_kinds ||
          std::ranges::find(*hidden_state_kinds, kind) != hidden_state_kinds->end());
}

std::span<const std::string_view> Config::keys() { return detail::key_names(); }

std::string_view Config::doc(std::string_view key) { return spec_of(key).doc; }

ConfigValue Config::value(std::string_view key) const { return spec_of(key).value(*this); }

std::string Config::to_yaml() const {
  std::string out;
  for (const KeySpec& spec : detail::key_table()) {
    if (spec.secret) {
      // The inline MAC key is a secret: never printed (a config reloaded from this text names
      // the key file instead, or needs the key set again).
      if (spec.value(*this) != ConfigValue(std::string())) {
        out += "# " + std::string(spec.name) + ": set (not shown)\n";
      }
      continue;
    }
    out += std::string(spec.name) + ": " + spec.format(*this);
    // The debugging variable that set the value, so the text says why it differs from the
    // config's source (a comment: the text still round-trips).
    for (const std::string& variable : env_overrides) {
      if (detail::key_overridden_by(variable) == spec.name) out += "  # " + variable;
    }
    out += "\n";
  }
  return out;
}

int64_t Config::effective_copy_threads() const {
  return detail::choose_copy_threads(tuning.copy_threads, detail::this_thread_cpu_budget()).threads;
}

}  // namespace hss
