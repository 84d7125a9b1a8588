#pragma once
// The write pipeline of a store (HiddenStateStore::Impl): every store call, single or batched.
// A single store is a batch of one plan:
//   phase 1 (index lock): each plan's reservation (allowlists, records found or inserted empty,
//            granules granted with eviction for room, PENDING entries);
//   phase 2 (no lock):    the copies (host now; device one launch per (device, stream));
//   phase 3 (index lock): publish (READY), or withdraw on failure;
//   then write-behind to the backing tiers, and the counters once.
//
// Thread safety: the store's (docs/design.md, "What may run concurrently and what may block the
// host"); the index mutex only around phases 1 and 3, never around a copy.

#include <cstdint>
#include <memory_resource>
#include <span>
#include <vector>

#include "base/heap_resource.hpp"
#include "format/dtype_codes.hpp"
#include "hss/hidden_state_store.hpp"
#include "store/store_state.hpp"

namespace hss::detail {

class WritePipeline {
 public:
  explicit WritePipeline(StoreState& store) : store_(store) {}

  template <typename Token>
  StoreResult store_tokens(std::span<const Token> token_ids, const TensorView& hidden,
                           const StoreOptions& opt);
  StoreResult store_chunks(std::span<const Chunk> chunks, const TensorView& hidden,
                           const StoreOptions& opt);
  /// store_hidden_states over many items (hidden_state_store_batch.cpp).
  std::vector<StoreResult> store_batch(std::span<const StoreItem> items);

 private:
  /// Store phases (hidden_state_store_write.cpp).
  struct Write;
  struct DeviceCopies;
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
  void copy_plans(std::span<StorePlan> plans, DeviceCopies& device_copies);
  /// Host stores: merges segments that continue each other in the source and the pool.
  static void merge_host_runs(std::pmr::vector<kernels::WriteSegment>& segments,
                              int64_t cols) noexcept;
  /// The pool segments of the plan's granted writes (into plan.segments, reserved in phase 1)
  /// and the caller's tensor as the kernels see it.
  kernels::SourceView plan_segments(StorePlan& plan, const TensorView& hidden,
                                    const StoreOptions& opt);
  /// The segments of one entry (the host entry, or its device copy) appended to `segments`.
  void append_entry_segments(const Entry& entry, int64_t src_row0, int64_t cols, int64_t esize,
                             std::pmr::vector<kernels::WriteSegment>& segments) const;
  /// The device-resident tier's write-through (after the host copies of the group were
  /// enqueued): one launch of the batch store kernel on the caller's stream writes the plans'
  /// device copies; their fence goes on each copy. A failure loses the device copies only (the
  /// host entries stand), counted in the tier's errors.
  void write_device_copies(std::span<StorePlan> plans, std::span<const size_t> items,
                           int device_index, Stream stream, DeviceCopies& device_copies) noexcept;
  /// The segments of a scaled entry (8-bit storage): one per row and granule, each with its
  /// row's scale address (appended to `segments`, reserved in phase 1).
  void plan_scaled_segments(const Entry& entry, int64_t src_row0,
                            std::pmr::vector<kernels::WriteSegment>& segments) const;
  // Phase 1 of one plan, phase 3 and the withdrawal, with mutex held by the caller.
  // `context`: what the plans of one call share (the lookups of plan.chunks, the stash).
  void reserve_and_apply(const IndexLock& lock, const TensorView& hidden, const StoreOptions& opt,
                         kernels::ElemType storage, StorePlan& plan, PlanContext& context);
  /// Its planning part: plan.writes (one per chunk to write, records found or inserted empty)
  /// and the room everything after it needs. May throw; then the caller drops the empty records.
  void plan_writes(const IndexLock& lock, const TensorView& hidden, const StoreOptions& opt,
                   kernels::ElemType storage, StorePlan& plan, PlanContext& context,
                   uint64_t guard);
  /// Erases the records of plan.writes[from..] that have no slot (inserted empty by the plan,
  /// or emptied by a replacement, and not filled): a plan that throws or stops early.
  void drop_empty_records(const IndexLock& lock, StorePlan& plan, RecordLookups& lookups,
                          size_t from) noexcept;
  void commit_plan(const IndexLock& lock, StorePlan& plan,
                   const DeviceCopies& device_copies) noexcept;
  void abort_plan(const IndexLock& lock, StorePlan& plan) noexcept;
  /// The chunks a store with `token_offset` may write (those starting at or after it).
  [[nodiscard]] static size_t chunks_to_write(std::span<const Chunk> chunks, int64_t token_offset);
  /// The storage type of a store of `hidden` under this config.
  [[nodiscard]] kernels::ElemType storage_for(const TensorView& hidden) const;

