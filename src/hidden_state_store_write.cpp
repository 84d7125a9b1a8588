// The store path. Three phases, so that a failure anywhere leaves the store as it was:
//   1. under the index lock: plan which chunks need writing, allocate everything the plan needs
//      (entries, map and LRU nodes, slot vectors) while nothing is changed yet, then apply it with
//      operations that cannot throw (touches, evictions, granule grants, inserts as PENDING);
//   2. no lock: copy the rows into the granted granules (host) or enqueue the copies (device);
//   3. under the lock: publish the entries as READY.
// A failed phase 2 withdraws this call's PENDING entries.

#include <algorithm>
#include <string>

#include "hidden_state_store_impl.hpp"
#include "hss/detail/checked.hpp"
#include "hss/error.hpp"
#include "nvtx.hpp"
#include "store_validation.hpp"

namespace hss {

using detail::EntryRef;
using kernels::ElemType;

template <typename Token>
StoreResult HiddenStateStore::Impl::store_tokens(std::span<const Token> token_ids,
                                                 const TensorView& hidden,
                                                 const StoreOptions& opt) {
  HSS_RANGE("store");
  detail::check_store_arguments(static_cast<int64_t>(token_ids.size()), hidden, opt,
                                device_path_ != nullptr);
  check_pointer(hidden.data, hidden.device, hidden.device_index, "hidden_states");
  check_stream(hidden.device, opt.stream);
  std::vector<Chunk> chunks;
  {
    HSS_RANGE("store/keys");
    chunks = token_database_.process_tokens(token_ids);  // validates the token ids
  }
  return store_validated(chunks, hidden, opt);
}

StoreResult HiddenStateStore::Impl::store_chunks(std::span<const Chunk> chunks,
                                                 const TensorView& hidden,
                                                 const StoreOptions& opt) {
  HSS_RANGE("store");
  check_chunks(chunks);
  detail::check_store_arguments(chunks.empty() ? 0 : chunks.back().end, hidden, opt,
                                device_path_ != nullptr);
  check_pointer(hidden.data, hidden.device, hidden.device_index, "hidden_states");
  check_stream(hidden.device, opt.stream);
  return store_validated(chunks, hidden, opt);
}

StoreResult HiddenStateStore::Impl::store_validated(std::span<const Chunk> chunks,
                                                    const TensorView& hidden,
                                                    const StoreOptions& opt) {
  const Slot slot{opt.kind, opt.layer_idx};
  if (!config_.slot_allowed(slot.kind, slot.layer_idx)) {
    std::lock_guard lock(mutex_);
    check_open_locked();
    counters_.stores.fetch_add(1, std::memory_order_relaxed);
    return {};
  }
  const ElemType storage = storage_for(hidden);
  StorePlan plan;
  plan.chunks = chunks;
  plan.esize = static_cast<int64_t>(kernels::elem_bytes(storage));
  reserve_and_apply(hidden, opt, storage, plan);
  counters_.stores.fetch_add(1, std::memory_order_relaxed);
  if (plan.writes.empty()) return {0, plan.cached};
  try {
    copy_rows(plan, hidden, opt);
  } catch (...) {
    withdraw(plan);
    throw;
  }
  publish(plan);
  // Write-behind: the remote tier borrows each written entry (its fence included) and never
  // makes this call wait for the network.
  for (const Write& w : plan.writes) remote_.write_behind(plan.chunks[w.chunk].key, w.entry, pool_);
  const auto written = static_cast<int64_t>(plan.writes.size());
  counters_.chunks_written.fetch_add(plan.writes.size(), std::memory_order_relaxed);
  counters_.kind_chunks_written[static_cast<size_t>(slot.kind)].fetch_add(
      plan.writes.size(), std::memory_order_relaxed);
  return {written, plan.cached};
}

ElemType HiddenStateStore::Impl::storage_for(const TensorView& hidden) const {
  return (config_.hidden_state_storage_dtype == StorageDType::kNative &&
          hidden.dtype != DType::kFloat32)
             ? detail::to_elem_type(hidden.dtype)
             : ElemType::kFloat32;
}

void HiddenStateStore::Impl::reserve_and_apply(const TensorView& hidden, const StoreOptions& opt,
                                               ElemType storage, StorePlan& plan) {
  HSS_RANGE("store/alloc");
  // Finished device restores let go of their pins and landed copies of dropped entries give
  // their granules back before this call decides what to evict.
  reclaim_device_resources();
  expire_leases();  // granules of ended leases are free for this store
  detail::RecordLookups lookups(plan.chunks.size());
  PlanContext context;
  context.lookups = &lookups;
  std::lock_guard lock(mutex_);
  check_open_locked();
  reserve_and_apply_locked(hidden, opt, storage, plan, context);
}

void HiddenStateStore::Impl::reserve_and_apply_locked(const TensorView& hidden,
                                                      const StoreOptions& opt, ElemType storage,
                                                      StorePlan& plan, PlanContext& context) {
  const std::span<const Chunk> chunks = plan.chunks;
  const Slot slot{opt.kind, opt.layer_idx};
  auto& writes = plan.writes;
  detail::StoreIndex::Prepared& prepared = context.prepared;
  detail::RecordLookups& lookups = *context.lookups;
  size_t max_segments = 0;
  const uint64_t guard = ++next_guard_;
  writes.reserve(chunks_to_write(chunks, opt.token_offset));

  // Plan: which chunks need writing. Allocation is fine here: nothing has changed yet.
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& chunk = chunks[i];
    detail::KeyRecord* record = lookups.find(index_, i, chunk.key);
    // Every key of the caller's token list is off limits to this call's evictions, the chunks
    // before token_offset included: they are the prefix this call extends.
    if (record) record->guard = guard;
    if (chunk.start < opt.token_offset) continue;  // chunks stay atomic with KV boundaries
    const EntryRef* held = record ? record->find(slot) : nullptr;
    if (held && (*held)->cols == hidden.cols && (*held)->storage == storage) continue;
    const detail::Entry* replaces = held ? held->get() : nullptr;  // before slots may move
    const auto bytes = static_cast<uint64_t>(
        detail::mul_or_throw(detail::mul_or_throw(chunk.size(), hidden.cols, "chunk elements"),
                             plan.esize, "chunk bytes"));
    auto entry = std::make_shared<detail::Entry>(pool_, chunk.size(), hidden.cols, storage, slot);
    const size_t need = pool_.blocks_for(bytes);
    entry->blocks.reserve(need);
    max_segments += need;
    if (record && record->slots.size() == record->slots.capacity()) {
      record->slots.reserve(record->slots.size() + context.slot_hint);
    }
    // A replacement may remove the record's last slot (and so the record): prepare a fresh one.
    if (!record || replaces) index_.prepare_insert(prepared, chunk.key, context.slot_hint);
    writes.push_back({i, std::move(entry), replaces});
  }
  if (!context.keys_reserved) index_.reserve_keys(writes.size());
  plan.segments.reserve(max_segments);

