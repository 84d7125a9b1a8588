// Batch calls: an engine step (requests x layers) as one call instead of hundreds.
//
// store_batch:          check every item (a bad one: InvalidArgument "items[i]: ...", nothing
//                       done) -> one key pass per distinct token list -> one index lock for every
//                       item's reservation (each item its own eviction guard, in item order) ->
//                       copies outside the lock -> one index lock to publish every item.
// retrieve_batch_into:  check every item -> one key pass per distinct token list -> one index
//                       lock for every item's walk -> KV checks and fences outside it -> every
//                       output checked against its walk before anything is written -> restores ->
//                       one index lock to apply every walk (touches, orphan drops) in item order.
// Results equal the single calls made in item order (a store batch larger than the free pool
// may evict differently: items of the batch are not evicted by later items of the same batch).
//
// What the items share beyond the lock: the chunks of a token list and one index lookup per
// chunk of it (detail::RecordLookups, valid until a key is erased), one map reserve and one
// prepared-key map for the batch, one arena for every plan's writes and segments, one touch per
// key and list on the read side, counters added once. What they cannot share (an entry and its
// granules per chunk and slot, the slot scan, the copy, the pins) is most of an item's cost:
// docs/perf.md, "Batch calls".
// Out of memory while planning item i: the items before it withdraw their pending entries (none
// stays unpublished), but their evictions and touches stand, so the batch as a whole has the
// basic guarantee where a single store has the strong one.

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory_resource>
#include <string>
#include <utility>

#include "hidden_state_store_impl.hpp"
#include "hss/error.hpp"
#include "nvtx.hpp"
#include "store_validation.hpp"

namespace hss {

using kernels::ElemType;

namespace {

/// Runs `check`, prefixing an InvalidArgument with the item's index.
template <typename Fn>
void check_item(size_t index, Fn&& check) {
  try {
    check();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("items[" + std::to_string(index) + "]: " + e.what());
  }
}

/// One key pass per distinct token list: items passing the same span share the chunks, and the
/// index lookups of those chunks (one RecordLookups per list). Spans are found in an open-
/// addressing table sized once for the batch (no node per list).
class ChunkCache {
 public:
  struct SpanKey {
    const int64_t* data = nullptr;
    size_t size = 0;
    bool operator==(const SpanKey&) const = default;
  };
  struct List {
    SpanKey span;
    std::vector<Chunk> chunks;
    detail::RecordLookups lookups;
    size_t items = 0;  // items of the batch passing this list
  };

  ChunkCache(const TokenDatabase& db, size_t items) : db_(db) {
    lists_.reserve(items);
    size_t buckets = 16;
    while (buckets < 2 * items) buckets *= 2;
    table_.assign(buckets, kEmpty);
  }
  /// The list of item `index`'s tokens: its position in lists().
  size_t list_of(size_t index, std::span<const int64_t> tokens) {
    const SpanKey key{tokens.data(), tokens.size()};
    if (last_ < lists_.size() && lists_[last_].span == key) return found(last_);
    const size_t mask = table_.size() - 1;
    size_t bucket = hash(key) & mask;
    for (; table_[bucket] != kEmpty; bucket = (bucket + 1) & mask) {
      if (lists_[table_[bucket]].span == key) return found(table_[bucket]);
    }
    List list;
    list.span = key;
    check_item(index, [&] { list.chunks = db_.process_tokens(tokens); });
    list.lookups = detail::RecordLookups(list.chunks.size());
    lists_.push_back(std::move(list));  // capacity reserved: no reallocation, spans stay valid
    table_[bucket] = lists_.size() - 1;
    return found(lists_.size() - 1);
  }
  [[nodiscard]] std::vector<List>& lists() { return lists_; }

 private:
  static constexpr size_t kEmpty = SIZE_MAX;
  static size_t hash(const SpanKey& k) noexcept {
    const auto bits = reinterpret_cast<uintptr_t>(k.data) ^ (k.size * 0x9e3779b97f4a7c15ULL);
    return static_cast<size_t>((bits * 0xff51afd7ed558ccdULL) >> 17);
  }
  size_t found(size_t list) {
    ++lists_[list].items;
    return last_ = list;
  }

