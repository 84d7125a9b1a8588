// The store path. Three phases, so that a failure anywhere leaves the store as it was:
//   1. under the index lock: plan which chunks need writing, allocate everything the plan needs
//      (entries, map nodes, slot vectors) while nothing is changed yet, then apply it with
//      operations that cannot throw (touches, evictions, granule grants, inserts as PENDING);
//   2. no lock: copy the rows into the granted granules (host) or enqueue the copies (device);
//   3. under the lock: publish the entries as READY.
// A failed phase 2 withdraws this call's PENDING entries. A single store is a batch of one
// (store_plans); hidden_state_store_batch.cpp adds what several items share.

#include <algorithm>
#include <array>
#include <optional>
#include <string>

#include "base/log.hpp"
#include "base/nvtx.hpp"
#include "datapath/launch_groups.hpp"
#include "format/dtype_codes.hpp"
#include "hss/detail/checked.hpp"
#include "hss/error.hpp"
#include "store/scaled_rows.hpp"
#include "store/write_pipeline.hpp"

#include "store/store_validation.hpp"

namespace hss::detail {

using kernels::ElemType;

template <typename Token>
StoreResult WritePipeline::store_tokens(std::span<const Token> token_ids,
                                                 const TensorView& hidden,
                                                 const StoreOptions& opt) {
  HSS_RANGE("store");
  detail::check_store_arguments(static_cast<int64_t>(token_ids.size()), hidden, opt,
                                store_.device_path != nullptr);
  store_.check_pointer(hidden.data, hidden.device, hidden.device_index, "hidden_states");
  store_.check_stream(hidden.device, opt.stream);
  std::vector<Chunk> chunks;
  {
    HSS_RANGE("store/keys");
    chunks = store_.token_database.process_tokens(token_ids);  // validates the token ids
  }
  return store_validated(chunks, hidden, opt);
}

StoreResult WritePipeline::store_chunks(std::span<const Chunk> chunks,
                                                 const TensorView& hidden,
                                                 const StoreOptions& opt) {
  HSS_RANGE("store");
  store_.check_chunks(chunks);
  detail::check_store_arguments(chunks.empty() ? 0 : chunks.back().end, hidden, opt,
                                store_.device_path != nullptr);
  store_.check_pointer(hidden.data, hidden.device, hidden.device_index, "hidden_states");
  store_.check_stream(hidden.device, opt.stream);
  return store_validated(chunks, hidden, opt);
}

StoreResult WritePipeline::store_validated(std::span<const Chunk> chunks,
                                                    const TensorView& hidden,
                                                    const StoreOptions& opt) {
  // A batch of one: the batch's phases without what only several items need (the key cache,
  // the arena, the map reserve for the whole batch).
  detail::RecordLookups lookups(chunks.size());
  StorePlan plan;
  plan.chunks = chunks;
  plan.hidden = &hidden;
  plan.options = &opt;
  plan.lookups = &lookups;
  store_plans(std::span<StorePlan>(&plan, 1), chunks.size());
  return {static_cast<int64_t>(plan.writes.size()), plan.cached};
}

void WritePipeline::store_plans(std::span<StorePlan> plans, size_t new_keys,
                                         size_t granules) {
  // 1. One lock for every reservation. Each plan plans and applies in order (its own eviction
  //    guard), sharing the chunk lookups of its list with the plans before it.
  // Finished device restores let go of their pins and landed copies of dropped entries give
  // their granules back before this call decides what to evict; so do ended leases.
  store_.reclaim_device_resources();
  store_.expire_leases();
  const bool several = plans.size() > 1;
  // Declared before the locked sections: the copies not attached at commit die with the call
  // (their granules after their fence).
  DeviceCopies device_copies;
  {
    HSS_RANGE("store/alloc");
    const auto lock = store_.lock_index();
    store_.check_open(lock);
    PlanContext context;
    context.device_copies = &device_copies;
    std::optional<detail::GranuleStash> stash;  // gives its ids back before the lock ends
    // At most one new key per chunk of each distinct list: the map is sized once for a batch,
    // so no item rehashes it (a single store's insert rehashes when it must).
    if (several) store_.reserve_keys(lock, new_keys);
    if (granules > 0) {
      // The batch's granules from the pool in one lock (GranuleStash: the same grants, fewer
      // pool locks; an estimate too large only holds ids until the locked section ends).
      context.stash = &store_.new_stash(lock, stash, granules);
    }
    size_t i = 0;
    try {
      for (; i < plans.size(); ++i) {
        StorePlan& plan = plans[i];
        const StoreOptions& opt = *plan.options;
        plan.allowed = store_.config.slot_allowed(opt.kind, opt.layer_idx);
        if (!plan.allowed) continue;  // counted as a store that wrote nothing, as LMCache does
        const ElemType storage = storage_for(*plan.hidden);
        plan.esize = static_cast<int64_t>(kernels::elem_bytes(storage));
        context.lookups = plan.lookups;
        context.slot_hint = plan.slot_hint;
        reserve_and_apply(lock, *plan.hidden, opt, storage, plan, context);
      }
    } catch (...) {
      // Out of memory planning plan i (nothing of it applied): the plans before it withdraw
      // their pending entries, so none stays unpublished. Their evictions and touches stand.
      for (size_t j = 0; j < i; ++j) abort_plan(lock, plans[j]);
      throw;
    }
  }
  store_.counters.stores.fetch_add(plans.size(), std::memory_order_relaxed);

  // 2. Copies outside the lock. A failure withdraws every plan's reservations: the call is all
  //    or nothing (copies already enqueued land in granules freed once their fence lands).
  try {
    copy_plans(plans, device_copies);
  } catch (...) {
    const auto lock = store_.lock_index();
    for (StorePlan& plan : plans) {
      // Groups enqueued before the failure may still be writing these granules: the entries
      // carry their fence, so withdrawing defers the granules' return until it landed.
      if (plan.fence) {
        for (const Write& w : plan.writes) store_.set_fence(*w.entry, plan.fence);
      }
      abort_plan(lock, plan);
    }
    throw;
  }

  // 3. One lock to publish.
  {
    const auto lock = store_.lock_index();
    for (StorePlan& plan : plans) commit_plan(lock, plan, device_copies);
  }
  // Write-behind: the backing tiers borrow each written entry (its fence included) and never
  // make this call wait for their I/O.
  if (!store_.tiers.empty()) {
    for (const StorePlan& plan : plans) {
      for (const Write& w : plan.writes)
        store_.tiers.write_behind(plan.chunks[w.chunk].key, w.entry, store_.pool());
    }
  }
  // Counters added once per counter.
  std::array<uint64_t, kNumActivationKinds> kind_written{};
  uint64_t written = 0;
  for (const StorePlan& plan : plans) {
    kind_written[static_cast<size_t>(plan.options->kind)] += plan.writes.size();
    written += plan.writes.size();
  }
  for (size_t k = 0; k < kNumActivationKinds; ++k) {
    if (kind_written[k] != 0) {
      store_.counters.kind_chunks_written[k].fetch_add(kind_written[k], std::memory_order_relaxed);
    }
  }
  if (written != 0) store_.counters.chunks_written.fetch_add(written, std::memory_order_relaxed);
}

void WritePipeline::plan_writes(const IndexLock& lock, const TensorView& hidden,
                                const StoreOptions& opt, ElemType storage, StorePlan& plan,
                                PlanContext& context, uint64_t guard) {
  // Which chunks need writing, and everything their writes need. Allocation is fine here:
  // nothing visible changes (a new key's record goes into the map empty and outside the LRU).
  const std::span<const Chunk> chunks = plan.chunks;
  const Slot slot{opt.kind, opt.layer_idx};
  auto& writes = plan.writes;
  detail::RecordLookups& lookups = *context.lookups;
  size_t max_segments = 0;
  const bool device_copies = store_.keeps_device_copies(hidden.device, hidden.device_index);
  writes.reserve(chunks_to_write(chunks, opt.token_offset));
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& chunk = chunks[i];
    detail::KeyRecord* record = store_.find_record(lock, chunk.key, &lookups, i);
    // Every key of the caller's token list is off limits to this call's evictions, the chunks
    // before token_offset included: they are the prefix this call extends.
    if (record) record->guard = guard;
    if (chunk.start < opt.token_offset) continue;  // chunks stay atomic with KV boundaries
    // A list naming a key twice writes it once, at its first chunk (as sequential stores would:
    // the second finds the key stored); the apply counts the second as cached.
    if (record != nullptr && record->planned == guard) continue;
    const EntryRef* held = record ? record->find(slot) : nullptr;
    // Held with this chunk's shape: cached. Another shape (hidden dim, storage dtype, or a row
    // count a caller's chunk list gives the key anew, which no walk would serve) is replaced.
    if (held && (*held)->rows == chunk.size() && (*held)->cols == hidden.cols &&
        (*held)->format == detail::RowFormat::of(storage)) {
      continue;
    }
    const detail::Entry* replaces = held ? held->get() : nullptr;  // before slots may move
    const detail::RowFormat format = detail::RowFormat::of(storage);
    const std::optional<uint64_t> bytes = format.checked_payload_bytes(chunk.size(), hidden.cols);
    if (!bytes) {
      throw InvalidArgument("a chunk of " + std::to_string(chunk.size()) + " rows x " +
                            std::to_string(hidden.cols) + " columns overflows its byte count");
    }
    const size_t need = store_.pool().blocks_for(*bytes);
    auto entry = store_.new_entry(chunk.size(), hidden.cols, format, slot, need);
    // A scaled entry's segments stop at every row end (one scale each).
    const size_t entry_segments =
        need +
        (format.scales == detail::ScaleLayout::kNone ? 0 : static_cast<size_t>(chunk.size()));
    max_segments += entry_segments;
    uint32_t device = Write::kNoDevice;
    if (device_copies) {
      context.device_copies->copies.push_back(
          store_.new_device_copy(chunk.size(), hidden.cols, format, slot));
      device = static_cast<uint32_t>(context.device_copies->copies.size() - 1);
    }
    // Step 1 of the write transaction (store_state.hpp): the record, found or made empty.
    if (record == nullptr) {
      record = &store_.open_record(lock, chunk.key, nullptr, guard, context.slot_hint);
      lookups.remember(store_.index(lock), i, *record);
    } else {
      (void)store_.open_record(lock, chunk.key, record, guard, context.slot_hint);
    }
    record->planned = guard;
    writes.push_back(
        {static_cast<uint32_t>(i), device, std::move(entry), replaces, nullptr});  // no throw
  }
  plan.segments.reserve(max_segments);
}

