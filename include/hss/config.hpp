#pragma once
// hss::Config: the LMCache configuration keys hsstore understands, with LMCache's names and
// defaults. Loading is not thread-safe with respect to the process environment (it reads getenv);
// a constructed Config is an immutable value and may be shared freely.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "hss/activation.hpp"

namespace hss {

/// How hidden-state rows are kept in the pool. The first two are lossless; the FP8 types are
/// opt-in and lossy: each row is quantised against its own float32 scale (amax / 448 or
/// amax / 57344), stored beside it, and dequantised on restore into the requested output dtype.
/// Error per element <= amax / 28 (E4M3) or amax / 14 (E5M2) of its row (docs/design.md,
/// "FP8 storage"; rows below amax ~1e-35 have a weaker bound there). The host path and the CUDA
/// kernels store the same codes and scales; its rows and scales travel as they are through the
/// disk and remote tiers and P/D transfer (wire codes 3 and 4, docs/design.md).
enum class StorageDType {
  kFloat32,  ///< widen everything to float32 on store (LMCache's behaviour)
  kNative,   ///< keep float16/bfloat16 as 16 bits; widen on restore (bit-identical output)
  kFp8E4M3,  ///< `fp8_e4m3`: 1 byte per element + 4 bytes per row (scale)
  kFp8E5M2,  ///< `fp8_e5m2`: wider range, one mantissa bit less
};

/// How a restore into device memory reads the pool (CUDA builds): hsstore's gather kernel, the
/// copy engines (cudaMemcpy*Async: leaves the SMs free), or cub::DeviceMemcpy::Batched. The
/// default is `kernel` until a GPU measurement picks one (docs/perf.md).
enum class RestoreImpl { kKernel, kCopyEngine, kCub };

/// How a store from device memory reaches the pool (CUDA builds): `staging` copies rows that need
/// no cast straight into the pinned pool with the copy engines and casts the others into device
/// staging before a device-to-host copy; `mapped` runs the store kernel that writes every row,
/// cast or not, straight into the device-mapped pool (zero-copy writes, no staging, one launch).
/// A batch's (device, stream) of several items takes the mapped kernel (one launch); one item is
/// a single store (src/datapath/launch_groups.hpp). The default is `staging` until
/// a GPU measurement picks one (docs/perf.md).
enum class StoreImpl { kStaging, kMapped };

/// Point-to-point pull of hidden states between processes or hosts (prefill/decode
/// disaggregation): `none`, or `nixl` (hsstore.nixl: one-sided READs from the producer's pinned
/// pool through NVIDIA NIXL; needs the Python package nixl, checked when a Python config is made).
enum class TransferKind { kNone, kNixl };

/// Threshold of hsstore's stderr log (see Config::hidden_state_log_level).
enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

/// One key's value as plain data (Config::value).
using ConfigValue = std::variant<std::monostate, bool, int64_t, double, std::string,
                                 std::vector<int64_t>, std::vector<std::string>>;

struct Config {
  // Special members out of line: GCC 12 at -O3 reports false "may be used uninitialized" errors in
  // inlined copies of this many members (std::optional<std::vector> among them).
  Config();
  Config(const Config&);
  Config(Config&&) noexcept;
  Config& operator=(const Config&);
  Config& operator=(Config&&) noexcept;
  ~Config();

  int64_t chunk_size = 256;
  bool save_unfull_chunk = false;
  double max_local_cpu_size = 5.0;  ///< GiB, KV pool
  /// Local disk tier (LMCache's key and spelling): a directory, as a plain path or a
  /// `file:///path/` URL. Empty (default) = no disk tier. Hidden states go in its subdirectory
  /// `hsstore/`, apart from LMCache's KV files (hidden_state_disk_path overrides the directory).
  std::string local_disk;
  /// GiB of hidden-state files the disk tier keeps (LMCache's key; its KV files have their own
  /// budget of the same size). > 0 when a disk directory is set.
  double max_local_disk_size = 5.0;