  const TokenDatabase& db_;
  std::vector<List> lists_;
  std::vector<size_t> table_;  // list index per bucket, kEmpty when free
  size_t last_ = SIZE_MAX;
};

}  // namespace

std::vector<StoreResult> HiddenStateStore::Impl::store_batch(std::span<const StoreItem> items) {
  HSS_RANGE("store_batch");
  // 1. Every check first (and the key pass, which validates token ids): nothing done yet.
  ChunkCache cache(token_database_, items.size());
  std::vector<size_t> list_of(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const StoreItem& item = items[i];
    check_item(i, [&] {
      detail::check_store_arguments(static_cast<int64_t>(item.token_ids.size()), item.hidden_states,
                                    item.options, device_path_ != nullptr);
      check_pointer(item.hidden_states.data, item.hidden_states.device,
                    item.hidden_states.device_index, "hidden_states");
      check_stream(item.hidden_states.device, item.options.stream);
    });
    list_of[i] = cache.list_of(i, item.token_ids);
  }
  auto& lists = cache.lists();
  // At most one new key per chunk of each distinct list: the map and the prepared keys are
  // sized once for the whole batch, so no item rehashes or grows them.
  size_t distinct_chunks = 0;
  for (const auto& list : lists) distinct_chunks += list.chunks.size();

  // 2. One lock for every reservation. Each item plans and applies in item order (its own
  //    eviction guard), sharing the chunk lookups of its list with the items before it.
  // Every item's writes and segments from one arena sized for the batch (a chunk needs at most
  // one write and, with granules of a chunk or more, one segment; more only grows the arena).
  size_t item_chunks = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    item_chunks += chunks_to_write(lists[list_of[i]].chunks, items[i].options.token_offset);
  }
  // Upstream: the heap, never the process-wide default resource an application may have set.
  std::pmr::monotonic_buffer_resource arena(
      item_chunks * (sizeof(Write) + sizeof(kernels::WriteSegment)) + 64 * sizeof(Write),
      std::pmr::new_delete_resource());
  std::vector<StorePlan> plans;
  plans.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) plans.emplace_back(&arena);
  std::vector<bool> allowed(items.size());
  PlanContext context;
  context.prepared.reserve(distinct_chunks);
  reclaim_device_resources();
  expire_leases();
  {
    HSS_RANGE("store/alloc");
    std::lock_guard lock(mutex_);
    check_open_locked();
    index_.reserve_keys(distinct_chunks);
    context.keys_reserved = true;
    size_t i = 0;
    try {
      for (; i < items.size(); ++i) {
        const StoreItem& item = items[i];
        allowed[i] = config_.slot_allowed(item.options.kind, item.options.layer_idx);
        if (!allowed[i]) continue;
        auto& list = lists[list_of[i]];
        const ElemType storage = storage_for(item.hidden_states);
        plans[i].chunks = list.chunks;
        plans[i].esize = static_cast<int64_t>(kernels::elem_bytes(storage));
        context.lookups = &list.lookups;
        context.slot_hint = std::min<size_t>(list.items, 64);
        reserve_and_apply_locked(item.hidden_states, item.options, storage, plans[i], context);
      }
    } catch (...) {
      // Out of memory planning item i (nothing of it applied): the items before it withdraw
      // their pending entries, so none stays unpublished. Their evictions stand.
      for (size_t j = 0; j < i; ++j) withdraw_locked(plans[j]);
      throw;
    }
  }
  counters_.stores.fetch_add(items.size(), std::memory_order_relaxed);

  // 3. Copies outside the lock. A failure withdraws every item's reservations: the batch is
  //    all or nothing (copies already enqueued land in granules freed once their fence lands).
  try {
    copy_batch_rows(plans, items);
  } catch (...) {
    std::lock_guard lock(mutex_);
    for (StorePlan& plan : plans) {
      // Groups enqueued before the failure may still be writing these granules: the entries
      // carry their fence, so withdrawing defers the granules' return until it landed.
      if (plan.fence) {
        for (const Write& w : plan.writes) {
          w.entry->fence = plan.fence;
          w.entry->deferred = &deferred_;
        }
      }
      withdraw_locked(plan);
    }
    throw;
  }

  // 4. One lock to publish.
  {
    std::lock_guard lock(mutex_);
    for (StorePlan& plan : plans) publish_locked(plan);
  }
  // Write-behind to the remote tier, as the single store does (nothing to do without one).
  if (remote_.enabled()) {
    for (const StorePlan& plan : plans) {
      for (const Write& w : plan.writes)
        remote_.write_behind(plan.chunks[w.chunk].key, w.entry, pool_);
    }
  }
  std::vector<StoreResult> results(items.size());
  std::array<uint64_t, kNumActivationKinds> kind_written{};
  for (size_t i = 0; i < items.size(); ++i) {
    const auto written = static_cast<int64_t>(plans[i].writes.size());
    results[i] = {written, plans[i].cached};
    kind_written[static_cast<size_t>(items[i].options.kind)] += plans[i].writes.size();
  }
  // The single calls' counts, added once per counter.
  uint64_t written = 0;
  for (size_t k = 0; k < kNumActivationKinds; ++k) {
    written += kind_written[k];
    if (kind_written[k] != 0) {
      counters_.kind_chunks_written[k].fetch_add(kind_written[k], std::memory_order_relaxed);
    }
  }
  counters_.chunks_written.fetch_add(written, std::memory_order_relaxed);
  return results;
}

