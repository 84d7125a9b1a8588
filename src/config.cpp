#include "hss/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <system_error>

#include "hss/detail/checked.hpp"
#include "hss/detail/file_reader.hpp"
#include "hss/error.hpp"
#include "redis_url.hpp"

namespace hss {
namespace {

constexpr double kBytesPerGiB = 1073741824.0;  // 2^30
// 2^64 as a double: the first byte count a uint64_t cannot hold.
constexpr double kUint64Limit = 18446744073709551616.0;
// hidden_state_block_bytes: the pool granule override (BlockPool: a multiple of 64, <= 64 MiB).
constexpr int64_t kBlockGranule = 64;
constexpr int64_t kMaxBlockBytes = int64_t{64} << 20;

constexpr std::string_view kChunkSize = "chunk_size";
constexpr std::string_view kSaveUnfullChunk = "save_unfull_chunk";
constexpr std::string_view kMaxLocalCpuSize = "max_local_cpu_size";
constexpr std::string_view kEnableHiddenStateCache = "enable_hidden_state_cache";
constexpr std::string_view kMaxHiddenStateCpuSize = "max_hidden_state_cpu_size";
constexpr std::string_view kHiddenStateLayers = "hidden_state_layers";
constexpr std::string_view kHiddenStateStorageDType = "hidden_state_storage_dtype";
constexpr std::string_view kHiddenStateBlockBytes = "hidden_state_block_bytes";
constexpr std::string_view kHiddenStateRemoteUrl = "hidden_state_remote_url";
constexpr std::string_view kHiddenStateRemoteTtlS = "hidden_state_remote_ttl_s";
constexpr std::string_view kHiddenStateRemoteTimeoutMs = "hidden_state_remote_timeout_ms";
constexpr std::string_view kHiddenStateRemoteQueueBytes = "hidden_state_remote_queue_bytes";
constexpr std::string_view kHiddenStateKinds = "hidden_state_kinds";
constexpr std::string_view kHiddenStateMacKey = "hidden_state_mac_key";
constexpr std::string_view kHiddenStateMacKeyFile = "hidden_state_mac_key_file";
constexpr std::string_view kHiddenStateTransfer = "hidden_state_transfer";
constexpr std::string_view kHiddenStateTransferBackend = "hidden_state_transfer_backend";
constexpr std::string_view kHiddenStateTransferLeaseMs = "hidden_state_transfer_lease_ms";
constexpr std::string_view kHiddenStateTransferTimeoutMs = "hidden_state_transfer_timeout_ms";
constexpr std::string_view kHiddenStateTransferListen = "hidden_state_transfer_listen";
constexpr std::string_view kHiddenStateRestoreImpl = "hidden_state_restore_impl";
constexpr std::string_view kHiddenStateStoreImpl = "hidden_state_store_impl";
constexpr std::string_view kHiddenStateStagingBytes = "hidden_state_staging_bytes";
constexpr std::string_view kHiddenStateLaunchSlots = "hidden_state_launch_slots";
constexpr std::string_view kHiddenStateDevice = "hidden_state_device";
constexpr std::string_view kHiddenStateOutputCacheBytes = "hidden_state_output_cache_bytes";
constexpr std::string_view kHiddenStateStreamThresholdBytes = "hidden_state_stream_threshold_bytes";
constexpr std::string_view kHiddenStateCopyThreads = "hidden_state_copy_threads";
constexpr int64_t kMaxCopyThreads = 64;

// Where a value came from and how it was written, so validation errors can quote the input
// rather than a reformatted number. `where` reads "line 3" or "environment variable X". Keys
// absent from the map kept their defaults (or were set in code): messages cannot point anywhere.
struct Source {
  std::string where;
  std::string text;
};
using Origins = std::map<std::string, Source, std::less<>>;

uint64_t gib_to_bytes(double gib) {
  // validate() rejects what is clamped here; the accessors stay total for unvalidated Configs.
  if (!(gib > 0.0)) return 0;
  const double bytes = std::floor(gib * kBytesPerGiB);
  if (bytes >= kUint64Limit) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(bytes);
}

std::string format_double(double value) {
  std::array<char, 64> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value);
  if (ec != std::errc{}) return "?";
  std::string text(buf.data(), end);
  // Shortest round-trip output may lack a '.', and "5" or "1e+20" read as an int or a string to
  // YAML 1.1 readers (PyYAML); LMCache's tools should see a float.
  if (std::isfinite(value) && text.find('.') == std::string::npos) {
    const auto exp = text.find('e');
    text.insert(exp == std::string::npos ? text.size() : exp, ".0");
  }
  return text;
}

// Renders a node for an error message, shortened so a huge flow sequence cannot flood the log.
std::string describe(const YAML::Node& node) {
  std::string text;
  if (!node.IsDefined() || node.IsNull()) {
    text = "null";
  } else if (node.IsScalar()) {
    text = node.Scalar();
  } else {
    // One line in a message, whatever style the input used.
    YAML::Node flow = YAML::Clone(node);
    flow.SetStyle(YAML::EmitterStyle::Flow);
    YAML::Emitter emitter;
    emitter << flow;
    text = emitter.c_str();
  }
  constexpr size_t kMaxShown = 80;
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown) + "...";
  return text;
}

