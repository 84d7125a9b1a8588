#pragma once
// hss::HiddenStateStore: per-token activations (hidden states, and optionally other kinds) cached
// beside the KV cache under the same chunk keys, per (chunk key, kind, layer) slot, on a pinned
// host pool of its own (max_hidden_state_cpu_size GiB), and restored as one contiguous prefix.
// The semantics are LMCache's HiddenStateStore (0.5.6) wherever LMCache defines them: token_ids is
// always the full prefix and token_offset marks the rows already cached; a retrieve stops at the
// first chunk missing KV or the slot; evicted KV drops the key's activations (lazily, through
// StorageManager::contains()); pool pressure evicts the least recently used key's activations
// only, never KV.
//
// How it works (pool, pins, eviction, device fences, the remote tier): docs/design.md. The entry
// state machine is drawn once, in src/index/store_index.hpp above `Entry`.
//
// Failure (exactly what holds, per call and cause: docs/design.md, "Failure model"): bad
// arguments throw InvalidArgument naming the argument and its value, with nothing changed, stats
// included. A single call that throws anything else before it copies (std::bad_alloc; hss::Error
// for a closed store) has changed nothing either; a store whose copy fails (a CUDA error)
// withdraws its own rows but keeps the evictions it made, and a batch keeps the evictions of the
// items it planned before failing. A remote tier's read-through and write-behind weaken this by
// what design.md lists.
//
// Thread safety and blocking: every method may be called from many threads at once (close()
// included; only destruction must not race another call). What may wait on the host, and for
// what, is one table: docs/design.md, "What may run concurrently and what may block the host".

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hss/activation.hpp"
#include "hss/cache_key.hpp"
#include "hss/config.hpp"
#include "hss/detail/stats_fields.hpp"
#include "hss/host_copy_stats.hpp"
#include "hss/remote_stats.hpp"
#include "hss/tier_stats.hpp"
#include "hss/storage_manager.hpp"
#include "hss/tensor.hpp"
#include "hss/token_database.hpp"
#include "hss/token_ids.hpp"
#include "hss/transfer_stats.hpp"

namespace hss {

struct StoreOptions {
  int64_t layer_idx = 0;
  int64_t token_offset = 0;  ///< rows of hidden_states start at token_ids[token_offset]
  ActivationKind kind = ActivationKind::kHidden;
  Stream stream = nullptr;  ///< orders device input reads; null = legacy default stream
};

struct RetrieveOptions {
  int64_t layer_idx = 0;
  int64_t row_begin = 0;  ///< copy only rows [row_begin, prefix end) of the prefix
  ActivationKind kind = ActivationKind::kHidden;
  Stream stream = nullptr;  ///< orders device output writes (retrieve_*_into)
};

/// Options of retrieve_layers_into (the layer/kind come from its slots).
struct RetrieveLayersOptions {
  int64_t row_begin = 0;    ///< copy only rows [row_begin, prefix end) of the prefix
  Stream stream = nullptr;  ///< orders device output writes
};

/// What a store did. `written` is LMCache's return value (chunks newly written by this call: 0
/// when the whole range was already cached); `cached` is how many chunks of the range
/// [token_offset, end) are cached for the slot after the call, already-cached ones included.
struct StoreResult {
  int64_t written = 0;
  int64_t cached = 0;