std::vector<int64_t> HiddenStateStore::Impl::retrieve_batch_into(
    std::span<const RetrieveItem> items) {
  HSS_RANGE("retrieve_batch");
  ChunkCache cache(token_database_, items.size());
  std::vector<size_t> list_of(items.size());
  std::vector<Slot> slots(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const RetrieveItem& item = items[i];
    check_item(i, [&] {
      detail::check_retrieve_options(item.options);
      slots[i] = {item.options.kind, item.options.layer_idx};
      check_outputs(std::span<const Slot>(&slots[i], 1),
                    std::span<const MutableTensorView>(&item.out, 1), item.options.stream);
    });
    list_of[i] = cache.list_of(i, item.token_ids);
  }
  auto& lists = cache.lists();
  auto chunks_of = [&](size_t i) -> std::span<const Chunk> { return lists[list_of[i]].chunks; };

  // The remote tier fills the pool where a walk would stop (no-op without one), before the lock.
  for (size_t i = 0; i < items.size(); ++i) {
    (void)read_through(chunks_of(i), std::span<const Slot>(&slots[i], 1));
  }
  // One lock for every walk's index part (one lookup per chunk of each distinct token list);
  // KV checks and fence waits outside it.
  std::vector<Walk> walks(items.size());
  {
    HSS_RANGE("retrieve/walk");
    std::lock_guard lock(mutex_);
    check_open_locked();
    for (size_t i = 0; i < items.size(); ++i) {
      walk_index_locked(walks[i], chunks_of(i), std::span<const Slot>(&slots[i], 1),
                        &lists[list_of[i]].lookups);
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    walk_finish(walks[i], /*wait_for_copies=*/items[i].out.device != Device::kCuda);
  }
  // Every output against its walk before anything is written.
  for (size_t i = 0; i < items.size(); ++i) {
    check_walk_outputs(walks[i], std::span<const MutableTensorView>(&items[i].out, 1),
                       items[i].options.row_begin, i);
  }
  std::vector<int64_t> rows(items.size());
  restore_batch_walks(walks, items, rows);
  // One touch per key and list: the LRU order after a run of touches depends only on each
  // key's last touch, so an item skips the chunks a later item of its list touches again (a
  // key erased in between is gone either way).
  std::vector<int64_t> touch_from(items.size());
  {
    std::vector<int64_t> later_hits(lists.size(), 0);
    for (size_t i = items.size(); i-- > 0;) {
      int64_t& later = later_hits[list_of[i]];
      touch_from[i] = std::min(later, walks[i].hits);
      later = std::max(later, walks[i].hits);
    }
  }
  {
    // The lookups of the walks stay valid unless a key was erased meanwhile (they look again).
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < items.size(); ++i) {
      apply_walk_locked(walks[i], &lists[list_of[i]].lookups, touch_from[i]);
    }
  }
  uint64_t hit_tokens = 0, miss_tokens = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto prefix = static_cast<uint64_t>(walks[i].prefix_tokens);
    hit_tokens += prefix;
    miss_tokens += items[i].token_ids.size() - prefix;
  }
  // The counts of the single calls, added once.
  counters_.retrieves.fetch_add(items.size(), std::memory_order_relaxed);
  counters_.hit_tokens.fetch_add(hit_tokens, std::memory_order_relaxed);
  counters_.miss_tokens.fetch_add(miss_tokens, std::memory_order_relaxed);
  return rows;
}