std::string line_of(const YAML::Mark& mark) {
  // yaml-cpp counts lines from 0; editors and users count from 1.
  return mark.is_null() ? std::string("unknown line") : "line " + std::to_string(mark.line + 1);
}

[[noreturn]] void fail(std::string_view key, std::string_view problem, std::string_view value,
                       std::string_view where) {
  std::string msg = "config key '" + std::string(key) + "': " + std::string(problem) + ", got '" +
                    std::string(value) + "'";
  if (!where.empty()) msg += " (" + std::string(where) + ")";
  throw ConfigError(msg);
}

// A quoted scalar is a string in YAML even when it looks like a number (PyYAML hands LMCache a
// str for chunk_size: "256"), so numeric and boolean keys take plain scalars only.
bool is_plain_scalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

std::string lower(std::string_view text) {
  std::string out(text);
  std::ranges::transform(out, out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::optional<int64_t> parse_int_text(std::string_view text) {
  bool negative = false;
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    base = 16;
    text.remove_prefix(2);
  }
  if (text.empty()) return std::nullopt;
  uint64_t magnitude = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), magnitude, base);
  if (ec != std::errc{} || ptr != text.data() + text.size()) return std::nullopt;
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (negative) {
    if (magnitude > kMax + 1) return std::nullopt;
    return magnitude == kMax + 1 ? std::numeric_limits<int64_t>::min()
                                 : -static_cast<int64_t>(magnitude);
  }
  if (magnitude > kMax) return std::nullopt;
  return static_cast<int64_t>(magnitude);
}

int64_t parse_int(std::string_view key, const YAML::Node& node, std::string_view where) {
  if (is_plain_scalar(node)) {
    if (auto value = parse_int_text(node.Scalar())) return *value;
  }
  fail(key, "expected an integer", describe(node), where);
}

double parse_double(std::string_view key, const YAML::Node& node, std::string_view where) {
  if (is_plain_scalar(node)) {
    std::string_view text = node.Scalar();
    if (!text.empty() && text.front() == '+') text.remove_prefix(1);
    double value = 0.0;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec == std::errc{} && ptr == text.data() + text.size() && !text.empty()) {
      if (!std::isfinite(value)) fail(key, "expected a finite number", describe(node), where);
      return value;
    }
  }
  fail(key, "expected a number", describe(node), where);
}

// An integer, or `auto` / null for "chosen by hsstore" (unset).
std::optional<int64_t> parse_auto_int(std::string_view key, const YAML::Node& node,
                                      std::string_view where) {
  if (node.IsNull() || (node.IsScalar() && lower(node.Scalar()) == "auto")) return std::nullopt;
  if (is_plain_scalar(node)) {
    if (auto value = parse_int_text(node.Scalar())) return *value;
  }
  fail(key, "expected an integer, auto or null", describe(node), where);
}

bool parse_bool(std::string_view key, const YAML::Node& node, std::string_view where) {
  if (is_plain_scalar(node)) {
    // The YAML 1.1 spellings, as PyYAML reads LMCache's files.
    const std::string text = lower(node.Scalar());
    if (text == "true" || text == "yes" || text == "on") return true;
    if (text == "false" || text == "no" || text == "off") return false;
  }
  fail(key, "expected true or false", describe(node), where);
}

StorageDType parse_dtype(std::string_view key, const YAML::Node& node, std::string_view where) {
  if (node.IsScalar()) {
    if (node.Scalar() == to_string(StorageDType::kFloat32)) return StorageDType::kFloat32;
    if (node.Scalar() == to_string(StorageDType::kNative)) return StorageDType::kNative;
  }
  fail(key, "expected 'float32' or 'native'", describe(node), where);
}

RestoreImpl parse_restore_impl(std::string_view key, const YAML::Node& node,
                               std::string_view where) {
  if (node.IsScalar()) {
    if (const auto impl = restore_impl_from_string(node.Scalar())) return *impl;
  }
  fail(key, "expected 'kernel', 'copy_engine' or 'cub'", describe(node), where);
}