void WritePipeline::reserve_and_apply(const IndexLock& lock, const TensorView& hidden,
                                      const StoreOptions& opt, ElemType storage, StorePlan& plan,
                                      PlanContext& context) {
  const std::span<const Chunk> chunks = plan.chunks;
  auto& writes = plan.writes;
  detail::RecordLookups& lookups = *context.lookups;
  const uint64_t guard = store_.new_guard(lock);
  try {
    plan_writes(lock, hidden, opt, storage, plan, context, guard);
  } catch (...) {
    drop_empty_records(lock, plan, lookups, 0);  // the new keys' records go again
    throw;
  }

  // Apply: nothing below throws.
  size_t granted = 0;
  size_t next_write = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& chunk = chunks[i];
    if (chunk.start < opt.token_offset) continue;
    if (next_write < writes.size() && writes[next_write].chunk == i) {
      Write& w = writes[next_write];
      // Step 2 of the write transaction. Every write's record is in the map (found or inserted
      // above) and guarded: evictions never take it, but any erase makes the lookups look again.
      const auto find_record = [&] { return store_.find_record(lock, chunk.key, &lookups, i); };
      KeyRecord* const record =
          store_.reserve(lock, find_record, w.entry, guard, w.replaces, context.stash);
      if (record == nullptr) break;  // stop here: the cached range stays contiguous
      // No room on the device: the entry is stored without a device copy (not a failure).
      if (Entry* copy = context.device_copies->of(w);
          copy != nullptr && !store_.grant_device_blocks(lock, *copy, guard)) {
        context.device_copies->copies[w.device].reset();
      }
      w.record = record;  // grant_device_blocks erases no record
      ++next_write;
      ++granted;
      ++plan.cached;
    } else if (detail::KeyRecord* record = store_.find_record(lock, chunk.key, &lookups, i)) {
      store_.touch(lock, *record);  // already cached for the slot with this shape
      ++plan.cached;
    }
  }
  // The writes not granted: a record they would have filled (new, or emptied by a replacement)
  // goes again.
  drop_empty_records(lock, plan, lookups, granted);
  writes.erase(writes.begin() + static_cast<ptrdiff_t>(granted), writes.end());
  plan.epoch = store_.index(lock).erasures();
}

