#pragma once
// HiddenStateStore::Impl, shared by the store's implementation files:
//   hidden_state_store.cpp        construction, queries, maintenance, the public surface
//   hidden_state_store_write.cpp  the store path (plan under the lock, copy outside it, publish)
//   hidden_state_store_read.cpp   the prefix walk shared by retrieve, retrieve_into, coverage
//   hidden_state_store_tiers.cpp  read-through and coverage over the backing tiers
//   hidden_state_store_transfer.cpp exports with leases, imports (hss/pool_transfer.hpp)
//
// Lock order: the index mutex, then the pool's free-stack mutex. Never the reverse, never a KV
// backend's lock or a copy under the index mutex.

#include <array>
#include <atomic>
#include <memory_resource>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "config/copy_threads.hpp"
#include "datapath/data_path.hpp"
#include "datapath/host/copy_workers.hpp"
#include "datapath/host/host_copy.hpp"
#include "format/dtype_codes.hpp"
#include "format/value_mac.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/pool_transfer.hpp"
#include "index/entry_pool.hpp"
#include "index/lease_table.hpp"
#include "index/store_index.hpp"
#include "pool/block_pool.hpp"
#include "pool/deferred_release.hpp"
#include "tiers/tier_chain.hpp"

namespace hss {

namespace detail {

/// The KV answers for one chunk list, shared by the items of a batch that pass it (the layers of
/// a request): each chunk's StorageManager::contains() is asked once per call, not once per item
/// (the KV side is read at one moment for the whole batch; a KV backend's lock, or the GIL for a
/// Python manager, is taken a third as often for a three-layer step). Asked in the walk's order:
/// an item asks only the chunks its own walk reaches, and finds the answers an earlier item of
/// the list got. A manager bound in between is asked afresh. Used by one thread, no lock held.
class KvAnswers {
 public:
  /// Chunk `chunk` (of `chunks`) of the list: KV's answer, asked now unless asked before.
  [[nodiscard]] bool contains(const StorageManager& kv, size_t chunk, size_t chunks,
                              const CacheEngineKey& key) {
    if (&kv != asked_) {  // the list's first question, or another manager: forget the answers
      asked_ = &kv;
      if (chunks <= kInline) {
        inline_.fill(kUnknown);
      } else {
        heap_.assign(chunks, kUnknown);  // a long prompt's list: one allocation
      }
    }
    uint8_t& answer = chunks <= kInline ? inline_[chunk] : heap_[chunk];
    if (answer == kUnknown) answer = kv.contains(key) ? kPresent : kGone;
    return answer == kPresent;
  }

 private:
  static constexpr uint8_t kUnknown = 0, kPresent = 1, kGone = 2;
  static constexpr size_t kInline = 16;  // a short prompt's chunks: no allocation per list
  const StorageManager* asked_ = nullptr;
  std::array<uint8_t, kInline> inline_{};
  std::vector<uint8_t> heap_;
};

}  // namespace detail

class HiddenStateStore::Impl {
 public:
  [[nodiscard]] const Config& config() const { return config_; }
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
  /// The outputs of a read whose caller wants them made (retrieve_hidden_states, retrieve_layers):
  /// float32 host tensors of the prefix's rows [row_begin, prefix end), one per slot, made after
  /// the walk (their size is the walk's answer) and before anything is restored.
  struct AllocatedOutputs {
    std::vector<HostTensor> tensors;
    std::vector<MutableTensorView> views;
  };
  /// One retrieve call's arguments as the public surface received them. Every single retrieve
  /// (token or chunk form, one slot or several, into caller buffers or into tensors the store
  /// makes) is one ReadCall; retrieve() checks it (check_read, the one place) and runs it as a
  /// batch of one read.
  struct ReadCall {
    TokenIds tokens{};               ///< the token forms (keys made in retrieve)...
    std::span<const Chunk> chunks{};  ///< ...or the chunk forms' caller chunks
    bool chunk_form = false;         ///< `chunks` is the caller's (checked: contiguous from 0)
    std::span<const Slot> slots{};
    bool slot_from_options = false;  ///< one slot from RetrieveOptions (named options.kind)
    std::span<const MutableTensorView> outs{};  ///< the *_into forms: one view per slot
    AllocatedOutputs* allocate = nullptr;     ///< the tensor forms: outs empty, made here
    int64_t row_begin = 0;
    Stream stream = nullptr;
  };
  /// InvalidArgument naming the argument, before anything changes: row_begin >= 0, slots (or
  /// options.kind), caller chunks, outputs (count, views, pointers, stream).
  void check_read(const ReadCall& call) const;
  /// check_read, keys, then retrieve_reads as a batch of one; the rows written (0 on a miss).
  int64_t retrieve(const ReadCall& call);
  int64_t coverage(std::span<const Chunk> chunks, std::span<const Slot> slots) const;