StoreImpl parse_store_impl(std::string_view key, const YAML::Node& node, std::string_view where) {
  if (node.IsScalar()) {
    if (const auto impl = store_impl_from_string(node.Scalar())) return *impl;
  }
  fail(key, "expected 'staging' or 'mapped'", describe(node), where);
}

std::string parse_string(std::string_view key, const YAML::Node& node, std::string_view where) {
  if (node.IsNull()) return {};
  if (!node.IsScalar()) fail(key, "expected a string", describe(node), where);
  return node.Scalar();
}

TransferKind parse_transfer(std::string_view key, const YAML::Node& node, std::string_view where) {
  if (node.IsNull()) return TransferKind::kNone;
  if (node.IsScalar()) {
    if (const auto kind = transfer_kind_from_string(node.Scalar())) return *kind;
  }
  fail(key, "expected 'none' or 'nixl'", describe(node), where);
}

std::optional<std::vector<int64_t>> parse_layers(std::string_view key, const YAML::Node& node,
                                                 std::string_view where, bool where_is_line) {
  if (node.IsNull()) return std::nullopt;
  if (!node.IsSequence()) fail(key, "expected a list of integers or null", describe(node), where);
  std::vector<int64_t> layers;
  layers.reserve(node.size());
  for (const YAML::Node& item : node) {
    std::optional<int64_t> value;
    if (is_plain_scalar(item)) value = parse_int_text(item.Scalar());
    if (!value) {
      // In a block sequence the offending element may sit lines below the key.
      const std::string item_where = where_is_line ? line_of(item.Mark()) : std::string(where);
      fail(key, "expected a list of integers or null (element '" + describe(item) + "' is not one)",
           describe(node), item_where);
    }
    layers.push_back(*value);
  }
  return layers;
}

// A URL or a list of URLs (null or an empty list: no remote tier). Checked in validate().
std::vector<std::string> parse_urls(std::string_view key, const YAML::Node& node,
                                    std::string_view where) {
  if (node.IsNull()) return {};
  if (node.IsScalar()) return {node.Scalar()};
  if (!node.IsSequence()) fail(key, "expected a URL or a list of URLs", describe(node), where);
  std::vector<std::string> urls;
  for (const YAML::Node& item : node) {
    if (!item.IsScalar()) fail(key, "expected a URL or a list of URLs", describe(node), where);
    urls.push_back(item.Scalar());
  }
  return urls;
}

std::optional<std::vector<ActivationKind>> parse_kinds(std::string_view key, const YAML::Node& node,
                                                       std::string_view where) {
  if (node.IsNull()) return std::nullopt;
  constexpr std::string_view kExpected =
      "expected a list of kinds (hidden, query, key, value, mlp_intermediate) or null";
  if (!node.IsSequence()) fail(key, kExpected, describe(node), where);
  std::vector<ActivationKind> kinds;
  for (const YAML::Node& item : node) {
    const auto kind = item.IsScalar() ? activation_kind_from_string(item.Scalar()) : std::nullopt;
    if (!kind) fail(key, kExpected, describe(node), where);
    kinds.push_back(*kind);
  }
  return kinds;
}