  // Apply: nothing below throws.
  size_t granted = 0;
  size_t next_write = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& chunk = chunks[i];
    if (chunk.start < opt.token_offset) continue;
    if (next_write < writes.size() && writes[next_write].chunk == i) {
      Write& w = writes[next_write++];
      if (w.replaces != nullptr) index_.erase_slot(chunk.key, w.replaces);
      const size_t need = w.entry->blocks.capacity();
      w.entry->blocks.resize(need);  // within capacity: no allocation
      bool ok = need <= pool_.num_blocks() && pool_.allocate(w.entry->blocks);
      while (!ok && need <= pool_.num_blocks() && evict_for_space(guard)) {
        ok = pool_.allocate(w.entry->blocks);
      }
      if (!ok) {
        w.entry->blocks.clear();
        counters_.allocation_failures.fetch_add(1, std::memory_order_relaxed);
        break;  // stop at this chunk: the cached range stays contiguous
      }
      // Evictions above never take this call's keys (guarded), but any erase (a replaced last
      // slot included) makes the lookups look again.
      detail::KeyRecord* found = lookups.find(index_, i, chunk.key);
      detail::KeyRecord& record = found ? *found : index_.insert(chunk.key, prepared);
      if (!found) lookups.remember(index_, i, record);
      record.guard = guard;
      index_.touch(record);
      record.slots.push_back(w.entry);  // capacity reserved above
      w.record = &record;
      ++granted;
      ++plan.cached;
    } else if (detail::KeyRecord* record = lookups.find(index_, i, chunk.key)) {
      index_.touch(*record);  // already cached for the slot with this shape
      ++plan.cached;
    }
  }
  writes.erase(writes.begin() + static_cast<ptrdiff_t>(granted), writes.end());
  plan.epoch = index_.erasures();
}

size_t HiddenStateStore::Impl::chunks_to_write(std::span<const Chunk> chunks,
                                               int64_t token_offset) {
  const auto first = std::partition_point(chunks.begin(), chunks.end(),
                                          [&](const Chunk& c) { return c.start < token_offset; });
  return static_cast<size_t>(chunks.end() - first);
}