  StoreState& store_;
};

// The store phases' plan, shared by the single and batch store paths.
// 40 bytes: the device copy is an index into the call's DeviceCopies, so a batch's writes (and
// its arena) are no larger for the device-resident tier when the tier is off.
struct WritePipeline::Write {
  static constexpr uint32_t kNoDevice = UINT32_MAX;
  uint32_t chunk = 0;  // of plan.chunks (a list of 2^32 chunks cannot be held)
  uint32_t device = kNoDevice;  // its device copy in the call's DeviceCopies, granted in phase 1
  EntryRef entry;
  const Entry* replaces = nullptr;  // an entry of the slot with another shape
  KeyRecord* record = nullptr;      // where phase 1 put it (valid while plan.epoch holds)
};

// The device copies of one store call's writes (the device-resident tier's write-through),
// Write::device indexes it; null where the copy was not granted. Empty without the tier.
struct WritePipeline::DeviceCopies {
  std::vector<EntryRef> copies;
  [[nodiscard]] Entry* of(const Write& w) const {
    return w.device == Write::kNoDevice ? nullptr : copies[w.device].get();
  }
};

struct WritePipeline::StorePlan {
  // A batch gives every item's vectors one arena (one allocation for the batch instead of two
  // per item); a single store uses the heap.
  explicit StorePlan(std::pmr::memory_resource* memory = heap_resource())
      : writes(memory), segments(memory) {}

  // The item: set by the caller of store_plans.
  std::span<const Chunk> chunks;
  const TensorView* hidden = nullptr;
  const StoreOptions* options = nullptr;
  RecordLookups* lookups = nullptr;  // of `chunks` (shared by the plans of one list)
  size_t slot_hint = 1;  // slot vector capacity for a new key (plans sharing the list)

  bool allowed = false;            // the slot passed the allowlists (phase 1)
  std::pmr::vector<Write> writes;  // planned; after phase 1: the granted ones, in chunk order
  std::pmr::vector<kernels::WriteSegment> segments;
  FenceRef fence;
  int64_t cached = 0;
  int64_t esize = 0;
  uint64_t epoch = 0;  // index_.erasures() after phase 1: Write::record is valid while it holds
};

// What the store phase 1 of the items of one call share under the index lock.
struct WritePipeline::PlanContext {
  RecordLookups* lookups = nullptr;  // of the plan's chunk list
  size_t slot_hint = 1;  // slot vector capacity for a new key (items sharing the list)
  GranuleStash* stash = nullptr;  // a batch's granules, one pool lock per refill
  DeviceCopies* device_copies = nullptr;  // the call's device copies
};

// Inline: every store item asks it (a call each cost a batch item more than the switch).
inline kernels::ElemType WritePipeline::storage_for(const TensorView& hidden) const {
  switch (store_.config.hidden_state_storage_dtype) {
    case StorageDType::kFloat32:
      return kernels::ElemType::kFloat32;
    case StorageDType::kNative:
      return hidden.dtype != DType::kFloat32 ? to_elem_type(hidden.dtype)
                                             : kernels::ElemType::kFloat32;
    case StorageDType::kFp8E4M3:
      return kernels::ElemType::kFp8E4M3;
    case StorageDType::kFp8E5M2:
      return kernels::ElemType::kFp8E5M2;
  }
  return kernels::ElemType::kFloat32;  // a Config is validated before a store uses it
}

}  // namespace hss::detail