// Applies one key. False when hsstore does not know the key.
bool apply_key(Config& cfg, std::string_view key, const YAML::Node& value, std::string_view where,
               bool where_is_line) {
  if (key == kChunkSize) {
    cfg.chunk_size = parse_int(key, value, where);
  } else if (key == kSaveUnfullChunk) {
    cfg.save_unfull_chunk = parse_bool(key, value, where);
  } else if (key == kMaxLocalCpuSize) {
    cfg.max_local_cpu_size = parse_double(key, value, where);
  } else if (key == kEnableHiddenStateCache) {
    cfg.enable_hidden_state_cache = parse_bool(key, value, where);
  } else if (key == kMaxHiddenStateCpuSize) {
    cfg.max_hidden_state_cpu_size = parse_double(key, value, where);
  } else if (key == kHiddenStateLayers) {
    cfg.hidden_state_layers = parse_layers(key, value, where, where_is_line);
  } else if (key == kHiddenStateStorageDType) {
    cfg.hidden_state_storage_dtype = parse_dtype(key, value, where);
  } else if (key == kHiddenStateBlockBytes) {
    cfg.hidden_state_block_bytes = parse_int(key, value, where);
  } else if (key == kHiddenStateRemoteUrl) {
    cfg.hidden_state_remote_url = parse_urls(key, value, where);
  } else if (key == kHiddenStateRemoteTtlS) {
    cfg.hidden_state_remote_ttl_s = parse_int(key, value, where);
  } else if (key == kHiddenStateRemoteTimeoutMs) {
    cfg.hidden_state_remote_timeout_ms = parse_int(key, value, where);
  } else if (key == kHiddenStateRemoteQueueBytes) {
    cfg.hidden_state_remote_queue_bytes = parse_int(key, value, where);
  } else if (key == kHiddenStateKinds) {
    cfg.hidden_state_kinds = parse_kinds(key, value, where);
  } else if (key == kHiddenStateMacKey) {
    cfg.hidden_state_mac_key = parse_string(key, value, where);
  } else if (key == kHiddenStateMacKeyFile) {
    cfg.hidden_state_mac_key_file = parse_string(key, value, where);
  } else if (key == kHiddenStateTransfer) {
    cfg.hidden_state_transfer = parse_transfer(key, value, where);
  } else if (key == kHiddenStateTransferBackend) {
    cfg.hidden_state_transfer_backend = parse_string(key, value, where);
  } else if (key == kHiddenStateTransferLeaseMs) {
    cfg.hidden_state_transfer_lease_ms = parse_int(key, value, where);
  } else if (key == kHiddenStateTransferTimeoutMs) {
    cfg.hidden_state_transfer_timeout_ms = parse_int(key, value, where);
  } else if (key == kHiddenStateTransferListen) {
    cfg.hidden_state_transfer_listen = parse_string(key, value, where);
  } else if (key == kHiddenStateRestoreImpl) {
    cfg.hidden_state_restore_impl = parse_restore_impl(key, value, where);
  } else if (key == kHiddenStateStoreImpl) {
    cfg.hidden_state_store_impl = parse_store_impl(key, value, where);
  } else if (key == kHiddenStateStagingBytes) {
    cfg.hidden_state_staging_bytes = parse_int(key, value, where);
  } else if (key == kHiddenStateLaunchSlots) {
    cfg.hidden_state_launch_slots = parse_int(key, value, where);
  } else if (key == kHiddenStateDevice) {
    cfg.hidden_state_device = parse_int(key, value, where);
  } else if (key == kHiddenStateOutputCacheBytes) {
    cfg.hidden_state_output_cache_bytes = parse_int(key, value, where);
  } else if (key == kHiddenStateStreamThresholdBytes) {
    cfg.hidden_state_stream_threshold_bytes = parse_auto_int(key, value, where);
  } else if (key == kHiddenStateCopyThreads) {
    cfg.hidden_state_copy_threads = parse_int(key, value, where);
  } else {
    return false;
  }
  return true;
}

constexpr std::array kKnownKeys = {kChunkSize,
                                   kSaveUnfullChunk,
                                   kMaxLocalCpuSize,
                                   kEnableHiddenStateCache,
                                   kMaxHiddenStateCpuSize,
                                   kHiddenStateLayers,
                                   kHiddenStateStorageDType,
                                   kHiddenStateBlockBytes,
                                   kHiddenStateRemoteUrl,
                                   kHiddenStateRemoteTtlS,
                                   kHiddenStateRemoteTimeoutMs,
                                   kHiddenStateRemoteQueueBytes,
                                   kHiddenStateKinds,
                                   kHiddenStateMacKey,
                                   kHiddenStateMacKeyFile,
                                   kHiddenStateTransfer,
                                   kHiddenStateTransferBackend,
                                   kHiddenStateTransferLeaseMs,
                                   kHiddenStateTransferTimeoutMs,
                                   kHiddenStateTransferListen,
                                   kHiddenStateRestoreImpl,
                                   kHiddenStateStoreImpl,
                                   kHiddenStateStagingBytes,
                                   kHiddenStateLaunchSlots,
                                   kHiddenStateDevice,
                                   kHiddenStateOutputCacheBytes,
                                   kHiddenStateStreamThresholdBytes,
                                   kHiddenStateCopyThreads};

std::string origin_of(const Origins& origins, std::string_view key) {
  const auto it = origins.find(key);
  return it == origins.end() ? std::string() : it->second.where;
}

std::string text_of(const Origins& origins, std::string_view key, std::string formatted) {
  const auto it = origins.find(key);
  return it == origins.end() ? formatted : it->second.text;
}

// Messages show a number as typed, or else in its shortest form (no ".0" added as for YAML).
std::string plain_double(double value) {
  std::array<char, 64> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value);
  return ec == std::errc{} ? std::string(buf.data(), end) : std::string("?");
}

// Fails naming the key as it was given (its text and place) when it came from the input.
[[noreturn]] void fail_key(const Origins& origins, std::string_view key, std::string_view problem,
                           std::string formatted) {
  fail(key, problem, text_of(origins, key, std::move(formatted)), origin_of(origins, key));
}