bool HiddenStateStore::Impl::evict_for_space(uint64_t guard) noexcept {
  HSS_RANGE("evict");
  // Only keys nobody pins give their granules back now; evicting a pinned one would lose its
  // data without making room for this allocation.
  const CacheEngineKey* victim = index_.eviction_candidate(guard, /*freeable_only=*/true);
  if (victim == nullptr) return false;
  (void)index_.erase(*victim);
  counters_.hs_evictions.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void HiddenStateStore::Impl::copy_rows(StorePlan& plan, const TensorView& hidden,
                                       const StoreOptions& opt) {
  const kernels::SourceView source = plan_segments(plan, hidden, opt);
  if (hidden.device == Device::kCuda && config_.tuning.store_impl == StoreImpl::kMapped) {
    // One launch writes the rows, cast or not, straight into the device-mapped pool.
    const detail::StoreJob job{source, plan.segments};
    plan.fence = device_path_->store_batch(std::span(&job, 1), hidden.device_index, opt.stream);
  } else if (hidden.device == Device::kCuda) {
    plan.fence = device_path_->store(source, hidden.device_index, plan.segments, opt.stream);
  } else {
    HSS_RANGE("store/gather_cast");
    merge_host_runs(plan.segments, source.cols);
    detail::host_store(source, plan.segments, host_copy_context());
  }
}

void HiddenStateStore::Impl::merge_host_runs(std::pmr::vector<kernels::WriteSegment>& segments,
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
    if (next.dst_type == last.dst_type &&
        static_cast<std::byte*>(last.dst) + last.count * esize == next.dst &&
        last.src_row0 * cols + last.src_elem + last.count == next.src_row0 * cols + next.src_elem) {
      last.count += next.count;
    } else {
      segments[++out] = next;
    }
  }
  segments.resize(out + 1);
}

kernels::SourceView HiddenStateStore::Impl::plan_segments(StorePlan& plan, const TensorView& hidden,
                                                          const StoreOptions& opt) {
  // Segments were reserved before phase 1 applied anything: building them does not allocate.
  auto& segments = plan.segments;
  const auto granule = static_cast<int64_t>(pool_.granule_bytes());
  for (const Write& w : plan.writes) {
    const Chunk& chunk = plan.chunks[w.chunk];
    const int64_t src_row0 = chunk.start - opt.token_offset;
    const detail::Entry& entry = *w.entry;
    kernels::for_each_block_piece(
        0, chunk.size() * hidden.cols, plan.esize, granule,
        [&](int64_t block, int64_t byte_offset, int64_t first, int64_t count) {
          std::byte* dst =
              pool_.block_address(entry.blocks[static_cast<size_t>(block)]) + byte_offset;
          // Granules granted in ascending order are adjacent: one copy for the run.
          if (!segments.empty()) {
            kernels::WriteSegment& last = segments.back();
            if (static_cast<std::byte*>(last.dst) + last.count * plan.esize == dst &&
                last.src_row0 == src_row0 && last.src_elem + last.count == first) {
              last.count += count;
              return;
            }
          }
          segments.push_back({dst, src_row0, first, count, entry.storage});
        });
  }
  return {hidden.data, detail::to_elem_type(hidden.dtype), hidden.cols, hidden.stride()};
}

void HiddenStateStore::Impl::publish(StorePlan& plan) noexcept {
  std::lock_guard lock(mutex_);
  publish_locked(plan);
}

void HiddenStateStore::Impl::publish_locked(StorePlan& plan) noexcept {
  for (Write& w : plan.writes) {
    w.entry->fence = plan.fence;
    if (plan.fence) w.entry->deferred = &deferred_;
    // An entry dropped meanwhile (drop_key, close, a coupled eviction) stays detached. Without
    // any erase since phase 1 the record found there is still the key's.
    detail::KeyRecord* record =
        plan.epoch == index_.erasures() ? w.record : index_.find(plan.chunks[w.chunk].key);
    if (record == nullptr) continue;
    if (const EntryRef* held = record->find(w.entry->slot); held && *held == w.entry) {
      index_.account_publish(*record, *w.entry);
    }
  }
}

void HiddenStateStore::Impl::withdraw(StorePlan& plan) noexcept {
  std::lock_guard lock(mutex_);
  withdraw_locked(plan);
}

void HiddenStateStore::Impl::withdraw_locked(StorePlan& plan) noexcept {
  for (const Write& w : plan.writes) index_.erase_slot(plan.chunks[w.chunk].key, w.entry.get());
}

template StoreResult HiddenStateStore::Impl::store_tokens(std::span<const int32_t>,
                                                          const TensorView&, const StoreOptions&);
template StoreResult HiddenStateStore::Impl::store_tokens(std::span<const int64_t>,
                                                          const TensorView&, const StoreOptions&);

}  // namespace hss
