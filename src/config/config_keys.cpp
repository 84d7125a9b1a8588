#include "config/config_keys.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <optional>
#include <vector>

#include "config/config_yaml.hpp"
#include "config/redis_url.hpp"
#include "hss/detail/checked.hpp"
#include "hss/error.hpp"

namespace hss::detail {
namespace {

// ---- Codecs: how one member type is read, written, quoted in messages and handed to Python.

struct IntCodec {
  static int64_t parse(std::string_view k, const YAML::Node& n, ValueWhere w) {
    return parse_int(k, n, w);
  }
  static std::string format(int64_t v) { return std::to_string(v); }
  static std::string describe(int64_t v) { return format(v); }
  static ConfigValue value(int64_t v) { return v; }
};

/// An integer or `auto` (unset: hsstore chooses).
struct AutoIntCodec {
  static std::optional<int64_t> parse(std::string_view k, const YAML::Node& n, ValueWhere w) {
    return parse_auto_int(k, n, w);
  }
  static std::string format(const std::optional<int64_t>& v) {
    return v ? std::to_string(*v) : std::string("auto");
  }
  static std::string describe(const std::optional<int64_t>& v) { return format(v); }
  static ConfigValue value(const std::optional<int64_t>& v) {
    return v ? ConfigValue(*v) : ConfigValue();
  }
};

struct BoolCodec {
  static bool parse(std::string_view k, const YAML::Node& n, ValueWhere w) {
    return parse_bool(k, n, w);
  }
  static std::string format(bool v) { return v ? "true" : "false"; }
  static std::string describe(bool v) { return format(v); }
  static ConfigValue value(bool v) { return v; }
};

/// A size in GiB (a double).
struct GiBCodec {
  static double parse(std::string_view k, const YAML::Node& n, ValueWhere w) {
    return parse_double(k, n, w);
  }
  static std::string format(double v) { return format_double(v); }
  // Messages show a number as typed, or else in its shortest form (no ".0" added as for YAML).
  static std::string describe(double v) { return plain_double(v); }
  static ConfigValue value(double v) { return v; }
};

/// A string, always quoted in YAML.
struct StringCodec {
  static std::string parse(std::string_view k, const YAML::Node& n, ValueWhere w) {
    return parse_string(k, n, w);
  }
  static std::string format(const std::string& v) { return yaml_quoted(v); }
  static std::string describe(const std::string& v) { return v; }
  static ConfigValue value(const std::string& v) { return v; }
};

/// A string whose empty value (unset) is written as null.
struct OptionalStringCodec : StringCodec {
  static std::string format(const std::string& v) { return v.empty() ? "null" : yaml_quoted(v); }
};

struct LayersCodec {
  using T = std::optional<std::vector<int64_t>>;
  static T parse(std::string_view k, const YAML::Node& n, ValueWhere w) {
    return parse_layers(k, n, w);
  }
  static std::string format(const T& v) {
    if (!v) return "null";
    std::vector<std::string> items;
    for (const int64_t layer : *v) items.push_back(std::to_string(layer));
    return flow_list(items);
  }
  static std::string describe(const T& v) { return format(v); }
  static ConfigValue value(const T& v) { return v ? ConfigValue(*v) : ConfigValue(); }
};

struct KindsCodec {
  using T = std::optional<std::vector<ActivationKind>>;
  static T parse(std::string_view k, const YAML::Node& n, ValueWhere w) {
    return parse_kinds(k, n, w);
  }
  static std::vector<std::string> names(const std::vector<ActivationKind>& kinds) {
    std::vector<std::string> out;
    for (const ActivationKind kind : kinds) out.emplace_back(to_string(kind));
    return out;
  }
  static std::string format(const T& v) { return v ? flow_list(names(*v)) : "null"; }
  static std::string describe(const T& v) { return format(v); }
  static ConfigValue value(const T& v) { return v ? ConfigValue(names(*v)) : ConfigValue(); }
};

struct UrlsCodec {
  using T = std::vector<std::string>;
  static T parse(std::string_view k, const YAML::Node& n, ValueWhere w) {
    return parse_urls(k, n, w);
  }
  static std::string format(const T& v) {
    if (v.empty()) return "null";
    std::vector<std::string> items;
    for (const std::string& url : v) items.push_back(yaml_quoted(url));
    return flow_list(items);
  }
  static std::string describe(const T& v) { return format(v); }
  static ConfigValue value(const T& v) { return v; }
};

/// An enum whose values are 0..N-1, by the names to_string gives them.
template <typename E, size_t N>
struct EnumCodec {
  static std::vector<std::string_view> names() {
    std::vector<std::string_view> out;
    for (size_t i = 0; i < N; ++i) out.push_back(to_string(static_cast<E>(i)));
    return out;
  }
  static E parse(std::string_view k, const YAML::Node& n, ValueWhere w) {
    return static_cast<E>(parse_name(k, n, w, names()));
  }
  static std::string format(E v) { return std::string(to_string(v)); }
  // Only a Config built in code holds an unnamed value; messages show its number.
  static std::string describe(E v) {
    return to_string(v) == "unknown" ? std::to_string(static_cast<int>(v)) : format(v);
  }
  static ConfigValue value(E v) { return format(v); }
};

/// hidden_state_transfer: null is `none`.
struct TransferCodec : EnumCodec<TransferKind, 2> {
  static TransferKind parse(std::string_view k, const YAML::Node& n, ValueWhere w) {
    if (n.IsNull()) return TransferKind::kNone;
    return EnumCodec::parse(k, n, w);
  }
};

/// hidden_state_log_level: `auto` or null (unset), or a level.
struct LogLevelCodec {
  using T = std::optional<LogLevel>;
  static T parse(std::string_view k, const YAML::Node& n, ValueWhere w) {
    if (n.IsNull()) return std::nullopt;
    std::vector<std::string_view> names = EnumCodec<LogLevel, 5>::names();
    names.insert(names.begin(), "auto");
    const size_t index = parse_name(k, n, w, names);
    return index == 0 ? T() : T(static_cast<LogLevel>(index - 1));
  }
  static std::string format(const T& v) { return v ? std::string(to_string(*v)) : "auto"; }
  static std::string describe(const T& v) {
    return v ? EnumCodec<LogLevel, 5>::describe(*v) : format(v);
  }
  static ConfigValue value(const T& v) { return v ? ConfigValue(format(v)) : ConfigValue(); }
};

/// hidden_state_mac_key: a secret. Messages show its length only.
struct SecretCodec : OptionalStringCodec {
  static std::string describe(const std::string& v) {
    std::string text = "<";  // appended piecewise: GCC 12 -O3 misreads "<" + s (-Wrestrict)
    text += std::to_string(v.size());
    text += " bytes>";
    return text;
  }
};

// ---- A row: `access` is a captureless lambda returning the member (const or not).

using Validator = void (*)(const Config&, const KeyCheck&);

template <typename Codec, typename Access>
constexpr KeySpec key(std::string_view name, Access /*access*/, Validator validate,
                      std::string_view doc, bool secret = false) {
  return KeySpec{
      name,
      doc,
      [](Config& c, std::string_view k, const YAML::Node& n, ValueWhere w) {
        Access{}(c) = Codec::parse(k, n, w);
      },
      [](const Config& c) { return Codec::format(Access{}(c)); },
      [](const Config& c) { return Codec::describe(Access{}(c)); },
      [](const Config& c) { return Codec::value(Access{}(c)); },
      validate,
      secret,
  };
}

// The member a row reads and writes, for const and non-const Configs alike. A macro only because
// a member path through the sub-struct (tuning.copy_threads) cannot be a pointer to member.
#define HSS_MEMBER(path) \
  [](auto& c) -> auto& { return c.path; }

// ---- Validators shared by several rows.

void check_gib(double gib, const KeyCheck& check) {
  constexpr double kBytesPerGiB = 1073741824.0;
  // 2^64 as a double: the first byte count a uint64_t cannot hold.
  constexpr double kUint64Limit = 18446744073709551616.0;
  if (!std::isfinite(gib)) check.fail("must be a finite number of GiB");
  if (gib < 0.0) check.fail("must be >= 0 (GiB)");
  if (gib * kBytesPerGiB >= kUint64Limit) check.fail("must be less than 2^34 GiB");
}

/// local_disk, hidden_state_disk_path: read as LMCache's _parse_local_disk reads local_disk (a
/// path, or several comma-separated, each optionally prefixed with file://, which is stripped:
/// "file://local_disk/" is the relative "local_disk/"), so a config LMCache accepts is never
/// rejected here. Config::hidden_state_disk_dir takes the first path. Refused: a NUL byte (no
/// path holds one), another URL scheme, a list with no path in it.
void check_disk_path(const std::string& path, const KeyCheck& check) {
  if (path.empty()) return;
  if (path.find('\0') != std::string::npos) check.fail("must not contain a NUL byte");
  const std::vector<std::string_view> dirs = disk_paths(path);
  for (const std::string_view dir : dirs) {
    if (dir.find("://") != std::string_view::npos) {
      check.fail("must be a path or file:// paths, comma-separated (no other URL scheme)");
    }
  }
  if (dirs.empty()) check.fail("names no directory");
}

/// A rule "lo <= value <= hi" with its message.
template <int64_t Lo, int64_t Hi>
void check_range(int64_t value, const KeyCheck& check, std::string_view problem) {
  if (value < Lo || value > Hi) check.fail(problem);
}

constexpr int64_t kMaxCopyThreads = 64;
constexpr int64_t kMinCopySplitBytes = 4096;
constexpr int64_t kMaxLaunchSlots = 4096;
constexpr int64_t kMaxDeviceIndex = 1023;
// Bounded so the timeout fits a timeval and a stuck server cannot hold a caller for long.
constexpr int64_t kMaxRemoteTimeoutMs = 600000;
constexpr int64_t kMaxLeaseMs = 3600000;
constexpr int64_t kMaxPullTimeoutMs = 600000;
constexpr int64_t kMaxTransferChunks = int64_t{1} << 20;  // the wire format's limit
constexpr int64_t kMaxTransferCount = int64_t{1} << 20;
constexpr int64_t kMaxTransferPeers = 4096;
constexpr size_t kMinMacKeyBytes = 16;
constexpr size_t kMaxBackendName = 64;

// clang-format off
constexpr std::array kKeys = {
    key<IntCodec>("chunk_size", HSS_MEMBER(chunk_size),
        [](const Config& c, const KeyCheck& k) {
          if (c.chunk_size <= 0) k.fail("must be > 0");
          // The documented limit (hss/detail/checked.hpp): keeps chunk byte counts far from
          // overflow.
          if (c.chunk_size > limits::kMaxChunkSize) k.fail("must be <= 1048576 (2^20 tokens)");
        },
        "tokens per chunk (shared with KV)"),
    key<BoolCodec>("save_unfull_chunk", HSS_MEMBER(save_unfull_chunk), nullptr,
        "also key the trailing partial chunk"),
    key<GiBCodec>("max_local_cpu_size", HSS_MEMBER(max_local_cpu_size),
        [](const Config& c, const KeyCheck& k) {
          check_gib(c.max_local_cpu_size, k);
          if (c.kv_pool_bytes() == 0) k.fail("must be > 0 (the KV pool needs at least one byte)");
        },
        "GiB, KV pool (`LocalCpuBackend`)"),
    key<OptionalStringCodec>("local_disk", HSS_MEMBER(local_disk),
        [](const Config& c, const KeyCheck& k) { check_disk_path(c.local_disk, k); },
        "directory of the local disk tier, read as LMCache reads it (a path or comma-separated "
        "paths, each maybe `file://`-prefixed; hidden states take the first); they go in its "
        "subdirectory `hsstore/`. Null: no disk tier"),
    key<GiBCodec>("max_local_disk_size", HSS_MEMBER(max_local_disk_size),
        [](const Config& c, const KeyCheck& k) {
          check_gib(c.max_local_disk_size, k);
          if (!c.hidden_state_disk_dir().empty() && c.disk_tier_bytes() == 0) {
            k.fail("must be > 0 when local_disk or hidden_state_disk_path is set");
          }
        },
        "GiB of hidden-state files the disk tier keeps (the least recently used are deleted "
        "beyond it)"),
    key<BoolCodec>("enable_hidden_state_cache", HSS_MEMBER(enable_hidden_state_cache), nullptr,
        "master switch; when false `hidden_state_store()` is `nullptr`"),
    key<GiBCodec>("max_hidden_state_cpu_size", HSS_MEMBER(max_hidden_state_cpu_size),
        [](const Config& c, const KeyCheck& k) {
          check_gib(c.max_hidden_state_cpu_size, k);
          if (!c.enable_hidden_state_cache ||
              c.hidden_state_pool_bytes() >= limits::kMinGranuleBytes) {
            return;
          }
          constexpr std::string_view kProblem =
              "must hold at least one 64-byte granule when enable_hidden_state_cache is true";
          if (k.given(k.key())) k.fail(kProblem);
          // The size was left at its default; then the switch is what to point at.
          std::string where = "not set";
          if (const std::string enable = k.origin("enable_hidden_state_cache"); !enable.empty()) {
            where += "; enable_hidden_state_cache from " + enable;
          }
          fail_config_key(k.key(), kProblem, plain_double(c.max_hidden_state_cpu_size), where);
        },
        "GiB, hidden-state pool; must be > 0 when enabled"),
    key<LayersCodec>("hidden_state_layers", HSS_MEMBER(hidden_state_layers), nullptr,
        "optional allowlist of layer indices (negatives allowed, -1 = final state)"),
    key<EnumCodec<StorageDType, 4>>("hidden_state_storage_dtype",
        HSS_MEMBER(hidden_state_storage_dtype),
        [](const Config& c, const KeyCheck& k) {
          // Only reachable for a Config built in code: parsing accepts the four names alone.
          if (to_string(c.hidden_state_storage_dtype) == "unknown") k.fail("unknown storage dtype");
          // FP8 entries travel with their scales to the disk and remote tiers and over P/D
          // transfer (wire codes 3 and 4, format/dtype_codes.hpp). The host path and the CUDA
          // kernels quantise with the same rule (kernels/hss/kernels/convert.hpp).
        },
        "`native` keeps float16/bfloat16 rows at 16 bits (bit-identical restore, half the bytes); "
        "`fp8_e4m3` / `fp8_e5m2` quantise each row to 8 bits with a float32 scale (lossy, "
        "opt-in: error <= row amax / 28 or / 14; the scales travel with the rows to the disk and "
        "remote tiers and over P/D transfer; host and CUDA paths store the same bytes)"),
    key<IntCodec>("hidden_state_block_bytes", HSS_MEMBER(hidden_state_block_bytes),
        [](const Config& c, const KeyCheck& k) {
          const int64_t bytes = c.hidden_state_block_bytes;
          constexpr auto kGranule = static_cast<int64_t>(limits::kMinGranuleBytes);
          constexpr auto kMax = static_cast<int64_t>(limits::kMaxGranuleBytes);
          if (bytes < 0 || bytes % kGranule != 0 || bytes > kMax) {
            k.fail("must be 0 (automatic granule) or a positive multiple of 64 up to 64 MiB");
          }
        },
        "pool granule in bytes; 0 = automatic (64 KiB; smaller for pools under 64 MiB); else a "
        "multiple of 64 up to 64 MiB"),
    key<KindsCodec>("hidden_state_kinds", HSS_MEMBER(hidden_state_kinds), nullptr,
        "optional allowlist of activation kinds (`hidden`, `query`, `key`, `value`, "
        "`mlp_intermediate`)"),
    key<OptionalStringCodec>("hidden_state_disk_path", HSS_MEMBER(hidden_state_disk_path),
        [](const Config& c, const KeyCheck& k) { check_disk_path(c.hidden_state_disk_path, k); },
        "the disk tier's directory for hidden states, overriding `local_disk` (its "
        "subdirectory `hsstore/` holds the files)"),
    key<UrlsCodec>("hidden_state_remote_url", HSS_MEMBER(hidden_state_remote_url),
        [](const Config& c, const KeyCheck& k) {
          try {
            (void)parse_redis_urls(c.hidden_state_remote_url);
          } catch (const ConfigError& e) {
            // The parser masks passwords; the origin is where the list came from.
            std::string msg = "config key '" + std::string(k.key()) + "': " + e.what();
            if (const std::string where = k.origin(k.key()); !where.empty()) {
              msg += " (" + where + ")";
            }
            throw ConfigError(msg);
          }
        },
        "`redis://[user:password@]host:port[/db]` or a list (sharded): shared Redis/Valkey tier"),
    key<IntCodec>("hidden_state_remote_ttl_s", HSS_MEMBER(hidden_state_remote_ttl_s),
        [](const Config& c, const KeyCheck& k) {
          if (c.hidden_state_remote_ttl_s < 0) k.fail("must be >= 0 seconds (0 = no expiry)");
        },
        "expiry of remote values in seconds; 0 = none"),
    key<IntCodec>("hidden_state_remote_timeout_ms", HSS_MEMBER(hidden_state_remote_timeout_ms),
        [](const Config& c, const KeyCheck& k) {
          check_range<1, kMaxRemoteTimeoutMs>(c.hidden_state_remote_timeout_ms, k,
                                              "must be in [1, 600000] milliseconds");
        },
        "connect and per-socket-operation timeout of the remote tier"),
    key<IntCodec>("hidden_state_remote_queue_bytes", HSS_MEMBER(hidden_state_remote_queue_bytes),
        [](const Config& c, const KeyCheck& k) {
          if (c.hidden_state_remote_queue_bytes < 0) {
            k.fail("must be >= 0 bytes (0 = no write-behind)");
          }
        },
        "write-behind budget; the oldest pending writes are dropped beyond it"),
    key<SecretCodec>("hidden_state_mac_key", HSS_MEMBER(hidden_state_mac_key),
        [](const Config& c, const KeyCheck& k) {
          if (!c.hidden_state_mac_key.empty() && !c.hidden_state_mac_key_file.empty()) {
            k.fail("hidden_state_mac_key_file",
                   "set at most one of hidden_state_mac_key and hidden_state_mac_key_file");
          }
          if (!c.hidden_state_mac_key.empty() && c.hidden_state_mac_key.size() < kMinMacKeyBytes) {
            k.fail("must be at least 16 bytes (128 bits)");
          }
        },
        "keyed MAC (HMAC-SHA256) of remote values, both remote paths: the secret (>= 16 bytes; "
        "never printed). Set: values without a valid MAC are counted misses. Needs OpenSSL "
        "(`libssl-dev`) at build time, else a `ConfigError`",
        /*secret=*/true),
    key<OptionalStringCodec>("hidden_state_mac_key_file", HSS_MEMBER(hidden_state_mac_key_file),
        nullptr,
        "the same secret read from a file (one trailing newline ignored); at most one of the two"),
    key<OptionalStringCodec>("hidden_state_chunk_hash_key_file",
        HSS_MEMBER(hidden_state_chunk_hash_key_file), nullptr,
        "a file holding a secret (>= 16 bytes; one trailing newline ignored) that keys hsstore's "
        "own chunk hash (its root seed): for prompts from untrusted clients. Every store sharing "
        "keys needs the same"),
    key<TransferCodec>("hidden_state_transfer", HSS_MEMBER(hidden_state_transfer),
        [](const Config& c, const KeyCheck& k) {
          if (to_string(c.hidden_state_transfer) == "unknown") k.fail("unknown transfer");
        },
        "`nixl`: point-to-point pulls from another process's pool (`hsstore.nixl`); needs the "
        "`nixl` package, else a `ConfigError` when the config is made"),
    key<StringCodec>("hidden_state_transfer_backend", HSS_MEMBER(hidden_state_transfer_backend),
        [](const Config& c, const KeyCheck& k) {
          const std::string& backend = c.hidden_state_transfer_backend;
          if (backend.empty() || backend.size() > kMaxBackendName ||
              !std::ranges::all_of(backend, [](unsigned char ch) {
                return std::isalnum(ch) != 0 || ch == '_';
              })) {
            k.fail("must be a NIXL backend name (letters, digits, '_'), e.g. 'UCX'");
          }
        },
        "NIXL backend of the transfer"),
    key<IntCodec>("hidden_state_transfer_lease_ms", HSS_MEMBER(hidden_state_transfer_lease_ms),
        [](const Config& c, const KeyCheck& k) {
          check_range<1, kMaxLeaseMs>(c.hidden_state_transfer_lease_ms, k,
                                      "must be in [1, 3600000] milliseconds");
        },
        "how long a producer pins exported granules for a consumer's READ (released earlier by "
        "the consumer)"),
    key<IntCodec>("hidden_state_transfer_timeout_ms", HSS_MEMBER(hidden_state_transfer_timeout_ms),
        [](const Config& c, const KeyCheck& k) {
          check_range<1, kMaxPullTimeoutMs>(c.hidden_state_transfer_timeout_ms, k,
                                            "must be in [1, 600000] milliseconds");
        },
        "a consumer's bound on one pull (control round trips and the READ); a producer's bound "
        "on each control exchange (a request and its reply) and on the handshake"),
    key<StringCodec>("hidden_state_transfer_listen", HSS_MEMBER(hidden_state_transfer_listen),
        [](const Config& c, const KeyCheck& k) {
          const std::string& listen = c.hidden_state_transfer_listen;
          const size_t colon = listen.rfind(':');
          const std::optional<int64_t> port =
              colon == std::string::npos ? std::nullopt
                                         : parse_int_text(listen.substr(colon + 1));
          if (colon == 0 || colon == std::string::npos || !port || *port < 0 || *port > 65535) {
            k.fail("must be host:port with a port in 0..65535");
          }
        },
        "host:port of a producer's control socket (0: any free port)"),
    key<IntCodec>("hidden_state_transfer_max_chunks", HSS_MEMBER(hidden_state_transfer_max_chunks),
        [](const Config& c, const KeyCheck& k) {
          check_range<1, kMaxTransferChunks>(c.hidden_state_transfer_max_chunks, k,
                                             "must be in [1, 1048576] chunks");
        },
        "chunks one pull request may name (a producer refuses more, and a repeated key, counted)"),
    key<IntCodec>("hidden_state_transfer_max_lease_bytes",
        HSS_MEMBER(hidden_state_transfer_max_lease_bytes),
        [](const Config& c, const KeyCheck& k) {
          if (c.hidden_state_transfer_max_lease_bytes < 1) k.fail("must be >= 1 byte");
        },
        "payload bytes one export (lease) may pin; a larger export is refused, counted"),
    key<IntCodec>("hidden_state_transfer_max_leases", HSS_MEMBER(hidden_state_transfer_max_leases),
        [](const Config& c, const KeyCheck& k) {
          check_range<1, kMaxTransferCount>(c.hidden_state_transfer_max_leases, k,
                                            "must be in [1, 1048576] leases");
        },
        "leases a producer holds at once, all peers together; an export beyond is refused"),
    key<IntCodec>("hidden_state_transfer_max_leased_bytes",
        HSS_MEMBER(hidden_state_transfer_max_leased_bytes),
        [](const Config& c, const KeyCheck& k) {
          if (c.hidden_state_transfer_max_leased_bytes < 1) k.fail("must be >= 1 byte");
        },
        "payload bytes all leases held at once may pin; an export beyond is refused"),
    key<IntCodec>("hidden_state_transfer_peer_leases",
        HSS_MEMBER(hidden_state_transfer_peer_leases),
        [](const Config& c, const KeyCheck& k) {
          check_range<1, kMaxTransferCount>(c.hidden_state_transfer_peer_leases, k,
                                            "must be in [1, 1048576] leases");
        },
        "leases one control connection (a peer) holds at once (`hsstore.nixl`)"),
    key<IntCodec>("hidden_state_transfer_peer_leased_bytes",
        HSS_MEMBER(hidden_state_transfer_peer_leased_bytes),
        [](const Config& c, const KeyCheck& k) {
          if (c.hidden_state_transfer_peer_leased_bytes < 1) k.fail("must be >= 1 byte");
        },
        "payload bytes the leases of one control connection pin at once (`hsstore.nixl`)"),
    key<IntCodec>("hidden_state_transfer_max_peers", HSS_MEMBER(hidden_state_transfer_max_peers),
        [](const Config& c, const KeyCheck& k) {
          check_range<1, kMaxTransferPeers>(c.hidden_state_transfer_max_peers, k,
                                            "must be in [1, 4096] connections");
        },
        "control connections a producer serves at once; one more gets an error frame, closed"),
    key<IntCodec>("hidden_state_transfer_idle_ms", HSS_MEMBER(hidden_state_transfer_idle_ms),
        [](const Config& c, const KeyCheck& k) {
          check_range<1, kMaxLeaseMs>(c.hidden_state_transfer_idle_ms, k,
                                      "must be in [1, 3600000] milliseconds");
        },
        "a served control connection without a request for this long is closed (keep it above "
        "the consumers' `hidden_state_transfer_timeout_ms`: a pull's READ runs between two "
        "requests)"),
    key<BoolCodec>("hidden_state_transfer_trusted_network",
        HSS_MEMBER(hidden_state_transfer_trusted_network), nullptr,
        "`true`: `hsstore.nixl` runs without `hidden_state_mac_key` (peers and values "
        "unauthenticated; every host on the network trusted). `false`: an agent needs the key"),
    key<EnumCodec<RestoreImpl, 3>>("hidden_state_restore_impl", HSS_MEMBER(tuning.restore_impl),
        [](const Config& c, const KeyCheck& k) {
          if (to_string(c.tuning.restore_impl) == "unknown") {
            k.fail("unknown restore implementation");
          }
        },
        "device-output restore: `kernel`, `copy_engine` (cudaMemcpy*Async), `cub`"),
    key<EnumCodec<StoreImpl, 2>>("hidden_state_store_impl", HSS_MEMBER(tuning.store_impl),
        [](const Config& c, const KeyCheck& k) {
          if (to_string(c.tuning.store_impl) == "unknown") k.fail("unknown store implementation");
        },
        "device-input store: `staging` (a gather into device staging on the caller's stream, the "
        "copy to the pool on a copy stream), `mapped` (one kernel writes the device-mapped pool "
        "directly). A batch's (device, stream) of several items is one mapped launch; one item "
        "is a single store"),
    key<IntCodec>("hidden_state_staging_bytes", HSS_MEMBER(tuning.staging_bytes),
        [](const Config& c, const KeyCheck& k) {
          if (c.tuning.staging_bytes <= 0) k.fail("must be > 0 (bytes of staging per device)");
        },
        "bytes of device staging in flight per device before a device store waits on the host "
        "(allocated at construction)"),
    key<IntCodec>("hidden_state_launch_slots", HSS_MEMBER(tuning.launch_slots),
        [](const Config& c, const KeyCheck& k) {
          check_range<1, kMaxLaunchSlots>(c.tuning.launch_slots, k,
                                          "must be in 1..4096 (launch slots per device)");
        },
        "device restores and batch launches in flight per device before the next waits on the "
        "host (1..4096)"),
    key<IntCodec>("hidden_state_device", HSS_MEMBER(hidden_state_device),
        [](const Config& c, const KeyCheck& k) {
          check_range<-1, kMaxDeviceIndex>(
              c.hidden_state_device, k,
              "must be -1 (the constructing thread's current device) or a device index");
        },
        "the store's CUDA device (pinned pool and device state made there at construction, no "
        "context elsewhere); -1: the constructing thread's current device"),
    key<GiBCodec>("hidden_state_device_cache_size", HSS_MEMBER(hidden_state_device_cache_size),
        [](const Config& c, const KeyCheck& k) { check_gib(c.hidden_state_device_cache_size, k); },
        "GiB per device, the device-resident hot tier on `hidden_state_device` (allocated at "
        "construction; device stores write through to the pool, device restores there read it "
        "device-to-device); 0: off"),
    key<IntCodec>("hidden_state_output_cache_bytes", HSS_MEMBER(tuning.output_cache_bytes),
        [](const Config& c, const KeyCheck& k) {
          if (c.tuning.output_cache_bytes < 0) k.fail("must be >= 0 (bytes)");
        },
        "released restore outputs kept for reuse (process-wide; `HSS_OUTPUT_CACHE_MB` "
        "overrides it)"),
    key<AutoIntCodec>("hidden_state_stream_threshold_bytes",
        HSS_MEMBER(tuning.stream_threshold_bytes),
        [](const Config& c, const KeyCheck& k) {
          if (c.tuning.stream_threshold_bytes && *c.tuning.stream_threshold_bytes < 0) {
            k.fail("must be >= 0 (bytes) or auto");
          }
        },
        "override of the host copy strategy: host calls writing at least this many bytes use "
        "non-temporal stores. `auto`: chosen for the machine (calibration or CPU rule, "
        "`stats().host_copy`, `hss info`; "
        "[docs/perf.md](docs/perf.md#host-copy-strategy-issue-22))"),
    key<AutoIntCodec>("hidden_state_copy_threads", HSS_MEMBER(tuning.copy_threads),
        [](const Config& c, const KeyCheck& k) {
          if (c.tuning.copy_threads) {
            check_range<1, kMaxCopyThreads>(*c.tuning.copy_threads, k,
                                            "must be in 1..64 (threads per host copy) or auto");
          }
        },
        "threads one large host store or restore may be split over (the caller's plus workers "
        "the store starts on its first large copy; 1..64). `auto`: the CPUs the constructing "
        "thread may run on (affinity mask, cgroup quota), at most 8 (`stats().host_copy`, "
        "`hss info`; [docs/design.md](docs/design.md#copy-threads))"),
    key<AutoIntCodec>("hidden_state_copy_split_bytes", HSS_MEMBER(tuning.copy_split_bytes),
        [](const Config& c, const KeyCheck& k) {
          if (c.tuning.copy_split_bytes && *c.tuning.copy_split_bytes < kMinCopySplitBytes) {
            k.fail("must be >= 4096 (bytes per part of a split host copy) or auto");
          }
        },
        "the smallest part a host copy is split into over the copy threads (calls writing less "
        "than twice this stay on the calling thread). `auto`: the CPU family's measured "
        "crossover ([docs/perf.md](docs/perf.md#copy-threads))"),
    key<LogLevelCodec>("hidden_state_log_level", HSS_MEMBER(hidden_state_log_level), nullptr,
        "stderr log threshold, process-wide: `debug`, `info`, `warn`, `error`, `off`; a store "
        "applies it when constructed. `auto`: left as it is (`HSS_LOG_LEVEL`, else `info`)"),
};
// clang-format on

#undef HSS_MEMBER

constexpr auto kNames = [] {
  std::array<std::string_view, kKeys.size()> names{};
  for (size_t i = 0; i < kKeys.size(); ++i) names[i] = kKeys[i].name;
  return names;
}();

}  // namespace

std::span<const KeySpec> key_table() { return kKeys; }

std::span<const std::string_view> key_names() { return kNames; }

const KeySpec* find_key(std::string_view name) {
  const auto it = std::ranges::find(kKeys, name, &KeySpec::name);
  return it == kKeys.end() ? nullptr : &*it;
}

std::string KeyCheck::origin(std::string_view key) const {
  const auto it = origins_.find(key);
  return it == origins_.end() ? std::string() : it->second.where;
}

void KeyCheck::fail(std::string_view key, std::string_view problem) const {
  const KeySpec* spec = find_key(key);
  const auto it = origins_.find(key);
  // The value as the input wrote it, unless it is a secret or the input did not give it.
  std::string text =
      it != origins_.end() && !spec->secret ? it->second.text : spec->describe(config_);
  fail_config_key(key, problem, text, origin(key));
}

std::vector<std::string_view> disk_paths(std::string_view value) {
  std::vector<std::string_view> dirs;
  size_t at = 0;
  while (at <= value.size()) {
    const size_t comma = std::min(value.find(',', at), value.size());
    std::string_view part = value.substr(at, comma - at);
    while (!part.empty() && std::isspace(static_cast<unsigned char>(part.front()))) part.remove_prefix(1);
    while (!part.empty() && std::isspace(static_cast<unsigned char>(part.back()))) part.remove_suffix(1);
    if (part.starts_with("file://")) part.remove_prefix(7);
    if (!part.empty()) dirs.push_back(part);
    at = comma + 1;
  }
  return dirs;
}

void validate_keys(const Config& config, const KeyOrigins& origins) {
  for (const KeySpec& spec : kKeys) {
    if (spec.validate != nullptr) spec.validate(config, KeyCheck(config, origins, spec.name));
  }
}

}  // namespace hss::detail
