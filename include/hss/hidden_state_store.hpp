#pragma once
// hss::HiddenStateStore: per-token activations (hidden states, and optionally other kinds) cached
// per (chunk key, kind, layer) on a pinned host pool of their own, restored as one contiguous
// prefix. The semantics are LMCache's HiddenStateStore (0.5.6) wherever LMCache defines them.
//
// Entry state machine (one entry = one (key, kind, layer) "slot"):
//
//   free blocks --alloc--> PENDING --copy landed--> READY --evict/drop--> DETACHED --> free blocks
//                  (index, not yet visible)    (visible to retrieve)  (out of the index; its
//                                                                       blocks wait for pins)
//
// * An entry holds its pool blocks through a reference count. The index holds one reference;
//   every retrieve that returns the entry holds another for the duration of its copy ("pinned").
//   Blocks go back to the pool only when the last reference drops, so a retrieve never reads
//   blocks that a concurrent eviction is reusing.
// * The pool is cut into fixed granules (64 KiB by default, smaller for small pools); an entry
//   takes ceil(bytes / granule) granules that need not be adjacent, so the pool never fragments
//   and, once empty, takes floor(pool / chunk_bytes) chunks of any shape whose bytes are a
//   multiple of the granule (docs/design.md, "Pool").
// * A host-path store copies into PENDING blocks outside the index lock and publishes them as
//   READY afterwards. A device-path store publishes once its copies are enqueued, with a CUDA
//   event (the fence); a host-output retrieve that returns the entry waits for that event (and
//   only that one), a device-output retrieve makes its stream wait for it on the device.
// * An export's lease (hss/pool_transfer.hpp) pins the exported entries like a retrieve: pool
//   pressure skips their keys and their granules are not reused until the lease is released or
//   expires. An import reserves PENDING entries that a transport fills before they are checked
//   and published.
// * Dropping or evicting an entry whose copy is still in flight never waits: its blocks return
//   to the pool once the copy has landed. Entries read by an unfinished device restore stay
//   pinned (never eviction victims) until it has finished.
// * LRU is per key (every slot of a key together), as in LMCache. Pool pressure evicts the least
//   recently used key's activations only; KV is never touched (HS evicted =/> KV evicted). A
//   store never evicts keys of its own token list (the prefix it is extending).
// * A retrieve asks the KV side first, per chunk, as LMCache does: a chunk whose KV is gone has
//   every slot of its key dropped (KV evicted => HS evicted), lazily, with
//   StorageManager::contains(), and the prefix ends there.
//
// Failure: bad arguments throw InvalidArgument naming the argument and its value, with nothing
// changed (stats included). Any exception (std::bad_alloc, a CUDA error) leaves the index and the
// pool exactly as before the call: the strong guarantee.
//
// * Remote tier (hidden_state_remote_url, see docs/design.md): every chunk written to the pool is
//   also queued for a Redis/Valkey server (write-behind, after its device copy landed; a store
//   never waits for the network). A retrieve whose walk stops at a chunk with KV present but
//   hidden states not local fetches that chunk and the rest of the prefix (while KV is present)
//   in one pipelined round trip per server, inserts them into the pool (its LRU applies) and
//   walks on; such a retrieve blocks on the network, each socket operation at most
//   hidden_state_remote_timeout_ms.
//
// Thread safety: every public method may be called from many threads at once. The index lock is
// held for index updates only, never across a copy, a kernel launch or a KV contains() call.
// What may block the host (docs/design.md, "What may block the host, and when"): host-memory
// calls copy on the calling thread (and the store's copy workers, hidden_state_copy_threads, while
// it waits); a host-output retrieve of an entry whose device-to-host copy
// is in flight waits for that copy; a casting device store waits when the device's staging
// budget (hidden_state_staging_bytes) is in flight; a device launch (restore, batch) waits when
// every launch slot of its device (hidden_state_launch_slots) is in flight; flush() and close()
// wait. Nothing else: device-output retrieves, device stores below the budget, drop_key and
// evictions never wait.

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
#include "hss/host_copy_stats.hpp"
#include "hss/remote_stats.hpp"
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

struct HiddenStateStats {
  uint64_t keys_held = 0;     ///< distinct chunk keys (num_cached_chunks(), as LMCache counts)
  uint64_t entries_held = 0;  ///< (key, kind, layer) entries (num_entries())
  uint64_t bytes_held = 0;    ///< payload bytes of the entries held
  uint64_t blocks_held = 0;   ///< pool granules held by the entries of the index
  uint64_t pool_capacity_bytes = 0;  ///< usable bytes: granules x granule_bytes
  uint64_t pool_free_bytes = 0;      ///< granules on the free list x granule_bytes
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
  RemoteStats remote;  ///< the shared remote tier (all zero when hidden_state_remote_url is unset)
  HostCopyStats host_copy;  ///< the host copy strategy chosen for this machine, copy threads
  TransferStats transfer;  ///< point-to-point exports and imports (hss/pool_transfer.hpp)
};