void WritePipeline::drop_empty_records(const IndexLock& lock, StorePlan& plan,
                                       detail::RecordLookups& lookups, size_t from) noexcept {
  for (size_t k = from; k < plan.writes.size(); ++k) {
    const size_t chunk = plan.writes[k].chunk;
    if (detail::KeyRecord* record =
            store_.find_record(lock, plan.chunks[chunk].key, &lookups, chunk)) {
      store_.close_record(lock, *record);
    }
  }
}

size_t WritePipeline::chunks_to_write(std::span<const Chunk> chunks,
                                               int64_t token_offset) {
  const auto first = std::partition_point(chunks.begin(), chunks.end(),
                                          [&](const Chunk& c) { return c.start < token_offset; });
  return static_cast<size_t>(chunks.end() - first);
}

void WritePipeline::copy_plans(std::span<StorePlan> plans, DeviceCopies& device_copies) {
  // Host plans copy now; device plans are grouped per (device, stream), one launch per group.
  detail::LaunchGroups<detail::StoreJob> groups;
  // One range for the call's host copies, opened at the first (a range per plan cost a batch
  // item ~50 instructions); device stores open theirs in the device path.
  std::optional<detail::ScopedRange> host_copies;
  for (size_t i = 0; i < plans.size(); ++i) {
    StorePlan& plan = plans[i];
    if (plan.writes.empty()) continue;
    const TensorView& hidden = *plan.hidden;
    const kernels::SourceView source = plan_segments(plan, hidden, *plan.options);
    if (hidden.device == Device::kCuda) {
      groups.add(hidden.device_index, plan.options->stream, {source, plan.segments}, i);
    } else {
      if (!host_copies) host_copies.emplace("store/gather_cast");
      merge_host_runs(plan.segments, source.cols);
      detail::host_store(source, plan.segments, store_.host_copy_context());
    }
  }
  host_copies.reset();
  for (auto& group : groups) {
    detail::FenceRef fence;
    if (group.jobs.size() == 1 && store_.config.tuning.store_impl != StoreImpl::kMapped) {
      // One device store: the gather into staging on the caller's stream, the copy to the pool
      // on a copy stream (hidden_state_store_impl).
      const detail::StoreJob& job = group.jobs.front();
      fence = store_.device_path->store(job.src, group.device_index, job.segments, group.stream);
    } else {
      // Several (or mapped): one launch writes every job's rows into the device-mapped pool.
      fence = store_.device_path->store_batch(group.jobs, group.device_index, group.stream);
    }
    for (const size_t i : group.items) plans[i].fence = fence;
    if (store_.keeps_device_copies(Device::kCuda, group.device_index)) {
      write_device_copies(plans, group.items, group.device_index, group.stream, device_copies);
    }
  }
}