  friend bool operator==(const StoreResult&, const StoreResult&) = default;
};

struct KindStats {
  uint64_t entries_held = 0;
  uint64_t bytes_held = 0;
  uint64_t chunks_written = 0;
};

/// KindStats's fields, each once, in the order stats() reports them: the Python dict is
/// built from this list, the stub and docs/stats.md are checked against it
/// (hss/detail/stats_fields.hpp).
template <detail::MaybeConst<KindStats> Self, class Visit>
constexpr void for_each_field(Self& s, Visit&& visit) {
  visit("entries_held", s.entries_held);
  visit("bytes_held", s.bytes_held);
  visit("chunks_written", s.chunks_written);
}

struct HiddenStateStats {
  uint64_t keys_held = 0;     ///< distinct chunk keys (num_cached_chunks(), as LMCache counts)
  uint64_t entries_held = 0;  ///< (key, kind, layer) entries (num_entries())
  uint64_t bytes_held = 0;    ///< payload bytes of the entries held
  uint64_t blocks_held = 0;   ///< pool granules held by the entries of the index
  uint64_t pool_capacity_bytes = 0;  ///< usable bytes: granules x granule_bytes
  uint64_t pool_free_bytes = 0;      ///< granules on the free list x granule_bytes (a store in
                                     ///< flight holds granules counted in neither this nor
                                     ///< blocks_held until it publishes or gives them back)
  uint64_t granule_bytes = 0;        ///< the pool's allocation unit
  bool pinned = false;       ///< pool is page-locked device-mapped memory (a device was found)
  bool device_path = false;  ///< the CUDA data path is usable in this process
  bool closed = false;
  uint64_t stores = 0;
  uint64_t chunks_written = 0;
  uint64_t retrieves = 0;
  uint64_t hit_tokens = 0;
  uint64_t miss_tokens = 0;
  uint64_t hs_evictions = 0;         ///< keys evicted for pool pressure (HS only)
  uint64_t coupled_evictions = 0;    ///< keys dropped because their KV was gone
  uint64_t allocation_failures = 0;  ///< stores that stopped early for want of pool space
  /// Chunks dropped because the device copy into them failed (never served)
  uint64_t copy_failures = 0;
  uint64_t staging_waits = 0;  ///< device stores that waited on the host for staging space
  uint64_t launch_waits = 0;   ///< device launches that waited on the host for a launch slot
  /// Kernel launches and copy calls the device path enqueued (a batch: one per device and stream)
  uint64_t device_launches = 0;
  std::array<KindStats, kNumActivationKinds> per_kind{};  ///< indexed by ActivationKind
  /// The Redis tier's own fields, filled by that tier (all zero when hidden_state_remote_url is
  /// unset); kept for its older readers: `tiers` is every tier's view in one shape.
  RemoteStats remote;
  /// The backing tiers in the order a retrieve asks them, one shape for every tier (empty when
  /// none is configured); `remote` keeps the Redis tier's own fields.
  std::vector<TierStats> tiers;
  HostCopyStats host_copy;  ///< the host copy strategy chosen for this machine, copy threads
  TransferStats transfer;   ///< point-to-point exports and imports (hss/pool_transfer.hpp)
};

/// HiddenStateStats's fields, each once, in the order stats() reports them: the Python dict is
/// built from this list, the stub and docs/stats.md are checked against it
/// (hss/detail/stats_fields.hpp).
template <detail::MaybeConst<HiddenStateStats> Self, class Visit>
constexpr void for_each_field(Self& s, Visit&& visit) {
  visit("keys_held", s.keys_held);
  visit("entries_held", s.entries_held);
  visit("bytes_held", s.bytes_held);
  visit("blocks_held", s.blocks_held);
  visit("pool_capacity_bytes", s.pool_capacity_bytes);
  visit("pool_free_bytes", s.pool_free_bytes);
  visit("granule_bytes", s.granule_bytes);
  visit("pinned", s.pinned);
  visit("device_path", s.device_path);
  visit("closed", s.closed);
  visit("stores", s.stores);
  visit("chunks_written", s.chunks_written);
  visit("retrieves", s.retrieves);
  visit("hit_tokens", s.hit_tokens);
  visit("miss_tokens", s.miss_tokens);
  visit("hs_evictions", s.hs_evictions);
  visit("coupled_evictions", s.coupled_evictions);
  visit("allocation_failures", s.allocation_failures);
  // Not the declaration order: the dict's, as it shipped.
  visit("staging_waits", s.staging_waits);
  visit("device_launches", s.device_launches);
  visit("launch_waits", s.launch_waits);
  visit("copy_failures", s.copy_failures);
  visit("per_kind", s.per_kind);
  visit("remote", s.remote);
  visit("tiers", s.tiers);
  visit("transfer", s.transfer);
  visit("host_copy", s.host_copy);
}

/// What coverage() counts: the local pool only, or the local pool and every backing tier.
enum class CoverageScope {
  kLocal,
  kAllTiers,  ///< the pool, then each backing tier in retrieve order for what is not local
  kLocalAndRemote [[deprecated("use CoverageScope::kAllTiers (it counts every tier)")]] =
      kAllTiers,
};
/// One store of a batch: the arguments of store_hidden_states. Items passing the same ids (the
/// same data pointer, size and width: a request's layers) share one key pass.
struct StoreItem {
  TokenIds token_ids;
  TensorView hidden_states;
  StoreOptions options;
};

/// One retrieve of a batch: the arguments of retrieve_hidden_states_into (the key pass shared
/// as for StoreItem).
struct RetrieveItem {
  TokenIds token_ids;
  MutableTensorView out;
  RetrieveOptions options;
};

class HiddenStateStore;
namespace detail {
class TransferSide;  // src/store/transfer_side.hpp
TransferSide& transfer_side(HiddenStateStore& store);
}  // namespace detail

class HiddenStateStore {
 public:
  /// ConfigError if max_hidden_state_cpu_size <= 0; hss::Error if the pool does not fit in the
  /// memory available to the process. Allocates the whole pool now.
  HiddenStateStore(const Config& config, const TokenDatabase& token_database);
  ~HiddenStateStore();
  HiddenStateStore(const HiddenStateStore&) = delete;
  HiddenStateStore& operator=(const HiddenStateStore&) = delete;