  // ---- batch calls (hidden_state_store_batch.cpp)
  std::vector<StoreResult> store_batch(std::span<const StoreItem> items);
  std::vector<int64_t> retrieve_batch_into(std::span<const RetrieveItem> items);

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

  // ---- backing tiers (hidden_state_store_tiers.cpp); no-ops without a tier
  /// Read-through: from the first chunk whose slots are not all local, up to the first chunk
  /// without KV, fetches the missing (chunk, slot) values from the tiers in order (each tier
  /// asked once, for what the tiers before it did not have) and inserts each into the pool as
  /// it arrives. The walk that follows decides the prefix. Returns the entries inserted.
  /// `kv_answers` (optional): the call's KV answers, which the walk then reuses.
  size_t read_through(std::span<const Chunk> chunks, std::span<const Slot> slots,
                      detail::KvAnswers* kv_answers = nullptr);
  /// coverage() extended by the values some tier holds (CoverageScope::kLocalAndRemote).
  int64_t coverage_with_tiers(std::span<const Chunk> chunks, std::span<const Slot> slots) const;
  /// The first chunk at or after `from` whose KV is gone (chunks.size() when none is, or when no
  /// KV side is bound). Asks the storage manager outside every lock.
  size_t kv_prefix_end(std::span<const Chunk> chunks, size_t from,
                       detail::KvAnswers* kv_answers = nullptr) const;

  /// Chunks passed by a caller: contiguous from 0, non-empty. InvalidArgument otherwise.
  static void check_chunks(std::span<const Chunk> chunks);

  // ---- pool transfer (hidden_state_store_transfer.cpp; the rules: hss/pool_transfer.hpp)
  std::vector<MemoryRegion> memory_regions() const;
  ChunkExport export_chunks(std::span<const Chunk> chunks, std::span<const Slot> slots,
                            size_t first_chunk, std::chrono::milliseconds lease);
  bool release_lease(uint64_t lease_id) noexcept;
  std::pair<size_t, size_t> missing_range(std::span<const Chunk> chunks,
                                          std::span<const Slot> slots) const;
  void reserve_import(std::span<const Chunk> chunks, const ChunkExport& source,
                      Reservation::State& state);
  ImportResult publish_import(Reservation::State& state);
  /// Checks items [first, first + count) of a reservation (no lock); the failures.
  size_t check_import(Reservation::State& state, size_t first, size_t count) const;
  void abandon_import(Reservation::State& state) noexcept;
  /// Ends the leases past their deadline (no lock held by the caller).
  void expire_leases() noexcept { leases_.expire(detail::LeaseTable::Clock::now()); }

 private:
  /// What a prefix walk found, before anything changed: the pinned entries of the prefix
  /// ([chunk][slot] flattened), the chunk whose KV is gone (to drop), the prefix length.
  struct Walk {
    /// The walk's pins: on the heap, or in a batch's arena (retrieve_batch_into's host items,
    /// one allocation for the batch); restore_walks never lets an arena's pins outlive the call.
    using Pins = std::pmr::vector<detail::EntryRef>;
    explicit Walk(std::pmr::memory_resource* memory = std::pmr::new_delete_resource())
        : pinned(memory) {}
    Walk(Walk&&) = default;
    Walk& operator=(Walk&&) = default;
    Walk(const Walk&) = delete;  // a copy's pins would take the process-wide default resource
    Walk& operator=(const Walk&) = delete;
    ~Walk() = default;