  bool enable_hidden_state_cache = false;
  double max_hidden_state_cpu_size = 0.0;                   ///< GiB, hidden-state pool
  std::optional<std::vector<int64_t>> hidden_state_layers;  ///< allowlist; unset = all layers
  StorageDType hidden_state_storage_dtype = StorageDType::kFloat32;
  /// Allocation granule of the hidden-state pool in bytes: every entry takes ceil(bytes / granule)
  /// granules. 0 (default) = automatic: 64 KiB, smaller for pools under 64 MiB (at least 1024
  /// granules). Otherwise a multiple of 64 up to 64 MiB; chunks whose bytes are a multiple of
  /// the granule fill the pool exactly.
  int64_t hidden_state_block_bytes = 0;
  /// Optional allowlist of activation kinds accepted on store; unset = every kind.
  /// hidden_state_layers filters the layers of every kind.
  std::optional<std::vector<ActivationKind>> hidden_state_kinds;

  /// The disk tier's directory for hidden states, overriding local_disk (a plain path or a
  /// `file:///path/` URL; its subdirectory `hsstore/` holds the files). Empty (default): local_disk.
  std::string hidden_state_disk_path;

  /// Shared remote tier (Redis/Valkey): redis://[user:password@]host:port[/db] URLs; several are
  /// sharded by rendezvous hashing of the chunk key. Empty (default) = no remote tier. Needs a
  /// build with hiredis: otherwise constructing a store with a URL is a ConfigError.
  std::vector<std::string> hidden_state_remote_url;
  int64_t hidden_state_remote_ttl_s = 0;          ///< expiry of remote values; 0 = none
  int64_t hidden_state_remote_timeout_ms = 1000;  ///< connect and per-socket-operation timeout
  int64_t hidden_state_remote_queue_bytes = 256LL << 20;  ///< write-behind budget; 0 = no writes
  /// The store's CUDA device: its page-locked pool and its device state (staging, launch slots,
  /// loaded kernels) are created on it at construction, from a helper thread, so that no other
  /// device gets a context and the caller's current device is left as it was. -1 (default): the
  /// constructing thread's current device. Set it where a thread may not have selected its
  /// device yet (CUDA then reports device 0). >= -1; must name a device the process sees.
  int64_t hidden_state_device = -1;
  /// GiB of device memory (on hidden_state_device) kept as the device-resident hot tier: device
  /// stores keep their entries resident there too (write-through: the pool still gets every
  /// entry), and device restores on that device read them device-to-device. 0 (default): off.
  /// Allocated once at construction; a failed allocation leaves the store without the tier.
  double hidden_state_device_cache_size = 0.0;

  /// How the store moves bytes (hsstore extensions; LMCache has no such keys). The YAML keys and
  /// the Python attributes keep the flat LMCache-style names (`hidden_state_<member>`).
  struct Tuning {
    /// Restore implementation for device outputs. HSS_RESTORE_IMPL overrides it (debugging aid).
    RestoreImpl restore_impl = RestoreImpl::kKernel;
    /// Store implementation for device inputs of single calls (see StoreImpl).
    StoreImpl store_impl = StoreImpl::kStaging;
    /// Bytes of device staging in flight per device before a store waits on the host (only
    /// casts stage; counted in stats().staging_waits). > 0.
    int64_t staging_bytes = int64_t{1} << 30;
    /// Device launches (restores, batch launches) in flight per device before the next waits on
    /// the host (counted in stats().launch_waits). Each slot, created on first use, holds a
    /// pinned tile table of ~0.6 MiB and cub scratch. 1..4096.
    int64_t launch_slots = 64;
    /// Bytes of released restore outputs the process keeps for reuse (HostTensor recycler).
    /// >= 0. HSS_OUTPUT_CACHE_MB overrides it (debugging aid).
    int64_t output_cache_bytes = int64_t{2048} << 20;
    /// Override of the host copy strategy: host calls writing at least this many bytes use
    /// non-temporal stores, smaller ones regular stores. >= 0. Unset (default; `auto` or null in
    /// YAML): chosen for the machine by a calibration or the CPU family's rule
    /// (stats().host_copy, docs/perf.md). HSS_STREAM_THRESHOLD_KB overrides both (debugging aid).
    std::optional<int64_t> stream_threshold_bytes;
    /// Threads one large host store or restore may be split over (the caller's and
    /// copy_threads - 1 workers the store starts on its first split copy). 1..64. Unset
    /// (default; `auto` or null in YAML): the CPUs the constructing thread may run on (affinity
    /// mask, cgroup CPU quota), at most 8; stats().host_copy says what was chosen and why
    /// (docs/design.md, "Copy threads").
    std::optional<int64_t> copy_threads;
    /// The smallest part a host copy is split into: calls writing less than twice this stay on
    /// the calling thread. >= 4096. Unset (default; `auto`): the CPU family's measured crossover
    /// (stats().host_copy.min_bytes_per_copy_thread; docs/perf.md, "Copy threads").
    std::optional<int64_t> copy_split_bytes;
  };
  Tuning tuning;

