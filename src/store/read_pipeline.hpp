#pragma once
// The read pipeline of a store (HiddenStateStore::Impl): every retrieve call, single or batched,
// into the caller's buffers or into tensors it allocates, and coverage. Every read is one walk:
//   walk:     slot presence under the index lock (pinning what it finds), then KV presence per
//             chunk outside it (asked before the slot, as LMCache does), then fence waits;
//   checks:   the outputs against what the walk found;
//   restore:  host outputs now, device outputs one launch per (device, stream);
//   apply:    drop the orphan key, touch the prefix in reverse order; counters once a call.
// So a retrieve that fails its checks changes nothing, and coverage is the walk without apply.
// The backing tiers fill the pool first, where a walk would stop (TierReadThrough).
//
// Thread safety: the store's (docs/design.md, "What may run concurrently and what may block the
// host"); the index mutex only around index updates and lookups.

#include <cstdint>
#include <memory_resource>
#include <optional>
#include <span>
#include <vector>

#include "hss/hidden_state_store.hpp"
#include "store/pinned_walk.hpp"
#include "store/store_state.hpp"

namespace hss::detail {

class TierReadThrough;

class ReadPipeline {
 public:
  ReadPipeline(StoreState& store, TierReadThrough& tier_reads)
      : store_(store), tier_reads_(tier_reads) {}

  /// The outputs of a read whose caller wants them made (retrieve_hidden_states, retrieve_layers):
  /// float32 host tensors of the prefix's rows [row_begin, prefix end), one per slot, made after
  /// the walk (their size is the walk's answer) and before anything is restored.
  struct AllocatedOutputs {
    std::vector<HostTensor> tensors;
    /// Views of the tensors: inline for one slot (the common call makes no second allocation).
    std::span<const MutableTensorView> views;
    MutableTensorView one_view{};
    std::vector<MutableTensorView> many_views;
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
  /// The local prefix for `slots` (the walk of retrieve_layers, no wait, nothing changed).
  int64_t coverage(std::span<const Chunk> chunks, std::span<const Slot> slots) const;
  /// retrieve_hidden_states_into over many items (hidden_state_store_batch.cpp).
  std::vector<int64_t> retrieve_batch_into(std::span<const RetrieveItem> items);

  // ---- the walk, shared with the export side (StoreTransfer)
  /// What a prefix walk found, before anything changed: the pinned entries of the prefix
  /// ([chunk][slot] flattened), the chunk whose KV is gone (to drop), the prefix length.
  /// The read transaction (store/pinned_walk.hpp).
  using Walk = PinnedWalk;
  /// Walks the chunks: slot presence under the lock (StoreState::pin_prefix), KV presence
  /// outside it, fence waits (`pending`, pinned_walk.hpp). Pins what it returns; changes
  /// nothing. Throws hss::Error when the store is closed.
  using PendingCopies = detail::PendingCopies;
  Walk plan_walk(std::span<const Chunk> chunks, std::span<const Slot> slots,
                 PendingCopies pending = PendingCopies::kWaitOnHost) const;
  /// After a walk was applied (no lock held): the backing tiers may drop the orphan's values
  /// (its KV is gone; tiers/backing_tier.hpp, discard).
  void discard_orphan(const Walk& w) noexcept;
 private:
  /// plan_walk's second part, after the index part (StoreState::pin_prefix): KV and fences,
  /// no lock held.
  /// `kv_answers` (optional): the chunk list's KV answers, shared by the items of a batch.
  void walk_finish(Walk& w, PendingCopies pending, KvAnswers* kv_answers = nullptr) const;
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
    RecordLookups* lookups = nullptr;  ///< the list's lookups, shared by its reads
    KvAnswers* kv_answers = nullptr;   ///< the list's KV answers, shared by its reads
    size_t list = 0;  ///< reads of a call passing the same chunk list have the same number
    AllocatedOutputs* allocate = nullptr;  ///< set: `outs` is empty and the pipeline makes them

    /// The views the read restores into.
    [[nodiscard]] std::span<const MutableTensorView> outputs() const {
      return allocate != nullptr ? allocate->views : outs;
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
  /// `device_copies`: the output is device memory whose kernels can read the device-resident
  /// tier (its device, or a peer with access): the chunks with a device copy are read from it
  /// (in the same gather) and the others from the pool; otherwise every chunk reads the pool.
  /// Returns how many chunks it reads from device copies.
  uint64_t plan_restore(const Walk& w, size_t slot, int64_t row_begin,
                        std::vector<kernels::GatherSegment>& segments,
                        bool device_copies = false) const;
  /// True when a device output on `device` may read the device-resident tier's copies (there is
  /// a tier, and it is on `device` or `device` has peer access to it). No lock held.
  [[nodiscard]] bool reads_device_copies(int device) const;
  /// A scaled entry's part of plan_restore: rows [first_row, rows) as one segment per row and
  /// granule with the row's scale, output elements from dst_base (appended to `segments`).
  void plan_scaled_restore(const Entry& entry, int64_t first_row, int64_t dst_base,
                           std::vector<kernels::GatherSegment>& segments) const;


  StoreState& store_;
  TierReadThrough& tier_reads_;
};

}  // namespace hss::detail