    std::span<const Chunk> chunks;
    size_t slots = 0;
    Pins pinned;
    int64_t hits = 0;
    std::optional<size_t> orphan;       // KV gone here: drop the key, prefix ends here
    std::optional<size_t> failed_copy;  // a device copy into this chunk failed: drop it
    int64_t prefix_tokens = 0;
    std::vector<detail::FenceRef> fences;  // distinct unlanded fences of the prefix (no host wait)
    bool any_fence = false;  // a pinned entry carries a fence (device path): walk_finish checks

    [[nodiscard]] const detail::Entry& entry(int64_t chunk, size_t slot) const {
      return *pinned[static_cast<size_t>(chunk) * slots + slot];
    }
    [[nodiscard]] int64_t cols(size_t slot) const { return hits == 0 ? 0 : entry(0, slot).cols; }
  };
  /// Walks the chunks: slot presence under the lock, KV presence outside it, fence waits. Pins
  /// what it returns; changes nothing. Throws hss::Error when the store is closed.
  /// What the walk does about a chunk whose device copy is still in flight:
  ///   kWaitOnHost     host outputs, exports: wait for the copy; a failed one ends the prefix.
  ///   kOrderOnDevice  device outputs: no host wait; the restore orders itself after the entries'
  ///                   fences on the device (Walk::fences); cached failure flags end the prefix.
  ///   kQuery          coverage(): no host wait and no ordering; the copy counts as there unless a
  ///                   non-blocking query says it failed (a restore would get its rows).
  enum class PendingCopies { kWaitOnHost, kOrderOnDevice, kQuery };
  Walk plan_walk(std::span<const Chunk> chunks, std::span<const Slot> slots,
                 PendingCopies pending = PendingCopies::kWaitOnHost) const;
  /// plan_walk in two parts: the index part (caller holds mutex_), then KV and fences (no lock).
  /// `lookups` (optional): the chunk list's record lookups, shared by the items of a batch.
  void walk_index_locked(Walk& w, std::span<const Chunk> chunks, std::span<const Slot> slots,
                         detail::RecordLookups* lookups = nullptr) const;
  /// `kv_answers` (optional): the chunk list's KV answers, shared by the items of a batch.
  void walk_finish(Walk& w, PendingCopies pending, detail::KvAnswers* kv_answers = nullptr) const;
  /// Applies a walk, mutex_ held by the caller: drops the orphan (coupled eviction) and failed
  /// chunks, touches the prefix in reverse order. Never throws. (retrieve_reads counts.)
  /// `touch_from`: the chunks before it are touched again later in the same locked section (a
  /// batch's later item of the same list), so touching them here would not change the order.
  void apply_walk_locked(const Walk& w, detail::RecordLookups* lookups = nullptr,
                         int64_t touch_from = 0) noexcept;
  /// After a walk was applied (no lock held): the backing tiers may drop the orphan's values
  /// (its KV is gone; tiers/backing_tier.hpp, discard).
  void discard_orphan(const Walk& w) noexcept;
  /// The checks of `outs` against what the walk found (InvalidArgument, nothing changed).
  /// `item`: the batch index to name in a message (none for a single call).
  void check_walk_outputs(const Walk& w, std::span<const MutableTensorView> outs, int64_t row_begin,
                          std::optional<size_t> item = std::nullopt) const;
  /// Views and slots of a restore into caller buffers: counts match, views valid, pointers where
  /// their device says (InvalidArgument naming the view otherwise).
  /// The outputs' views and pointers, and `stream` when an output is device memory.
  void check_outputs(std::span<const Slot> slots, std::span<const MutableTensorView> outs,
                     Stream stream) const;
  /// One read of a retrieve call: a chunk list restored into `outs` (one view per slot), or into
  /// outputs the pipeline allocates (`allocate`). A single call is a batch of one read.
  struct ReadItem {
    std::span<const Chunk> chunks;
    int64_t n_tokens = 0;  ///< tokens the caller passed (for the miss count)
    std::span<const Slot> slots;
    std::span<const MutableTensorView> outs;  ///< checked by check_outputs already
    int64_t row_begin = 0;
    Stream stream = nullptr;
    detail::RecordLookups* lookups = nullptr;  ///< the list's lookups, shared by its reads
    detail::KvAnswers* kv_answers = nullptr;   ///< the list's KV answers, shared by its reads
    size_t list = 0;  ///< reads of a call passing the same chunk list have the same number
    AllocatedOutputs* allocate = nullptr;  ///< set: `outs` is empty and the pipeline makes them