  /// nullptr: treat KV as present for every chunk. The manager must outlive the store.
  void bind_storage_manager(const StorageManager* storage_manager);

  /// Stores rows for the chunks of token_ids that start at or after options.token_offset (a
  /// chunk straddling token_offset is skipped: chunks stay atomic with KV). hidden_states has
  /// len(token_ids) - token_offset rows. A chunk already cached for the slot with the same shape
  /// is touched, not rewritten; one cached with another hidden dim, storage type or row count
  /// (a caller's chunk list giving a key another length) is replaced. A list naming a key twice
  /// writes it once, at its first chunk, as LMCache does. Under pool pressure evicts LRU keys other than those of token_ids; stops at the first chunk
  /// that does not fit (the cached range stays a contiguous run). A slot outside the allowlists
  /// stores nothing ({0, 0}). Bad arguments: InvalidArgument, nothing written.
  /// Device input: enqueued on options.stream (it reads the input there); CUDA failures throw
  /// hss::Error.
  StoreResult store_hidden_states(TokenIds token_ids, const TensorView& hidden_states,
                                  const StoreOptions& options = {});
  /// The same with caller-computed chunks (LMCache's own token database, an engine's block
  /// hashes): chunks[0].start == 0, chunks[i].start == chunks[i-1].end, every chunk non-empty;
  /// hidden_states has chunks.back().end - token_offset rows.
  StoreResult store_chunks(std::span<const Chunk> chunks, const TensorView& hidden_states,
                           const StoreOptions& options = {});

  /// The longest contiguous prefix whose every chunk has KV and the slot, as float32 rows
  /// [row_begin, prefix end). nullopt on a full miss or row_begin at/past the prefix end.
  [[nodiscard]] std::optional<HostTensor> retrieve_hidden_states(
      TokenIds token_ids, const RetrieveOptions& options = {});
  [[nodiscard]] std::optional<HostTensor> retrieve_chunks(std::span<const Chunk> chunks,
                                                          const RetrieveOptions& options = {});

  /// Same walk, written into `out` (host or device, at least the rows needed, cols = the cached
  /// hidden dim, dtype float32, bfloat16 or float16 whatever the storage: same-type rows are bit
  /// copies, narrowing rounds to nearest-even). Device output is enqueued on options.stream,
  /// ordered there after the entries' pending copies; the entries stay pinned until it has read
  /// them. Returns the rows written (0 on a miss). `out` is checked against the prefix before
  /// anything changes: a too-small view is InvalidArgument with nothing dropped or counted.
  int64_t retrieve_hidden_states_into(TokenIds token_ids, const MutableTensorView& out,
                                      const RetrieveOptions& options = {});
  int64_t retrieve_chunks_into(std::span<const Chunk> chunks, const MutableTensorView& out,
                               const RetrieveOptions& options = {});

  /// All-or-nothing multi-slot restore: one tensor per slot, all with the same rows (the longest
  /// prefix where every listed slot is present); empty vector when there is none. The layer-index
  /// forms mean kind kHidden. An empty list is InvalidArgument.
  [[nodiscard]] std::vector<HostTensor> retrieve_layers(TokenIds token_ids,
                                                        std::span<const int64_t> layer_idxs,
                                                        int64_t row_begin = 0);
  [[nodiscard]] std::vector<HostTensor> retrieve_layers(TokenIds token_ids,
                                                        std::span<const Slot> slots,
                                                        int64_t row_begin = 0);

  /// retrieve_layers into caller buffers, host or device, any output dtype: outs[i] receives
  /// slots[i]. Returns the rows written to each (0 on a miss: nothing written). Device outputs are
  /// enqueued on options.stream (as retrieve_hidden_states_into).
  int64_t retrieve_layers_into(TokenIds token_ids, std::span<const Slot> slots,
                               std::span<const MutableTensorView> outs,
                               const RetrieveLayersOptions& options = {});
  /// The same with caller-computed chunks (contiguous from 0, as store_chunks): an engine's own
  /// token database (LMCache's keys) restores several slots in one all-or-nothing walk.
  int64_t retrieve_layers_into(std::span<const Chunk> chunks, std::span<const Slot> slots,
                               std::span<const MutableTensorView> outs,
                               const RetrieveLayersOptions& options = {});

