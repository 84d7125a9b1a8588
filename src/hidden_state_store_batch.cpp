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

#include <algorithm>
#include <map>
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

/// One key pass per distinct token list: items passing the same span share the chunks.
class ChunkCache {
 public:
  explicit ChunkCache(const TokenDatabase& db) : db_(db) {}
  const std::vector<Chunk>& chunks_of(size_t index, std::span<const int64_t> tokens) {
    const auto key = std::make_pair(tokens.data(), tokens.size());
    auto it = lists_.find(key);
    if (it == lists_.end()) {
      std::vector<Chunk> chunks;
      check_item(index, [&] { chunks = db_.process_tokens(tokens); });
      it = lists_.emplace(key, std::move(chunks)).first;
    }
    return it->second;
  }

 private:
  const TokenDatabase& db_;
  std::map<std::pair<const int64_t*, size_t>, std::vector<Chunk>> lists_;
};

}  // namespace

std::vector<StoreResult> HiddenStateStore::Impl::store_batch(std::span<const StoreItem> items) {
  HSS_RANGE("store_batch");
  // 1. Every check first (and the key pass, which validates token ids): nothing done yet.
  ChunkCache cache(token_database_);
  std::vector<const std::vector<Chunk>*> chunks(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const StoreItem& item = items[i];
    check_item(i, [&] {
      detail::check_store_arguments(static_cast<int64_t>(item.token_ids.size()), item.hidden_states,
                                    item.options, device_path_ != nullptr);
      check_pointer(item.hidden_states.data, item.hidden_states.device,
                    item.hidden_states.device_index, "hidden_states");
    });
    chunks[i] = &cache.chunks_of(i, item.token_ids);
  }

  // 2. One lock for every reservation.
  std::vector<StorePlan> plans(items.size());
  std::vector<bool> allowed(items.size());
  reclaim_device_resources();
  {
    HSS_RANGE("store/alloc");
    std::lock_guard lock(mutex_);
    check_open_locked();
    for (size_t i = 0; i < items.size(); ++i) {
      const StoreItem& item = items[i];
      allowed[i] = config_.slot_allowed(item.options.kind, item.options.layer_idx);
      if (!allowed[i]) continue;
      const ElemType storage = storage_for(item.hidden_states);
      plans[i].chunks = *chunks[i];
      plans[i].esize = static_cast<int64_t>(kernels::elem_bytes(storage));
      reserve_and_apply_locked(item.hidden_states, item.options, storage, plans[i]);
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
  // Write-behind to the remote tier, as the single store does (no-op without one).
  for (const StorePlan& plan : plans) {
    for (const Write& w : plan.writes)
      remote_.write_behind(plan.chunks[w.chunk].key, w.entry, pool_);
  }
  std::vector<StoreResult> results(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const auto written = static_cast<int64_t>(plans[i].writes.size());
    results[i] = {written, plans[i].cached};
    if (written == 0) continue;
    counters_.chunks_written.fetch_add(plans[i].writes.size(), std::memory_order_relaxed);
    counters_.kind_chunks_written[static_cast<size_t>(items[i].options.kind)].fetch_add(
        plans[i].writes.size(), std::memory_order_relaxed);
  }
  return results;
}

std::vector<int64_t> HiddenStateStore::Impl::retrieve_batch_into(
    std::span<const RetrieveItem> items) {
  HSS_RANGE("retrieve_batch");
  ChunkCache cache(token_database_);
  std::vector<const std::vector<Chunk>*> chunks(items.size());
  std::vector<Slot> slots(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const RetrieveItem& item = items[i];
    check_item(i, [&] {
      detail::check_retrieve_options(item.options);
      slots[i] = {item.options.kind, item.options.layer_idx};
      check_outputs(std::span<const Slot>(&slots[i], 1),
                    std::span<const MutableTensorView>(&item.out, 1));
    });
    chunks[i] = &cache.chunks_of(i, item.token_ids);
  }

  // The remote tier fills the pool where a walk would stop (no-op without one), before the lock.
  for (size_t i = 0; i < items.size(); ++i) {
    (void)read_through(*chunks[i], std::span<const Slot>(&slots[i], 1));
  }
  // One lock for every walk's index part; KV checks and fence waits outside it.
  std::vector<Walk> walks(items.size());
  {
    HSS_RANGE("retrieve/walk");
    std::lock_guard lock(mutex_);
    check_open_locked();
    for (size_t i = 0; i < items.size(); ++i) {
      walk_index_locked(walks[i], *chunks[i], std::span<const Slot>(&slots[i], 1));
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
  {
    std::lock_guard lock(mutex_);
    for (const Walk& w : walks) apply_walk_locked(w);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    count_walk(walks[i], static_cast<int64_t>(items[i].token_ids.size()));
  }
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
  std::vector<std::vector<kernels::GatherSegment>> segments(items.size());
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
    segments[i] = plan_restore(walks[i], 0, row_begin);
    const kernels::OutputView view{out.data, walks[i].cols(0), out.stride(),
                                   static_cast<kernels::ElemType>(static_cast<int>(out.dtype))};
    auto& group = group_for(groups, out.device_index, items[i].options.stream);
    group.jobs.push_back({segments[i], view});
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