void check_gib(const Origins& origins, std::string_view key, double gib) {
  if (!std::isfinite(gib)) {
    fail_key(origins, key, "must be a finite number of GiB", plain_double(gib));
  }
  if (gib < 0.0) fail_key(origins, key, "must be >= 0 (GiB)", plain_double(gib));
  if (gib * kBytesPerGiB >= kUint64Limit) {
    fail_key(origins, key, "must be less than 2^34 GiB", plain_double(gib));
  }
}

void validate_remote(const Config& cfg, const Origins& origins) {
  try {
    (void)detail::parse_redis_urls(cfg.hidden_state_remote_url);
  } catch (const ConfigError& e) {
    // The parser masks passwords; the origin is where the list came from.
    std::string msg = "config key '" + std::string(kHiddenStateRemoteUrl) + "': " + e.what();
    if (const std::string where = origin_of(origins, kHiddenStateRemoteUrl); !where.empty()) {
      msg += " (" + where + ")";
    }
    throw ConfigError(msg);
  }
  if (cfg.hidden_state_remote_ttl_s < 0) {
    fail_key(origins, kHiddenStateRemoteTtlS, "must be >= 0 seconds (0 = no expiry)",
             std::to_string(cfg.hidden_state_remote_ttl_s));
  }
  // Bounded so the timeout fits a timeval and a stuck server cannot hold a caller for long.
  constexpr int64_t kMaxTimeoutMs = 600000;
  if (cfg.hidden_state_remote_timeout_ms <= 0 ||
      cfg.hidden_state_remote_timeout_ms > kMaxTimeoutMs) {
    fail_key(origins, kHiddenStateRemoteTimeoutMs, "must be in [1, 600000] milliseconds",
             std::to_string(cfg.hidden_state_remote_timeout_ms));
  }
  if (cfg.hidden_state_remote_queue_bytes < 0) {
    fail_key(origins, kHiddenStateRemoteQueueBytes, "must be >= 0 bytes (0 = no write-behind)",
             std::to_string(cfg.hidden_state_remote_queue_bytes));
  }
}

// The MAC key and the point-to-point transfer (src/value_mac.hpp, hsstore.nixl).
void validate_transfer(const Config& cfg, const Origins& origins) {
  if (!cfg.hidden_state_mac_key.empty() && !cfg.hidden_state_mac_key_file.empty()) {
    fail_key(origins, kHiddenStateMacKeyFile,
             "set at most one of hidden_state_mac_key and hidden_state_mac_key_file",
             cfg.hidden_state_mac_key_file);
  }
  // The key itself is never quoted in a message.
  constexpr size_t kMinKeyBytes = 16;
  if (!cfg.hidden_state_mac_key.empty() && cfg.hidden_state_mac_key.size() < kMinKeyBytes) {
    fail(kHiddenStateMacKey, "must be at least 16 bytes (128 bits)",
         "<" + std::to_string(cfg.hidden_state_mac_key.size()) + " bytes>",
         origin_of(origins, kHiddenStateMacKey));
  }
  if (to_string(cfg.hidden_state_transfer) == "unknown") {
    fail_key(origins, kHiddenStateTransfer, "unknown transfer",
             std::to_string(static_cast<int>(cfg.hidden_state_transfer)));
  }
  const std::string& backend = cfg.hidden_state_transfer_backend;
  if (backend.empty() || backend.size() > 64 || !std::ranges::all_of(backend, [](unsigned char c) {
        return std::isalnum(c) != 0 || c == '_';
      })) {
    fail_key(origins, kHiddenStateTransferBackend,
             "must be a NIXL backend name (letters, digits, '_'), e.g. 'UCX'", backend);
  }
  if (cfg.hidden_state_transfer_lease_ms < 1 || cfg.hidden_state_transfer_lease_ms > 3600000) {
    fail_key(origins, kHiddenStateTransferLeaseMs, "must be in [1, 3600000] milliseconds",
             std::to_string(cfg.hidden_state_transfer_lease_ms));
  }
  if (cfg.hidden_state_transfer_timeout_ms < 1 || cfg.hidden_state_transfer_timeout_ms > 600000) {
    fail_key(origins, kHiddenStateTransferTimeoutMs, "must be in [1, 600000] milliseconds",
             std::to_string(cfg.hidden_state_transfer_timeout_ms));
  }
  const std::string& listen = cfg.hidden_state_transfer_listen;
  const size_t colon = listen.rfind(':');
  const std::optional<int64_t> port =
      colon == std::string::npos ? std::nullopt : parse_int_text(listen.substr(colon + 1));
  if (colon == 0 || colon == std::string::npos || !port || *port < 0 || *port > 65535) {
    fail_key(origins, kHiddenStateTransferListen, "must be host:port with a port in 0..65535",
             listen);
  }
}