void WritePipeline::write_device_copies(std::span<StorePlan> plans, std::span<const size_t> items,
                                        int device_index, Stream stream,
                                        DeviceCopies& device_copies) noexcept {
  std::vector<detail::StoreJob> jobs;
  // The group's device segments, here rather than in each plan (a plan stays small: see
  // PinnedWalk::DeviceCopies). Reserved whole first, so the jobs' spans into it stay valid;
  // store_batch reads them as it enqueues (its tables), before this returns.
  std::pmr::vector<kernels::WriteSegment> segments(heap_resource());
  try {
    size_t max_segments = 0;
    for (const size_t i : items) {
      for (const Write& w : plans[i].writes) {
        // As plan_writes counts a host entry's: its granules, plus a row end each when scaled.
        if (const Entry* copy = device_copies.of(w)) {
          const bool scaled = copy->format.scales != detail::ScaleLayout::kNone;
          max_segments += copy->blocks.size() + (scaled ? static_cast<size_t>(copy->rows) : 0);
        }
      }
    }
    segments.reserve(max_segments);
    jobs.reserve(items.size());
    for (const size_t i : items) {
      StorePlan& plan = plans[i];
      const size_t first = segments.size();
      for (const Write& w : plan.writes) {
        const Entry* copy = device_copies.of(w);
        if (copy == nullptr) continue;
        const Chunk& chunk = plan.chunks[w.chunk];
        append_entry_segments(*copy, chunk.start - plan.options->token_offset,
                              plan.hidden->cols, plan.esize, segments);
      }
      if (segments.size() == first) continue;
      const TensorView& hidden = *plan.hidden;
      jobs.push_back({{hidden.data, detail::to_elem_type(hidden.dtype), hidden.cols,
                       hidden.stride()},
                      std::span<const kernels::WriteSegment>(segments).subspan(first)});
    }
    if (jobs.empty()) return;
    // Device memory is device-mapped: store_batch runs its one kernel straight into it, on the
    // caller's stream (ordered after the caller's work, as the host store's gather is).
    const detail::FenceRef fence = store_.device_path->store_batch(jobs, device_index, stream);
    for (const size_t i : items) {
      for (const Write& w : plans[i].writes) {
        if (Entry* copy = device_copies.of(w)) store_.set_fence(*copy, fence);
      }
    }
  } catch (const std::exception& e) {
    // The device copies are lost, the host entries stand: the tier is a cache.
    size_t lost = 0;
    for (const size_t i : items) {
      for (const Write& w : plans[i].writes) lost += device_copies.of(w) != nullptr ? 1 : 0;
    }
    store_.count_device_errors(lost);
    detail::log(detail::LogLevel::kWarn,
                std::string("device-resident tier: device copies not written: ") + e.what());
    // Their granules go back as the plan ends (no fence: nothing enqueued still writes them).
  }
}