  // Remote-value MAC and point-to-point transfer (hsstore extensions).
  /// Keyed MAC (HMAC-SHA256) of remote values, for both remote paths: the secret itself (at
  /// least 16 bytes), or a file holding it (one trailing newline ignored; read when a store or
  /// tier is built). At most one of the two. Set: values without a valid MAC are counted misses,
  /// never served. Needs a build with OpenSSL: otherwise a ConfigError when a store is built.
  std::string hidden_state_mac_key;
  std::string hidden_state_mac_key_file;
  /// A file holding a secret (at least 16 bytes; one trailing newline ignored) that keys hsstore's
  /// own chunk hash (ChunkedTokenDatabase): the hash chain's root seed comes from it, so whoever
  /// chooses prompts cannot compute chunk keys (docs/design.md, "Threat model"). Unset: the
  /// fixed public seed (LMCache's keys, deterministic everywhere).
  std::string hidden_state_chunk_hash_key_file;
  /// Point-to-point transfer (see TransferKind); off by default.
  TransferKind hidden_state_transfer = TransferKind::kNone;
  /// The NIXL backend of hidden_state_transfer: nixl (`UCX` by default).
  std::string hidden_state_transfer_backend = "UCX";
  /// How long a producer keeps an exported chunk's granules pinned for a consumer's READ
  /// (the lease; released earlier by the consumer). 1..3600000.
  int64_t hidden_state_transfer_lease_ms = 30000;
  /// A consumer's bound on one pull (control round trips and the READ). 1..600000.
  int64_t hidden_state_transfer_timeout_ms = 10000;
  /// host:port of a producer's control socket (port 0: any free port).
  std::string hidden_state_transfer_listen = "127.0.0.1:0";
  /// What one peer of the producer's control channel may cost it (docs/design.md, "Threat
  /// model"): chunks one pull request may name; payload bytes one lease (export) may pin;
  /// leases held at once and their bytes, in all and per peer connection; control connections
  /// served at once; how long a served connection may stay idle. Beyond: a counted refusal.
  int64_t hidden_state_transfer_max_chunks = 4096;
  int64_t hidden_state_transfer_max_lease_bytes = int64_t{4} << 30;
  int64_t hidden_state_transfer_max_leases = 1024;
  int64_t hidden_state_transfer_max_leased_bytes = int64_t{16} << 30;
  int64_t hidden_state_transfer_peer_leases = 64;
  int64_t hidden_state_transfer_peer_leased_bytes = int64_t{4} << 30;
  int64_t hidden_state_transfer_max_peers = 64;
  int64_t hidden_state_transfer_idle_ms = 60000;
  /// Lets hsstore.nixl run its control channel without a MAC key (peers unauthenticated, values
  /// unauthenticated): only for a network where every host is trusted. Off: an agent without
  /// hidden_state_mac_key is a ConfigError.
  bool hidden_state_transfer_trusted_network = false;

  /// The process-wide log threshold (stderr). Unset (default; `auto` or null in YAML): left as
  /// it is (HSS_LOG_LEVEL, else info). Set: a store constructed with this config applies it to
  /// the whole process (logging is process-wide; the last store constructed with a level set
  /// wins). HSS_LOG_LEVEL overrides it.
  std::optional<LogLevel> hidden_state_log_level;

  /// Keys present in the input that hsstore does not use (a warning was logged for each).
  std::vector<std::string> unknown_keys;
  /// The HSS_* debugging variables whose values were applied (with_env_overrides), by name:
  /// to_yaml marks the keys they set, stats().host_copy says "environment".
  std::vector<std::string> env_overrides;

