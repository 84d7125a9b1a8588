#pragma once
// hss::HiddenStateStore: per-token hidden states cached per (chunk key, layer) on a pinned host
// pool of their own, restored as one contiguous float32 prefix.
//
// Entry state machine (one entry = one (key, layer)):
//
//   free blocks --alloc--> PENDING --copy landed--> READY --evict/drop--> DETACHED --> free blocks
//                  (index, not yet visible)    (visible to retrieve)  (out of the index; its
//                                                                       blocks wait for pins)
//
// * An entry holds its pool blocks through a reference count. The index holds one reference;
//   every retrieve that returns the entry holds another for the duration of its copy ("pinned").
//   Blocks go back to the pool only when the last reference drops, so a retrieve never reads
//   blocks that a concurrent eviction is reusing.
// * A host-path store copies into PENDING blocks outside the index lock and publishes them as
//   READY afterwards. A device-path store publishes at once with a CUDA event; a retrieve that
//   returns the entry waits for that event (and only that one).
// * LRU is per key (all layers of a key together), as in LMCache. Pool pressure evicts the least
//   recently used key's hidden states only; KV is never touched (HS evicted =/> KV evicted).
// * A retrieve that finds KV gone for a chunk drops that key's hidden states on the spot (KV
//   evicted => HS evicted), lazily, with StorageManager::contains().
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

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hss/cache_key.hpp"
#include "hss/config.hpp"
#include "hss/remote_stats.hpp"
#include "hss/storage_manager.hpp"
#include "hss/tensor.hpp"
#include "hss/token_database.hpp"

namespace hss {

struct StoreOptions {
  int64_t layer_idx = 0;
  int64_t token_offset = 0;  ///< rows of hidden_states start at token_ids[token_offset]
  void* stream = nullptr;    ///< cudaStream_t for device input; null = legacy default stream
};

struct RetrieveOptions {
  int64_t layer_idx = 0;
  int64_t row_begin = 0;   ///< copy only rows [row_begin, prefix end) of the prefix
  void* stream = nullptr;  ///< cudaStream_t used by retrieve_hidden_states_into
};

struct HiddenStateStats {
  uint64_t chunks_held = 0;  ///< (key, layer) entries
  uint64_t keys_held = 0;
  uint64_t bytes_held = 0;  ///< payload bytes of the entries held
  uint64_t blocks_held = 0;
  uint64_t pool_capacity_bytes = 0;
  uint64_t block_bytes = 0;  ///< 0 until the first store fixes the granule
  bool pinned = false;       ///< pool is page-locked device-mapped memory (a device was found)
  bool device_path = false;  ///< the CUDA data path is usable in this process
  uint64_t stores = 0;
  uint64_t chunks_written = 0;
  uint64_t retrieves = 0;
  uint64_t hit_tokens = 0;
  uint64_t miss_tokens = 0;
  uint64_t hs_evictions = 0;       ///< keys evicted for pool pressure (HS only)
  uint64_t coupled_evictions = 0;  ///< keys dropped because their KV was gone
  uint64_t allocation_failures = 0;
  RemoteStats remote;  ///< the shared remote tier (all zero when hidden_state_remote_url is unset)
};

/// What coverage() counts: the local pool only, or the local pool and the remote tier.
enum class CoverageScope { kLocal, kLocalAndRemote };

class HiddenStateStore {
 public:
  /// ConfigError if max_hidden_state_cpu_size <= 0. Allocates the whole pool now.
  HiddenStateStore(const Config& config, const TokenDatabase& token_database);
  ~HiddenStateStore();
  HiddenStateStore(const HiddenStateStore&) = delete;
  HiddenStateStore& operator=(const HiddenStateStore&) = delete;

  /// nullptr: treat KV as present for every chunk. The manager must outlive the store.
  void bind_storage_manager(const StorageManager* storage_manager);

  /// Stores rows for the chunks of token_ids that start at or after options.token_offset.
  /// hidden_states has len(token_ids) - token_offset rows. Returns how many chunks of that range
  /// are cached for the layer after the call, already-cached ones included (0 for a layer outside
  /// the allowlist). Under pool pressure evicts this store's LRU keys; stops early (returning the
  /// count so far) when no space can be found. Bad arguments: InvalidArgument, nothing written.
  /// Device input: asynchronous on options.stream; CUDA failures throw hss::Error.
  int64_t store_hidden_states(std::span<const int32_t> token_ids, const TensorView& hidden_states,
                              const StoreOptions& options = {});
  int64_t store_hidden_states(std::span<const int64_t> token_ids, const TensorView& hidden_states,
                              const StoreOptions& options = {});

  /// The longest contiguous prefix whose every chunk has KV and hidden states for the layer, as
  /// rows [row_begin, prefix end). nullopt on a full miss or row_begin at/past the prefix end.
  [[nodiscard]] std::optional<HostTensor> retrieve_hidden_states(
      std::span<const int32_t> token_ids, const RetrieveOptions& options = {});
  [[nodiscard]] std::optional<HostTensor> retrieve_hidden_states(
      std::span<const int64_t> token_ids, const RetrieveOptions& options = {});

  /// Same walk, written into `out` (float32, host or device, at least the rows needed). Returns
  /// the rows written (0 on a miss). Device output: enqueued on options.stream.
  int64_t retrieve_hidden_states_into(std::span<const int32_t> token_ids,
                                      const MutableTensorView& out,
                                      const RetrieveOptions& options = {});
  int64_t retrieve_hidden_states_into(std::span<const int64_t> token_ids,
                                      const MutableTensorView& out,
                                      const RetrieveOptions& options = {});

  /// All-or-nothing multi-layer restore: one tensor per layer, all with the same rows (the
  /// longest prefix where every listed layer is present); empty vector when there is none.
  [[nodiscard]] std::vector<HostTensor> retrieve_layers(std::span<const int32_t> token_ids,
                                                        std::span<const int64_t> layer_idxs,
                                                        int64_t row_begin = 0);
  [[nodiscard]] std::vector<HostTensor> retrieve_layers(std::span<const int64_t> token_ids,
                                                        std::span<const int64_t> layer_idxs,
                                                        int64_t row_begin = 0);

  /// Tokens of the prefix where every chunk has KV and every listed layer. Changes nothing.
  [[nodiscard]] int64_t coverage(std::span<const Chunk> chunks,
                                 std::span<const int64_t> layer_idxs) const;
  /// The same, counting a (chunk, layer) held by the remote tier as present when `scope` says so
  /// (one pipelined EXISTS round trip per server for what is not local; values unchecked, so a
  /// corrupt one still counts). Blocks on the network for kLocalAndRemote, at most the timeout.
  [[nodiscard]] int64_t coverage(std::span<const Chunk> chunks, std::span<const int64_t> layer_idxs,
                                 CoverageScope scope) const;

  [[nodiscard]] size_t num_cached_chunks() const;  ///< (key, layer) entries held
  [[nodiscard]] bool has_chunk(const CacheEngineKey& key, int64_t layer_idx = 0) const;
  /// Drops every layer of the key. True when something was held.
  bool drop_key(const CacheEngineKey& key);
  /// Waits for every pending device-to-host copy, and for the remote write-behind queue to be
  /// sent (or dropped) when a remote tier is configured.
  void flush();
  /// Flushes and releases every entry. Later calls throw hss::Error. Idempotent.
  void close();
  [[nodiscard]] HiddenStateStats stats() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hss