void WritePipeline::merge_host_runs(std::pmr::vector<kernels::WriteSegment>& segments,
                                             int64_t cols) noexcept {
  // Chunks whose source rows follow each other and whose granules are adjacent in the pool (a
  // fresh pool, or one refilled after LRU evictions) are one copy: a store of contiguous chunks
  // is one copy of the same bytes, and glibc's memcpy picks its path for the whole run. Host
  // sources only: a segment's source element is then any flat offset from its row0. In place.
  if (segments.empty()) return;
  size_t out = 0;
  for (size_t i = 1; i < segments.size(); ++i) {
    kernels::WriteSegment& last = segments[out];
    const kernels::WriteSegment& next = segments[i];
    const auto esize = static_cast<int64_t>(kernels::elem_bytes(last.dst_type));
    if (next.dst_type == last.dst_type && last.scale == nullptr && next.scale == nullptr &&
        static_cast<std::byte*>(last.dst) + last.count * esize == next.dst &&
        last.src_row0 * cols + last.src_elem + last.count == next.src_row0 * cols + next.src_elem) {
      last.count += next.count;
    } else {
      segments[++out] = next;
    }
  }
  segments.resize(out + 1);
}

kernels::SourceView WritePipeline::plan_segments(StorePlan& plan, const TensorView& hidden,
                                                          const StoreOptions& opt) {
  // Segments were reserved before phase 1 applied anything: building them does not allocate.
  for (const Write& w : plan.writes) {
    const Chunk& chunk = plan.chunks[w.chunk];
    append_entry_segments(*w.entry, chunk.start - opt.token_offset, hidden.cols, plan.esize,
                          plan.segments);
  }
  return {hidden.data, detail::to_elem_type(hidden.dtype), hidden.cols, hidden.stride()};
}