    /// The views the read restores into.
    [[nodiscard]] std::span<const MutableTensorView> outputs() const {
      return allocate != nullptr ? std::span<const MutableTensorView>(allocate->views) : outs;
    }
  };
  /// A read's AllocatedOutputs, for the prefix its walk found (none when row_begin is past it).
  static void allocate_outputs(const Walk& w, const ReadItem& read);
  /// The read pipeline of every retrieve call (the tensor-returning ones allocate their outputs
  /// in it): read-through, one lock for every walk's
  /// index part, KV and fences outside it, every output checked against its walk (naming
  /// items[i] when `name_items`), restore_walks, one lock to apply every walk, counters once.
  /// `walks` and `rows`: one per read, filled here.
  void retrieve_reads(std::span<const ReadItem> reads, std::span<Walk> walks,
                      std::span<int64_t> rows, bool name_items);
  /// The restores of checked walks: host outputs now; device outputs grouped per (device,
  /// stream) (launch_groups.hpp), each group one launch after the union of its walks' fences,
  /// holding their pins until it has read the pool. Drops the walks' own pins.
  void restore_walks(std::span<Walk> walks, std::span<const ReadItem> reads,
                     std::span<int64_t> rows);
  /// Rows [row_begin, prefix end) of slot `slot` of a walk as gather segments.
  /// Fills `segments` (cleared first: callers reuse one buffer) with the walk's pool runs of
  /// `slot` from row_begin on.
  void plan_restore(const Walk& w, size_t slot, int64_t row_begin,
                    std::vector<kernels::GatherSegment>& segments) const;