  /// Many stores in one call (an engine step: requests x layers). Results are those the single
  /// calls would give, in item order; items passing the same token ids (the same pointer, size and
  /// width) share one key pass; the index lock is taken once for the whole batch's reservations
  /// and once to publish. Every item is checked first: a bad one is InvalidArgument naming its
  /// index ("items[3]: ..."), and nothing of the batch is done. Device items are one launch per
  /// (device, stream), writing the device-mapped pool directly. Out of memory while planning an
  /// item withdraws the earlier items' pending entries but keeps their evictions; a failed copy
  /// withdraws every item's rows.
  std::vector<StoreResult> store_batch(std::span<const StoreItem> items);
  /// Many retrieve_hidden_states_into calls in one: rows written per item, identical to the
  /// single calls in item order. Validation as store_batch. Device outputs are one launch per
  /// (device, stream), ordered on the device after the items' pending copies. Items passing the
  /// same token ids share the key pass and the bound StorageManager's answers: contains() is
  /// asked once per chunk of those ids in the call, not once per item (as if no KV eviction
  /// landed during the call).
  std::vector<int64_t> retrieve_batch_into(std::span<const RetrieveItem> items);

  /// Tokens of the prefix retrieve_layers would return for these chunks and slots (the same walk,
  /// the same checks): coverage == rows of retrieve_layers(..., row_begin = 0). Changes nothing
  /// and waits for no copy: a chunk whose device copy is in flight counts as covered (the restore
  /// orders itself after it, or waits for it); one a non-blocking query sees failed ends the
  /// prefix. With no store, drop or eviction in between, a copy that fails after that query is
  /// the only way a retrieve then gets fewer rows (counted in stats().copy_failures).
  [[nodiscard]] int64_t coverage(std::span<const Chunk> chunks,
                                 std::span<const int64_t> layer_idxs) const;
  [[nodiscard]] int64_t coverage(std::span<const Chunk> chunks, std::span<const Slot> slots) const;
  /// The same, counting a (chunk, slot) a backing tier holds as present when `scope` is
  /// kAllTiers: what is not local is asked of the tiers in retrieve order, each asked only what
  /// the ones before it lack (values unchecked, so a corrupt one still counts). kAllTiers blocks
  /// on each tier's contains(), which its own header documents (the Redis tier waits on the
  /// network; docs/design.md's table).
  [[nodiscard]] int64_t coverage(std::span<const Chunk> chunks, std::span<const int64_t> layer_idxs,
                                 CoverageScope scope) const;
  [[nodiscard]] int64_t coverage(std::span<const Chunk> chunks, std::span<const Slot> slots,
                                 CoverageScope scope) const;
  /// coverage(chunks, slots, kAllTiers) and which tier holds each chunk of that prefix
  /// ("host", "disk", "remote": hss/tier_stats.hpp). Waits on the tiers as that call does.
  [[nodiscard]] TierCoverage coverage_by_tier(std::span<const Chunk> chunks,
                                              std::span<const Slot> slots) const;

  /// Distinct chunk keys held (LMCache's num_cached_chunks).
  [[nodiscard]] size_t num_cached_chunks() const;
  /// (key, kind, layer) entries held.
  [[nodiscard]] size_t num_entries() const;
  [[nodiscard]] bool has_chunk(const CacheEngineKey& key, int64_t layer_idx = 0,
                               ActivationKind kind = ActivationKind::kHidden) const;
  /// Drops every slot of the key. True when something was held.
  bool drop_key(const CacheEngineKey& key);
  /// Keys from least to most recently used (tests and admin tools).
  [[nodiscard]] std::vector<CacheEngineKey> lru_keys() const;
  /// Evicts the least recently used evictable key, as pool pressure would. False if none.
  bool evict_one_lru();
  /// Debug check of the index and pool invariants (accounting, LRU links, block ownership, no
  /// granule both free and held). Throws hss::Error naming the first broken invariant. O(size).
  void check_invariants() const;
  /// Waits for every pending device-to-host copy, and for the remote write-behind queue to be
  /// sent (or dropped) when a remote tier is configured.
  void flush();
  /// Flushes and releases every entry; final even against concurrent calls: once it returns the
  /// store holds nothing. Afterwards store/retrieve/coverage/drop_key/evict_one_lru throw
  /// hss::Error; has_chunk is false, num_* and lru_keys are empty, flush does nothing and stats
  /// works (closed = true). Idempotent.
  void close();
  [[nodiscard]] HiddenStateStats stats() const;
  /// The config this store runs with: the one it was given with the HSS_* debugging variables
  /// applied (Config::with_env_overrides), so its to_yaml() shows what is in effect. Fixed at
  /// construction: may be read from any thread, even during close().
  [[nodiscard]] const Config& config() const;

 private:
  class Impl;  // src/store/hidden_state_store_impl.hpp
  // hss/pool_transfer.hpp: PoolTransfer and Reservation reach the store's export and import side
  // (and nothing else) through this one door (src/store/transfer_side.hpp).
  friend detail::TransferSide& detail::transfer_side(HiddenStateStore& store);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hss