void validate_with(const Config& cfg, const Origins& origins) {
  if (cfg.chunk_size <= 0) {
    fail_key(origins, kChunkSize, "must be > 0", std::to_string(cfg.chunk_size));
  }
  // The documented limit (hss/detail/checked.hpp): keeps chunk byte counts far from overflow.
  if (cfg.chunk_size > limits::kMaxChunkSize) {
    fail_key(origins, kChunkSize, "must be <= 1048576 (2^20 tokens)",
             std::to_string(cfg.chunk_size));
  }
  check_gib(origins, kMaxLocalCpuSize, cfg.max_local_cpu_size);
  check_gib(origins, kMaxHiddenStateCpuSize, cfg.max_hidden_state_cpu_size);
  if (cfg.kv_pool_bytes() == 0) {
    fail_key(origins, kMaxLocalCpuSize, "must be > 0 (the KV pool needs at least one byte)",
             plain_double(cfg.max_local_cpu_size));
  }
  if (cfg.enable_hidden_state_cache && cfg.hidden_state_pool_bytes() == 0) {
    constexpr std::string_view kProblem =
        "must be > 0 (at least one byte) when enable_hidden_state_cache is true";
    if (origins.contains(kMaxHiddenStateCpuSize)) {
      fail_key(origins, kMaxHiddenStateCpuSize, kProblem,
               plain_double(cfg.max_hidden_state_cpu_size));
    }
    // The size was left at its default; then the switch is what to point at.
    std::string where = "not set";
    if (const std::string enable_where = origin_of(origins, kEnableHiddenStateCache);
        !enable_where.empty()) {
      where += "; enable_hidden_state_cache from " + enable_where;
    }
    fail(kMaxHiddenStateCpuSize, kProblem, plain_double(cfg.max_hidden_state_cpu_size), where);
  }
  if (cfg.hidden_state_block_bytes < 0 || cfg.hidden_state_block_bytes % kBlockGranule != 0 ||
      cfg.hidden_state_block_bytes > kMaxBlockBytes) {
    fail_key(origins, kHiddenStateBlockBytes,
             "must be 0 (automatic granule) or a positive multiple of 64 up to 64 MiB",
             std::to_string(cfg.hidden_state_block_bytes));
  }
  if (cfg.hidden_state_storage_dtype != StorageDType::kFloat32 &&
      cfg.hidden_state_storage_dtype != StorageDType::kNative) {
    // Only reachable for a Config built in code: parsing accepts the two names alone.
    fail_key(origins, kHiddenStateStorageDType, "unknown storage dtype",
             std::to_string(static_cast<int>(cfg.hidden_state_storage_dtype)));
  }
  validate_remote(cfg, origins);
  validate_transfer(cfg, origins);
  if (to_string(cfg.hidden_state_restore_impl) == "unknown") {
    fail_key(origins, kHiddenStateRestoreImpl, "unknown restore implementation",
             std::to_string(static_cast<int>(cfg.hidden_state_restore_impl)));
  }
  if (to_string(cfg.hidden_state_store_impl) == "unknown") {
    fail_key(origins, kHiddenStateStoreImpl, "unknown store implementation",
             std::to_string(static_cast<int>(cfg.hidden_state_store_impl)));
  }
  if (cfg.hidden_state_staging_bytes <= 0) {
    fail_key(origins, kHiddenStateStagingBytes, "must be > 0 (bytes of staging per device)",
             std::to_string(cfg.hidden_state_staging_bytes));
  }
  if (cfg.hidden_state_launch_slots < 1 || cfg.hidden_state_launch_slots > 4096) {
    fail_key(origins, kHiddenStateLaunchSlots, "must be in 1..4096 (launch slots per device)",
             std::to_string(cfg.hidden_state_launch_slots));
  }
  if (cfg.hidden_state_device < -1 || cfg.hidden_state_device > 1023) {
    fail_key(origins, kHiddenStateDevice,
             "must be -1 (the constructing thread's current device) or a device index",
             std::to_string(cfg.hidden_state_device));
  }
  if (cfg.hidden_state_output_cache_bytes < 0) {
    fail_key(origins, kHiddenStateOutputCacheBytes, "must be >= 0 (bytes)",
             std::to_string(cfg.hidden_state_output_cache_bytes));
  }
  if (cfg.hidden_state_stream_threshold_bytes && *cfg.hidden_state_stream_threshold_bytes < 0) {
    fail_key(origins, kHiddenStateStreamThresholdBytes, "must be >= 0 (bytes) or auto",
             std::to_string(*cfg.hidden_state_stream_threshold_bytes));
  }
  if (cfg.hidden_state_copy_threads < 1 || cfg.hidden_state_copy_threads > kMaxCopyThreads) {
    fail_key(origins, kHiddenStateCopyThreads, "must be in 1..64 (threads per host copy)",
             std::to_string(cfg.hidden_state_copy_threads));
  }
}