// Inlined into both callers (this file only): a call per write cost a one-chunk batch item
// ~2% of its instructions (callgrind).
__attribute__((always_inline)) inline void WritePipeline::append_entry_segments(
    const detail::Entry& entry, int64_t src_row0, int64_t cols, int64_t esize,
    std::pmr::vector<kernels::WriteSegment>& segments) const {
  if (entry.format.scales != detail::ScaleLayout::kNone) {
    plan_scaled_segments(entry, src_row0, segments);
    return;
  }
  const auto granule = static_cast<int64_t>(store_.pool().granule_bytes());
  const detail::BlockPool& home = store_.home_pool(entry);
  kernels::for_each_block_piece(
      0, entry.rows * cols, esize, granule,
      [&](int64_t block, int64_t byte_offset, int64_t first, int64_t count) {
        std::byte* dst = home.block_address(entry.blocks[static_cast<size_t>(block)]) + byte_offset;
        // Granules granted in ascending order are adjacent: one copy for the run.
        if (!segments.empty()) {
          kernels::WriteSegment& last = segments.back();
          if (static_cast<std::byte*>(last.dst) + last.count * esize == dst &&
              last.src_row0 == src_row0 && last.src_elem + last.count == first) {
            last.count += count;
            return;
          }
        }
        segments.push_back({dst, src_row0, first, count, entry.format.elem});
      });
}

void WritePipeline::plan_scaled_segments(const detail::Entry& entry, int64_t src_row0,
                                         std::pmr::vector<kernels::WriteSegment>& segments) const {
  // One segment per row and granule: each knows its row's scale, which the segment starting the
  // row writes.
  detail::for_each_scaled_piece(
      store_, entry, 0, [&](std::byte* scale, std::byte* codes, int64_t first, int64_t count) {
        segments.push_back(
            {codes, src_row0, first, count, entry.format.elem, reinterpret_cast<float*>(scale)});
      });
}

void WritePipeline::commit_plan(const IndexLock& lock, StorePlan& plan,
                                const DeviceCopies& device_copies) noexcept {
  // Without any erase since phase 1 the records found there are still the keys' (publishing
  // erases nothing, so this holds for the whole plan).
  const bool records_hold = plan.epoch == store_.index(lock).erasures();
  for (Write& w : plan.writes) {
    store_.set_fence(*w.entry, plan.fence);
    // An entry dropped meanwhile (drop_key, close, a coupled eviction) stays detached.
    (void)store_.commit_entry(lock, plan.chunks[w.chunk].key, *w.entry,
                              records_hold ? w.record : nullptr);
    // The device copy joins its entry once its kernel was enqueued (it then has a fence); a
    // published entry only (one dropped meanwhile takes no copy).
    if (w.device != Write::kNoDevice) {
      const EntryRef& copy = device_copies.copies[w.device];
      if (copy && copy->fence && w.entry->ready()) w.entry->device_copy = copy;
    }
  }
}

void WritePipeline::abort_plan(const IndexLock& lock, StorePlan& plan) noexcept {
  for (const Write& w : plan.writes) store_.abort_entry(lock, plan.chunks[w.chunk].key, *w.entry);
}

template StoreResult WritePipeline::store_tokens(std::span<const int32_t>,
                                                          const TensorView&, const StoreOptions&);
template StoreResult WritePipeline::store_tokens(std::span<const int64_t>,
                                                          const TensorView&, const StoreOptions&);

}  // namespace hss::detail
