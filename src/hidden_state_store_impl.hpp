#pragma once
// HiddenStateStore::Impl, shared by the store's implementation files:
//   hidden_state_store.cpp        construction, queries, maintenance, the public surface
//   hidden_state_store_write.cpp  the store path (plan under the lock, copy outside it, publish)
//   hidden_state_store_read.cpp   the prefix walk shared by retrieve, retrieve_into, coverage
//
// Lock order: the index mutex, then the pool's free-stack mutex. Never the reverse, never a KV
// backend's lock or a copy under the index mutex.

#include <atomic>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "block_pool.hpp"
#include "data_path.hpp"
#include "hss/hidden_state_store.hpp"
#include "store_index.hpp"

namespace hss {

class HiddenStateStore::Impl {
 public:
  Impl(const Config& config, const TokenDatabase& token_database);
  ~Impl();

  void bind(const StorageManager* manager) {
    storage_manager_.store(manager, std::memory_order_release);
  }

  // ---- write path (hidden_state_store_write.cpp)
  template <typename Token>
  StoreResult store_tokens(std::span<const Token> token_ids, const TensorView& hidden,
                           const StoreOptions& opt);
  StoreResult store_chunks(std::span<const Chunk> chunks, const TensorView& hidden,
                           const StoreOptions& opt);

  // ---- read path (hidden_state_store_read.cpp)
  template <typename Token>
  std::vector<HostTensor> retrieve_tokens(std::span<const Token> token_ids,
                                          std::span<const Slot> slots, int64_t row_begin);
  std::vector<HostTensor> retrieve_chunk_list(std::span<const Chunk> chunks, int64_t n_tokens,
                                              std::span<const Slot> slots, int64_t row_begin);
  template <typename Token>
  int64_t retrieve_tokens_into(std::span<const Token> token_ids, const MutableTensorView& out,
                               const RetrieveOptions& opt);
  int64_t retrieve_chunk_list_into(std::span<const Chunk> chunks, int64_t n_tokens,
                                   const MutableTensorView& out, const RetrieveOptions& opt);
  int64_t coverage(std::span<const Chunk> chunks, std::span<const Slot> slots) const;

  // ---- queries and maintenance (hidden_state_store.cpp)
  size_t num_cached_chunks() const;
  size_t num_entries() const;
  bool has_chunk(const CacheEngineKey& key, Slot slot) const;
  bool drop_key(const CacheEngineKey& key);
  std::vector<CacheEngineKey> lru_keys() const;
  bool evict_one_lru();
  void check_invariants() const;
  void flush();
  void close();
  HiddenStateStats stats() const;

  /// Chunks passed by a caller: contiguous from 0, non-empty. InvalidArgument otherwise.
  static void check_chunks(std::span<const Chunk> chunks);

 private:
  /// What a prefix walk found, before anything changed: the pinned entries of the prefix
  /// ([chunk][slot] flattened), the chunk whose KV is gone (to drop), the prefix length.
  struct Walk {
    std::span<const Chunk> chunks;
    size_t slots = 0;
    std::vector<detail::EntryRef> pinned;
    int64_t hits = 0;
    std::optional<size_t> orphan;       // KV gone here: drop the key, prefix ends here
    std::optional<size_t> failed_copy;  // a device copy into this chunk failed: drop it
    int64_t prefix_tokens = 0;

    [[nodiscard]] const detail::Entry& entry(int64_t chunk, size_t slot) const {
      return *pinned[static_cast<size_t>(chunk) * slots + slot];
    }
    [[nodiscard]] int64_t cols(size_t slot) const { return hits == 0 ? 0 : entry(0, slot).cols; }
  };
  /// Walks the chunks: slot presence under the lock, KV presence outside it, fence waits. Pins
  /// what it returns; changes nothing. Throws hss::Error when the store is closed.
  Walk plan_walk(std::span<const Chunk> chunks, std::span<const Slot> slots) const;
  /// Applies a walk: drops the orphan (coupled eviction) and failed chunks, touches the prefix in
  /// reverse order, counts the retrieve. Never throws.
  void apply_walk(const Walk& w, int64_t n_tokens) noexcept;
  /// Rows [row_begin, prefix end) of slot `slot` of a walk as gather segments.
  std::vector<kernels::GatherSegment> plan_restore(const Walk& w, size_t slot,
                                                   int64_t row_begin) const;

  /// Store phases (hidden_state_store_write.cpp).
  struct Write;
  struct StorePlan;
  /// Arguments already validated: the allowlists, then the three phases.
  StoreResult store_validated(std::span<const Chunk> chunks, const TensorView& hidden,
                              const StoreOptions& opt);
  void reserve_and_apply(const TensorView& hidden, const StoreOptions& opt,
                         kernels::ElemType storage, StorePlan& plan);
  void copy_rows(StorePlan& plan, const TensorView& hidden, const StoreOptions& opt);
  void publish(StorePlan& plan) noexcept;
  void withdraw(StorePlan& plan) noexcept;
  /// Evicts one LRU key for pool pressure, skipping keys guarded by store call `guard`. False
  /// when nothing can be evicted. Caller holds mutex_.
  bool evict_for_space(uint64_t guard) noexcept;

  void check_open_locked() const;

  const Config config_;
  const TokenDatabase& token_database_;
  // Declared before the device path: members die in reverse order, so the pool outlives every
  // entry the device path may still hold.
  detail::BlockPool pool_;
  std::unique_ptr<detail::DevicePath> device_path_;
  std::atomic<const StorageManager*> storage_manager_{nullptr};

  mutable std::mutex mutex_;  // guards index_, Entry::ready, closed_, next_guard_
  detail::StoreIndex index_;
  bool closed_ = false;
  uint64_t next_guard_ = 0;

  struct Counters {
    std::atomic<uint64_t> stores{0}, chunks_written{0}, retrieves{0}, hit_tokens{0}, miss_tokens{0},
        hs_evictions{0}, coupled_evictions{0}, allocation_failures{0};
    std::array<std::atomic<uint64_t>, kNumActivationKinds> kind_chunks_written{};
  };
  mutable Counters counters_;
};

}  // namespace hss