// Parses YAML text into cfg, recording where each key came from. Does not validate.
void parse_document(Config& cfg, Origins& origins, std::string_view yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    throw ConfigError("malformed YAML at " + line_of(e.mark) + ", column " +
                      std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  if (root.IsNull()) return;  // empty document, or only comments: every key keeps its default
  if (!root.IsMap()) {
    throw ConfigError("config document must be a map of keys to values, got '" + describe(root) +
                      "' (" + line_of(root.Mark()) + ")");
  }
  std::map<std::string, std::string, std::less<>> seen;  // key -> line, to report duplicates
  for (const auto& pair : root) {
    const YAML::Node& key_node = pair.first;
    // The key's line, not the value's: a missing value (`key:`) is marked on the next line.
    const std::string where = line_of(key_node.Mark());
    if (!key_node.IsScalar()) {
      throw ConfigError("config key '" + describe(key_node) + "' is not a string (" + where + ")");
    }
    const std::string& key = key_node.Scalar();
    if (const auto [it, inserted] = seen.emplace(key, where); !inserted) {
      // yaml-cpp keeps both entries; silently taking either would surprise someone.
      throw ConfigError("config key '" + key + "' appears twice, got '" + describe(pair.second) +
                        "' (" + it->second + " and " + where + ")");
    }
    if (apply_key(cfg, key, pair.second, where, /*where_is_line=*/true)) {
      origins[key] = Source{where, describe(pair.second)};
    } else {
      std::cerr << "hss: warning: unknown config key '" << key << "' (" << where << ") ignored\n";
      cfg.unknown_keys.push_back(key);
    }
  }
}

void parse_file(Config& cfg, Origins& origins, const std::filesystem::path& path) {
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
  Origins origins;
  parse_document(cfg, origins, yaml_text);
  validate_with(cfg, origins);
  return cfg;
}

Config Config::from_file(const std::filesystem::path& path) {
  Config cfg;
  Origins origins;
  parse_file(cfg, origins, path);
  validate_with(cfg, origins);
  return cfg;
}

Config Config::from_env() {
  Config cfg;
  Origins origins;
  if (const char* file = std::getenv("LMCACHE_CONFIG_FILE"); file != nullptr && *file != '\0') {
    try {
      parse_file(cfg, origins, file);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("LMCACHE_CONFIG_FILE: ") + e.what());
    }
  }
  // Only hsstore's own keys are looked up: the environment of an LMCache worker carries many
  // LMCACHE_* variables meant for LMCache itself, and warning about each would be noise.
  for (const std::string_view key : kKnownKeys) {
    const std::string var = env_name(key);
    const char* raw = std::getenv(var.c_str());
    if (raw == nullptr) continue;
    const std::string where = "environment variable " + var;
    YAML::Node value;
    try {
      // Parsed as YAML so "[0, -1]" is a list and "true" a bool, as in the file.
      value = YAML::Load(raw);
    } catch (const YAML::Exception& e) {
      fail(key, "malformed YAML value (" + e.msg + ")", raw, where);
    }
    apply_key(cfg, key, value, where, /*where_is_line=*/false);
    origins[std::string(key)] = Source{where, raw};
  }
  validate_with(cfg, origins);
  return cfg;
}

void Config::validate() const { validate_with(*this, Origins{}); }

uint64_t Config::hidden_state_pool_bytes() const { return gib_to_bytes(max_hidden_state_cpu_size); }

uint64_t Config::kv_pool_bytes() const { return gib_to_bytes(max_local_cpu_size); }

bool Config::layer_allowed(int64_t layer_idx) const {
  return !hidden_state_layers ||
         std::ranges::find(*hidden_state_layers, layer_idx) != hidden_state_layers->end();
}

bool Config::slot_allowed(ActivationKind kind, int64_t layer_idx) const {
  return layer_allowed(layer_idx) &&
         (!hidden_state_kinds ||
          std::ranges::find(*hidden_state_kinds, kind) != hidden_state_kinds->end());
}

std::span<const std::string_view> Config::keys() { return kKnownKeys; }