namespace {

/// Device items of a batch that share a (device, stream): one launch for all of them.
template <typename Job>
struct LaunchGroup {
  int device_index = 0;
  Stream stream = nullptr;
  std::vector<Job> jobs;
  std::vector<size_t> items;
};

template <typename Job>
LaunchGroup<Job>& group_for(std::vector<LaunchGroup<Job>>& groups, int device_index,
                            Stream stream) {
  for (auto& group : groups) {  // an engine uses a handful of streams: a linear search
    if (group.device_index == device_index && group.stream == stream) return group;
  }
  groups.push_back({device_index, stream, {}, {}});
  return groups.back();
}

}  // namespace

void HiddenStateStore::Impl::copy_batch_rows(std::span<StorePlan> plans,
                                             std::span<const StoreItem> items) {
  std::vector<LaunchGroup<detail::StoreJob>> groups;
  for (size_t i = 0; i < items.size(); ++i) {
    if (plans[i].writes.empty()) continue;
    const TensorView& hidden = items[i].hidden_states;
    if (hidden.device != Device::kCuda) {
      copy_rows(plans[i], hidden, items[i].options);
      continue;
    }
    const kernels::SourceView source = plan_segments(plans[i], hidden, items[i].options);
    auto& group = group_for(groups, hidden.device_index, items[i].options.stream);
    group.jobs.push_back({source, plans[i].segments});
    group.items.push_back(i);
  }
  for (auto& group : groups) {
    const detail::FenceRef fence =
        device_path_->store_batch(group.jobs, group.device_index, group.stream);
    for (const size_t i : group.items) plans[i].fence = fence;
  }
}

void HiddenStateStore::Impl::restore_batch_walks(std::span<Walk> walks,
                                                 std::span<const RetrieveItem> items,
                                                 std::span<int64_t> rows) {
  std::vector<LaunchGroup<detail::RestoreJob>> groups;
  // Device items' segments (jobs hold spans of them: their buffers do not move with the list).
  std::vector<std::vector<kernels::GatherSegment>> segments;
  for (size_t i = 0; i < items.size(); ++i) {
    const MutableTensorView& out = items[i].out;
    if (out.device != Device::kCuda) {
      rows[i] = restore_walk_into(walks[i], std::span<const MutableTensorView>(&out, 1),
                                  items[i].options.row_begin, items[i].options.stream);
      continue;
    }
    const int64_t row_begin = items[i].options.row_begin;
    if (row_begin >= walks[i].prefix_tokens) continue;  // nothing to restore: rows[i] stays 0
    rows[i] = walks[i].prefix_tokens - row_begin;
    segments.push_back(plan_restore(walks[i], 0, row_begin));
    const kernels::OutputView view{out.data, walks[i].cols(0), out.stride(),
                                   static_cast<kernels::ElemType>(static_cast<int>(out.dtype))};
    auto& group = group_for(groups, out.device_index, items[i].options.stream);
    group.jobs.push_back({segments.back(), view});
    group.items.push_back(i);
  }
  for (auto& group : groups) {
    // The union of the group's fences (distinct per walk already) and of its walks' pins.
    std::vector<detail::FenceRef> fences;
    auto pins = std::make_shared<std::vector<detail::EntryRef>>();
    for (const size_t i : group.items) {
      fences.insert(fences.end(), walks[i].fences.begin(), walks[i].fences.end());
      pins->insert(pins->end(), walks[i].pinned.begin(), walks[i].pinned.end());
    }
    std::sort(fences.begin(), fences.end());
    fences.erase(std::unique(fences.begin(), fences.end()), fences.end());
    device_path_->restore_batch(group.jobs, group.device_index, group.stream, fences,
                                std::move(pins));
  }
  for (Walk& w : walks) w.pinned.clear();  // device restores hold their own pins
}

}  // namespace hss