/// What coverage() counts: the local pool only, or the local pool and the remote tier.
enum class CoverageScope { kLocal, kLocalAndRemote };
/// One store of a batch: the arguments of store_hidden_states.
struct StoreItem {
  std::span<const int64_t> token_ids;
  TensorView hidden_states;
  StoreOptions options;
};

/// One retrieve of a batch: the arguments of retrieve_hidden_states_into.
struct RetrieveItem {
  std::span<const int64_t> token_ids;
  MutableTensorView out;
  RetrieveOptions options;
};

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
  /// is touched, not rewritten; one cached with another hidden dim or storage type is replaced.
  /// Under pool pressure evicts LRU keys other than those of token_ids; stops at the first chunk
  /// that does not fit (the cached range stays a contiguous run). A slot outside the allowlists
  /// stores nothing ({0, 0}). Bad arguments: InvalidArgument, nothing written.
  /// Device input: asynchronous on options.stream; CUDA failures throw hss::Error.
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
  /// copies, narrowing rounds to nearest-even). Device output never waits on the host: the
  /// restore is ordered after the entries' pending copies on options.stream, and the entries stay
  /// pinned until it has read them. Returns the rows written (0 on a miss). `out` is checked
  /// against the prefix before anything changes: a too-small view is InvalidArgument with nothing
  /// dropped or counted. Device output: enqueued on options.stream.
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
  /// enqueued on options.stream with no host wait (as retrieve_hidden_states_into).
  int64_t retrieve_layers_into(TokenIds token_ids, std::span<const Slot> slots,
                               std::span<const MutableTensorView> outs,
                               const RetrieveLayersOptions& options = {});
  /// The same with caller-computed chunks (contiguous from 0, as store_chunks): an engine's own
  /// token database (LMCache's keys) restores several slots in one all-or-nothing walk.
  int64_t retrieve_layers_into(std::span<const Chunk> chunks, std::span<const Slot> slots,
                               std::span<const MutableTensorView> outs,
                               const RetrieveLayersOptions& options = {});

  /// Many stores in one call (an engine step: requests x layers). Results are those the single
  /// calls would give, in item order; items sharing a token list (same span) share one key pass;
  /// the index lock is taken once for the whole batch's reservations and once to publish. Every
  /// item is checked first: a bad one is InvalidArgument naming its index ("items[3]: ..."), and
  /// nothing of the batch is done. Device items are one launch per (device, stream), writing the
  /// device-mapped pool directly (no staging: no staging wait). Out of memory while planning an
  /// item withdraws the earlier items' pending entries but keeps their evictions (single stores
  /// keep the strong guarantee). Thread-safe like every method here.
  std::vector<StoreResult> store_batch(std::span<const StoreItem> items);
  /// Many retrieve_hidden_states_into calls in one: rows written per item, identical to the
  /// single calls in item order. Validation as store_batch. Device outputs are one launch per
  /// (device, stream) after the items' fences, on the device: no host wait.
  std::vector<int64_t> retrieve_batch_into(std::span<const RetrieveItem> items);

  /// Tokens of the prefix retrieve_layers would return for these chunks and slots (the same walk,
  /// the same checks): coverage == rows of retrieve_layers(..., row_begin = 0). Changes nothing.
  /// Never waits on the host: a chunk whose device copy is in flight counts as covered (the
  /// restore orders itself after it, or waits for it); one whose copy failed ends the prefix.
  [[nodiscard]] int64_t coverage(std::span<const Chunk> chunks,
                                 std::span<const int64_t> layer_idxs) const;
  [[nodiscard]] int64_t coverage(std::span<const Chunk> chunks, std::span<const Slot> slots) const;
  /// The same, counting a (chunk, slot) held by the remote tier as present when `scope` says so
  /// (one pipelined EXISTS round trip per server for what is not local; values unchecked, so a
  /// corrupt one still counts). Blocks on the network for kLocalAndRemote, at most the timeout.
  [[nodiscard]] int64_t coverage(std::span<const Chunk> chunks, std::span<const int64_t> layer_idxs,
                                 CoverageScope scope) const;
  [[nodiscard]] int64_t coverage(std::span<const Chunk> chunks, std::span<const Slot> slots,
                                 CoverageScope scope) const;

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

 private:
  class Impl;  // src/hidden_state_store_impl.hpp
  // hss/pool_transfer.hpp: the export, lease and import primitives work on the pool directly.
  friend class PoolTransfer;
  friend class Reservation;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hss