  /// Store phases (hidden_state_store_write.cpp).
  struct Write;
  struct StorePlan;
  struct PlanContext;
  /// Arguments already validated: store_plans for one plan.
  StoreResult store_validated(std::span<const Chunk> chunks, const TensorView& hidden,
                              const StoreOptions& opt);
  /// The store pipeline of every store call (a single store is a batch of one): one lock for
  /// every plan's reservation (the allowlists; each plan its own eviction guard, in order),
  /// copy_plans outside it, one lock to publish, write-behind, counters once. `new_keys` bounds
  /// the keys the plans may insert; `granules` estimates the granules they take (a batch's: one
  /// GranuleStash for the call; 0 for none). Results: each plan's writes and cached count.
  void store_plans(std::span<StorePlan> plans, size_t new_keys, size_t granules = 0);
  /// Phase 2: host plans copied now; device plans grouped per (device, stream)
  /// (launch_groups.hpp): a group of one job is DevicePath::store (hidden_state_store_impl), a
  /// group of several one DevicePath::store_batch launch whose fence every plan of it carries.
  void copy_plans(std::span<StorePlan> plans);
  /// Grants `entry` its granules (blocks_for(payload_bytes()); the caller reserved them in
  /// `blocks`, so nothing allocates), evicting LRU keys not guarded
  /// by `guard` while the pool is short. False, nothing taken and counted as an allocation
  /// failure, when the pool cannot make room. From `stash` when given (a batch: the same
  /// outcome, fewer pool locks). Caller holds mutex_.
  bool grant_blocks(detail::Entry& entry, uint64_t guard,
                    detail::GranuleStash* stash = nullptr) noexcept;
  /// One entry of `key` made PENDING outside the store pipeline (the remote read-through, an
  /// import): room in the key's record or a new empty one, the granules (grant_blocks), then
  /// `replaces` (the slot's entry of another shape, or nullptr) removed and the entry added.
  /// False when the pool had no room (only evictions happened). std::bad_alloc before anything
  /// changed, or, rarely, after the grant (an eviction removed the key's record and inserting it
  /// again failed: the granules go back, only evictions happened). Caller holds mutex_.
  bool add_one_pending_locked(const CacheEngineKey& key, const detail::EntryRef& entry,
                              uint64_t guard, const detail::Entry* replaces);
  /// Host stores: merges segments that continue each other in the source and the pool.
  static void merge_host_runs(std::pmr::vector<kernels::WriteSegment>& segments,
                              int64_t cols) noexcept;
  /// The pool segments of the plan's granted writes (into plan.segments, reserved in phase 1)
  /// and the caller's tensor as the kernels see it.
  kernels::SourceView plan_segments(StorePlan& plan, const TensorView& hidden,
                                    const StoreOptions& opt);
  // Phase 1 of one plan, phase 3 and the withdrawal, with mutex_ held by the caller.
  // `context`: what the plans of one call share (the lookups of plan.chunks, the stash).
  void reserve_and_apply_locked(const TensorView& hidden, const StoreOptions& opt,
                                kernels::ElemType storage, StorePlan& plan, PlanContext& context);
  /// Its planning part: plan.writes (one per chunk to write, records found or inserted empty)
  /// and the room everything after it needs. May throw; then the caller drops the empty records.
  void plan_writes_locked(const TensorView& hidden, const StoreOptions& opt,
                          kernels::ElemType storage, StorePlan& plan, PlanContext& context,
                          uint64_t guard);
  /// Erases the records of plan.writes[from..] that have no slot (inserted empty by the plan,
  /// or emptied by a replacement, and not filled): a plan that throws or stops early.
  void drop_empty_records_locked(StorePlan& plan, detail::RecordLookups& lookups,
                                 size_t from) noexcept;
  void publish_locked(StorePlan& plan) noexcept;
  void withdraw_locked(StorePlan& plan) noexcept;
  /// The chunks a store with `token_offset` may write (those starting at or after it).
  [[nodiscard]] static size_t chunks_to_write(std::span<const Chunk> chunks, int64_t token_offset);
  /// The storage type of a store of `hidden` under this config.
  [[nodiscard]] kernels::ElemType storage_for(const TensorView& hidden) const;
  /// Evicts one LRU key for pool pressure, skipping keys guarded by store call `guard`. False
  /// when nothing can be evicted. Caller holds mutex_.
  bool evict_for_space(uint64_t guard) noexcept;

  void check_open_locked() const;
  /// How this store's host copies run (strategy and workers).
  [[nodiscard]] detail::HostCopyContext host_copy_context() const {
    return {&host_copy_, copy_workers_.get(),
            config_.tuning.copy_split_bytes
                ? static_cast<uint64_t>(*config_.tuning.copy_split_bytes)
                : host_copy_.info.min_bytes_per_copy_thread};
  }
  /// Outside the index lock, before eviction decisions: refresh fence flags, release finished
  /// restores' pins and granules whose copies landed (none of it waits).
  void reclaim_device_resources() noexcept;
  /// Pointer checks of the device path (device memory of device_index, or not device memory).
  void check_pointer(const void* data, Device device, int device_index, const char* what) const;
  /// hss::Error (nothing changed) when device work on `stream` would be captured into a graph.
  void check_stream(Device device, Stream stream) const;

  enum class InsertResult { kInserted, kPresent, kNoRoom };
  /// One fetched value as a READY entry, evicting LRU keys not guarded by `guard` for space.
  InsertResult insert_fetched(const Chunk& chunk, Slot slot, const detail::TierValue& value,
                              uint64_t guard);