  /// Parses YAML text; throws ConfigError naming key, value and line. Validates.
  [[nodiscard]] static Config from_yaml(std::string_view yaml_text);
  /// Reads and parses a YAML file; a missing or unreadable file is a ConfigError. Validates.
  [[nodiscard]] static Config from_file(const std::filesystem::path& path);
  /// Reads the file named by LMCACHE_CONFIG_FILE (if set), then applies LMCACHE_<UPPER_KEY>
  /// environment overrides for single keys, as LMCache does, then the HSS_* debugging variables
  /// (with_env_overrides). Validates.
  [[nodiscard]] static Config from_env();
  /// This config with the HSS_* debugging variables applied, which win over every other source
  /// (README, "Environment"): HSS_RESTORE_IMPL, HSS_OUTPUT_CACHE_MB, HSS_STREAM_THRESHOLD_KB,
  /// HSS_LOG_LEVEL. The one place hsstore reads them: a store runs with
  /// config.with_env_overrides() (so its config's to_yaml shows what is in effect, whatever the
  /// config's source), and from_env applies them too. Does not validate; reads getenv.
  [[nodiscard]] Config with_env_overrides() const;

  /// Throws ConfigError on values that cannot be used together or alone.
  void validate() const;

  /// Bytes of the hidden-state pool (max_hidden_state_cpu_size GiB).
  [[nodiscard]] uint64_t hidden_state_pool_bytes() const;
  /// The directory the disk tier keeps hidden states in: `<hidden_state_disk_path or
  /// local_disk>/hsstore` with a `file://` prefix removed; empty when neither is set.
  [[nodiscard]] std::string hidden_state_disk_dir() const;
  /// Bytes of the disk tier's budget (max_local_disk_size GiB).
  [[nodiscard]] uint64_t disk_tier_bytes() const;
  /// Bytes of the device-resident tier (hidden_state_device_cache_size GiB; 0: off).
  [[nodiscard]] uint64_t device_cache_bytes() const;
  /// Bytes of the KV pool (max_local_cpu_size GiB).
  [[nodiscard]] uint64_t kv_pool_bytes() const;
  /// True when layer_idx passes the hidden_state_layers allowlist (always, when unset). Layer
  /// indices are storage labels compared literally: -1 is "the final state" by convention only.
  [[nodiscard]] bool layer_allowed(int64_t layer_idx) const;
  /// The copy threads a store built with this config on the calling thread gets:
  /// hidden_state_copy_threads, or what `auto` chooses here (the thread's affinity mask, the
  /// cgroup CPU quota, at most 8). A store reports its own in stats().host_copy.
  [[nodiscard]] int64_t effective_copy_threads() const;
  /// True when both allowlists (hidden_state_kinds, hidden_state_layers) pass the slot.
  [[nodiscard]] bool slot_allowed(ActivationKind kind, int64_t layer_idx) const;

  /// The effective values as YAML (round-trips through from_yaml).
  [[nodiscard]] std::string to_yaml() const;

  /// Every key hsstore reads, in the order of the one table of config keys (src/config/config_keys.cpp)
  /// that drives from_yaml, from_env, validate, to_yaml and the Python attributes; README's key
  /// table is checked against it.
  [[nodiscard]] static std::span<const std::string_view> keys();
  /// A key's one-line description (README's "meaning" column, the Python attribute's doc).
  /// Throws InvalidArgument for a key keys() does not list.
  [[nodiscard]] static std::string_view doc(std::string_view key);
  /// A key's value as plain data: null, a bool, an integer, a number, a string (enums by
  /// name), or a list of integers or strings (the Python attributes). Throws InvalidArgument
  /// for a key keys() does not list.
  [[nodiscard]] ConfigValue value(std::string_view key) const;
};

[[nodiscard]] std::string_view to_string(StorageDType dtype);
[[nodiscard]] std::string_view to_string(RestoreImpl impl);
/// "kernel", "copy_engine" or "cub"; nullopt for anything else.
[[nodiscard]] std::optional<RestoreImpl> restore_impl_from_string(std::string_view name);
[[nodiscard]] std::string_view to_string(StoreImpl impl);
/// "staging" or "mapped"; nullopt for anything else.
[[nodiscard]] std::optional<StoreImpl> store_impl_from_string(std::string_view name);
[[nodiscard]] std::string_view to_string(LogLevel level);
/// "debug", "info", "warn", "error" or "off"; nullopt for anything else.
[[nodiscard]] std::optional<LogLevel> log_level_from_string(std::string_view name);
[[nodiscard]] std::string_view to_string(TransferKind kind);
/// "none" or "nixl"; nullopt for anything else.
[[nodiscard]] std::optional<TransferKind> transfer_kind_from_string(std::string_view name);

}  // namespace hss