std::string Config::to_yaml() const {
  std::string out;
  out += "chunk_size: " + std::to_string(chunk_size) + "\n";
  out += "save_unfull_chunk: " + std::string(save_unfull_chunk ? "true" : "false") + "\n";
  out += "max_local_cpu_size: " + format_double(max_local_cpu_size) + "\n";
  out += "enable_hidden_state_cache: " + std::string(enable_hidden_state_cache ? "true" : "false") +
         "\n";
  out += "max_hidden_state_cpu_size: " + format_double(max_hidden_state_cpu_size) + "\n";
  out += "hidden_state_layers: ";
  if (!hidden_state_layers) {
    out += "null";
  } else {
    out += "[";
    for (size_t i = 0; i < hidden_state_layers->size(); ++i) {
      if (i != 0) out += ", ";
      out += std::to_string((*hidden_state_layers)[i]);
    }
    out += "]";
  }
  out += "\n";
  out += "hidden_state_storage_dtype: " + std::string(to_string(hidden_state_storage_dtype)) + "\n";
  out += "hidden_state_block_bytes: " + std::to_string(hidden_state_block_bytes) + "\n";
  out += "hidden_state_kinds: ";
  if (!hidden_state_kinds) {
    out += "null";
  } else {
    out += "[";
    for (size_t i = 0; i < hidden_state_kinds->size(); ++i) {
      if (i != 0) out += ", ";
      out += std::string(to_string((*hidden_state_kinds)[i]));
    }
    out += "]";
  }
  out += "\n";
  out += "hidden_state_remote_url: ";
  if (hidden_state_remote_url.empty()) {
    out += "null";
  } else {
    out += "[";
    for (size_t i = 0; i < hidden_state_remote_url.size(); ++i) {
      if (i != 0) out += ", ";
      // Double-quoted YAML: a password may hold characters YAML would otherwise read.
      out += '"';
      for (const char c : hidden_state_remote_url[i]) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
      }
      out += '"';
    }
    out += "]";
  }
  out += "\n";
  out += "hidden_state_remote_ttl_s: " + std::to_string(hidden_state_remote_ttl_s) + "\n";
  out += "hidden_state_remote_timeout_ms: " + std::to_string(hidden_state_remote_timeout_ms) + "\n";
  out +=
      "hidden_state_remote_queue_bytes: " + std::to_string(hidden_state_remote_queue_bytes) + "\n";
  // Double-quoted YAML strings. The inline MAC key is a secret: never printed (a config
  // reloaded from this text names the key file instead, or needs the key set again).
  const auto quoted = [](const std::string& text) {
    std::string q = "\"";
    for (const char c : text) {
      if (c == '"' || c == '\\') q += '\\';
      q += c;
    }
    return q + "\"";
  };
  if (!hidden_state_mac_key.empty()) out += "# hidden_state_mac_key: set (not shown)\n";
  out += "hidden_state_mac_key_file: " +
         (hidden_state_mac_key_file.empty() ? std::string("null")
                                            : quoted(hidden_state_mac_key_file)) +
         "\n";
  out += "hidden_state_transfer: " + std::string(to_string(hidden_state_transfer)) + "\n";
  out += "hidden_state_transfer_backend: " + quoted(hidden_state_transfer_backend) + "\n";
  out += "hidden_state_transfer_lease_ms: " + std::to_string(hidden_state_transfer_lease_ms) + "\n";
  out += "hidden_state_transfer_timeout_ms: " + std::to_string(hidden_state_transfer_timeout_ms) +
         "\n";
  out += "hidden_state_transfer_listen: " + quoted(hidden_state_transfer_listen) + "\n";
  out += "hidden_state_restore_impl: " + std::string(to_string(hidden_state_restore_impl)) + "\n";
  out += "hidden_state_store_impl: " + std::string(to_string(hidden_state_store_impl)) + "\n";
  out += "hidden_state_staging_bytes: " + std::to_string(hidden_state_staging_bytes) + "\n";
  out += "hidden_state_launch_slots: " + std::to_string(hidden_state_launch_slots) + "\n";
  out += "hidden_state_device: " + std::to_string(hidden_state_device) + "\n";
  out +=
      "hidden_state_output_cache_bytes: " + std::to_string(hidden_state_output_cache_bytes) + "\n";
  out += "hidden_state_stream_threshold_bytes: " +
         (hidden_state_stream_threshold_bytes ? std::to_string(*hidden_state_stream_threshold_bytes)
                                              : std::string("auto")) +
         "\n";
  out += "hidden_state_copy_threads: " + std::to_string(hidden_state_copy_threads) + "\n";
  return out;
}

}  // namespace hss