  const Config config_;
  const TokenDatabase& token_database_;
  // Declared before the device path: members die in reverse order, so the pool outlives every
  // entry the device path may still hold, and the deferred releases (granules of dropped entries
  // whose copies were in flight) are returned after the device path drained and before the pool
  // goes.
  // Every entry's node (entry_pool.hpp): declared before the pool, so it outlives every entry.
  detail::EntryPool entries_;
  detail::BlockPool pool_;
  detail::DeferredRelease deferred_{pool_};
  // Host copies: the strategy chosen for this machine (calibrated on the empty pool, once per
  // process) and the workers that split large copies (none with hidden_state_copy_threads 1).
  const detail::HostCopy host_copy_;
  detail::CopyThreadsChoice copy_threads_;
  std::unique_ptr<detail::CopyWorkers> copy_workers_;
  std::unique_ptr<detail::DevicePath> device_path_;
  std::atomic<const StorageManager*> storage_manager_{nullptr};

  mutable std::mutex mutex_;  // guards index_, Entry::ready, closed_, next_guard_
  detail::StoreIndex index_;
  bool closed_ = false;
  uint64_t next_guard_ = 0;

  struct Counters {
    std::atomic<uint64_t> stores{0}, chunks_written{0}, retrieves{0}, hit_tokens{0}, miss_tokens{0},
        hs_evictions{0}, coupled_evictions{0}, allocation_failures{0}, copy_failures{0};
    std::array<std::atomic<uint64_t>, kNumActivationKinds> kind_chunks_written{};
  };
  mutable Counters counters_;
  // The MAC key of both remote paths (null: values carry no MAC). Before the leases: nothing
  // below may throw a ConfigError after it.
  const std::shared_ptr<const detail::ValueMac> mac_;
  // Leases of exports: destroyed before the pool, after the index.
  detail::LeaseTable leases_;
  struct TransferCounters {
    std::atomic<uint64_t> exports{0}, exported_entries{0}, exported_bytes{0}, reserved{0},
        imported{0}, imported_bytes{0}, rejected{0}, unauthenticated{0}, abandoned{0};
  };
  mutable TransferCounters transfer_counters_;
  // The backing tiers (store/backing_tiers.cpp makes them). Last: destroyed first, so the
  // entries their write-behind queues still hold go back to a live pool; constructed last, so a
  // ConfigError here (no hiredis) leaves nothing behind.
  mutable detail::TierChain tiers_;
};

// The store phases' plan, shared by the single and batch store paths.
struct HiddenStateStore::Impl::Write {
  size_t chunk = 0;
  detail::EntryRef entry;
  const detail::Entry* replaces = nullptr;  // an entry of the slot with another shape
  detail::KeyRecord* record = nullptr;      // where phase 1 put it (valid while plan.epoch holds)
};

struct HiddenStateStore::Impl::StorePlan {
  // A batch gives every item's vectors one arena (one allocation for the batch instead of two
  // per item); a single store uses the heap.
  explicit StorePlan(std::pmr::memory_resource* memory = std::pmr::new_delete_resource())
      : writes(memory), segments(memory) {}

  // The item: set by the caller of store_plans.
  std::span<const Chunk> chunks;
  const TensorView* hidden = nullptr;
  const StoreOptions* options = nullptr;
  detail::RecordLookups* lookups = nullptr;  // of `chunks` (shared by the plans of one list)
  size_t slot_hint = 1;  // slot vector capacity for a new key (plans sharing the list)

  bool allowed = false;            // the slot passed the allowlists (phase 1)
  std::pmr::vector<Write> writes;  // planned; after phase 1: the granted ones, in chunk order
  std::pmr::vector<kernels::WriteSegment> segments;
  detail::FenceRef fence;
  int64_t cached = 0;
  int64_t esize = 0;
  uint64_t epoch = 0;  // index_.erasures() after phase 1: Write::record is valid while it holds
};

// What the store phase 1 of the items of one call share under the index lock.
struct HiddenStateStore::Impl::PlanContext {
  detail::RecordLookups* lookups = nullptr;  // of the plan's chunk list
  size_t slot_hint = 1;  // slot vector capacity for a new key (items sharing the list)
  detail::GranuleStash* stash = nullptr;  // a batch's granules, one pool lock per refill
};

}  // namespace hss
