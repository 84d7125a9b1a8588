// The read path. Every retrieve (into the caller's buffers or into tensors it allocates, one
// slot or several, single or batched) runs retrieve_reads; coverage and exports run its walk.
// Every read is one walk:
//   plan_walk:  slot presence under the index lock (pinning what it finds), then KV presence per
//               chunk outside it, asked before the slot as LMCache does, then fence waits;
//   checks:     the caller's output against what the walk found;
//   apply:      drop the orphan key, touch the prefix in reverse order; counters once a call.
// So a retrieve that fails its checks changes nothing, and coverage is the walk without apply.

#include <algorithm>
#include <memory>
#include <string>

#include "base/heap_resource.hpp"
#include "base/log.hpp"
#include "base/nvtx.hpp"
#include "datapath/launch_groups.hpp"
#include "format/dtype_codes.hpp"
#include "hss/error.hpp"
#include "store/read_pipeline.hpp"
#include "store/scaled_rows.hpp"
#include "store/tier_read_through.hpp"

#include "store/store_validation.hpp"

namespace hss::detail {

ReadPipeline::Walk ReadPipeline::plan_walk(std::span<const Chunk> chunks,
                                                               std::span<const Slot> slots,
                                                               PendingCopies pending) const {
  HSS_RANGE("retrieve/walk");
  Walk w;
  {
    const auto lock = store_.lock_index();
    store_.check_open(lock);
    store_.pin_prefix(lock, w, chunks, slots);
  }
  walk_finish(w, pending);
  return w;
}

void ReadPipeline::walk_finish(Walk& w, PendingCopies pending,
                                         detail::KvAnswers* kv_answers) const {
  const std::span<const Chunk> chunks = w.chunks;
  const size_t present = static_cast<size_t>(w.hits);
  // KV outside the lock (contains() takes the KV backend's own lock), for every chunk of the
  // prefix and the chunk that ended it: LMCache asks KV first, so a chunk with KV gone is an
  // orphan even when the slot is missing there.
  size_t hits = present;
  if (const StorageManager* kv = store_.storage_manager.load(std::memory_order_acquire)) {
    const size_t asked = std::min(present + 1, chunks.size());
    for (size_t i = 0; i < asked; ++i) {
      const bool kv_held = kv_answers ? kv_answers->contains(*kv, i, chunks.size(), chunks[i].key)
                                      : kv->contains(chunks[i].key);
      if (!kv_held) {
        w.orphan = i;
        hits = i;
        break;
      }
    }
  }
  // Device-path entries: the rows are there once their copy landed; a copy that failed ends the
  // prefix and its chunk is dropped (StoreState::end_walk), never served. A device-output restore never
  // waits here: it drops what the fences' cached flags say failed (DevicePath::poll() refreshed
  // them before the walk) and orders itself after the distinct fences still pending.
  // Host-path entries carry no fence: their rows are there, nothing to wait for or order after.
  if (w.any_fence) {
    const auto drop_failed = [&](size_t i, const detail::Entry& entry) {
      detail::log(detail::LogLevel::kError,
                  "hidden-state copy failed, dropping chunk: " + entry.fence->error());
      w.failed_copy = i;
      hits = i;
    };
    for (size_t i = 0; i < hits; ++i) {
      for (size_t s = 0; s < w.slots; ++s) {
        const detail::Entry& entry = *w.pinned[i * w.slots + s];
        bool failed = false;
        switch (pending) {
          case PendingCopies::kWaitOnHost:
            failed = entry.fence && !entry.fence->wait();
            break;
          case PendingCopies::kOrderOnDevice:
            failed = entry.copy_failed();
            break;
          case PendingCopies::kQuery:
            failed = entry.fence && entry.fence->ready() && entry.fence->failed();
            break;
        }
        if (failed) {
          drop_failed(i, entry);
          break;
        }
      }
    }
    if (pending == PendingCopies::kOrderOnDevice) {
      for (size_t i = 0; i < hits * w.slots; ++i) {
        const detail::FenceRef& fence = w.pinned[i]->fence;
        if (fence && !fence->settled() && (w.fences.empty() || w.fences.back() != fence)) {
          w.fences.push_back(fence);
        }
      }
      std::sort(w.fences.begin(), w.fences.end());
      w.fences.erase(std::unique(w.fences.begin(), w.fences.end()), w.fences.end());
    }
  }
  w.pinned.resize(hits * w.slots);
  if (w.has_device_pins()) {
    Walk::Pins& copies = w.device->pins;
    copies.resize(hits * w.slots);
    for (size_t i = 0; i < copies.size(); ++i) {
      if (copies[i] && copies[i]->copy_failed()) {  // never served
        w.device->failed.push_back(w.pinned[i]);
        w.device->failed.push_back(std::move(copies[i]));
        copies[i] = nullptr;
      }
    }
    // A device restore orders itself after the device copies' kernels too (they ran on the
    // storing stream; the host entries' fences are on its copy stream).
    if (pending == PendingCopies::kOrderOnDevice) {
      const size_t before = w.fences.size();
      for (const EntryRef& copy : copies) {
        if (copy && copy->fence && !copy->fence->settled()) w.fences.push_back(copy->fence);
      }
      if (w.fences.size() != before) {
        std::sort(w.fences.begin(), w.fences.end());
        w.fences.erase(std::unique(w.fences.begin(), w.fences.end()), w.fences.end());
      }
    }
  }
  w.hits = static_cast<int64_t>(hits);
  w.prefix_tokens = hits > 0 ? chunks[hits - 1].end : 0;
}

void ReadPipeline::discard_orphan(const Walk& w) noexcept {
  if (w.orphan && !store_.tiers.empty()) {
    store_.tiers.discard(std::span<const CacheEngineKey>(&w.chunks[*w.orphan].key, 1));
  }
}

uint64_t ReadPipeline::plan_restore(const Walk& w, size_t slot, int64_t row_begin,
                                std::vector<kernels::GatherSegment>& segments,
                                bool device_copies) const {
  segments.clear();
  const int64_t cols = w.cols(slot);
  const auto granule = static_cast<int64_t>(store_.pool().granule_bytes());
  const bool from_device = device_copies && w.has_device_pins();
  uint64_t device_hits = 0;
  for (int64_t i = 0; i < w.hits; ++i) {
    const Chunk& chunk = w.chunks[static_cast<size_t>(i)];
    if (chunk.end <= row_begin) continue;
    const detail::Entry* copy =
        from_device ? w.device->pins[static_cast<size_t>(i) * w.slots + slot].get() : nullptr;
    device_hits += copy != nullptr ? 1 : 0;
    const detail::Entry& entry = copy != nullptr ? *copy : w.entry(i, slot);
    const int64_t first_row = std::max<int64_t>(0, row_begin - chunk.start);
    if (entry.format.scales != detail::ScaleLayout::kNone) {
      plan_scaled_restore(entry, first_row, chunk.start * cols - row_begin * cols, segments);
      continue;
    }
    const auto esize = static_cast<int64_t>(kernels::elem_bytes(entry.format.elem));
    const detail::BlockPool& home = store_.home_pool(entry);
    kernels::for_each_block_piece(
        first_row * cols, (chunk.size() - first_row) * cols, esize, granule,
        [&](int64_t block, int64_t byte_offset, int64_t first, int64_t count) {
          const std::byte* src =
              home.block_address(entry.blocks[static_cast<size_t>(block)]) + byte_offset;
          const int64_t dst_elem = chunk.start * cols + first - row_begin * cols;
          // Adjacent granules (and adjacent entries) read as one run.
          if (!segments.empty()) {
            kernels::GatherSegment& last = segments.back();
            if (last.src_type == entry.format.elem &&
                static_cast<const std::byte*>(last.src) + last.count * esize == src &&
                last.dst_elem + last.count == dst_elem) {
              last.count += count;
              return;
            }
          }
          segments.push_back({src, dst_elem, count, entry.format.elem});
        });
  }
  return device_hits;
}

void ReadPipeline::plan_scaled_restore(const detail::Entry& entry, int64_t first_row,
                                       int64_t dst_base,
                                       std::vector<kernels::GatherSegment>& segments) const {
  // One segment per row and granule, each with its row's scale; never merged across rows.
  detail::for_each_scaled_piece(
      store_, entry, first_row,
      [&](const std::byte* scale, const std::byte* codes, int64_t first, int64_t count) {
        segments.push_back({codes, dst_base + first, count, entry.format.elem,
                            reinterpret_cast<const float*>(scale)});
      });
}

bool ReadPipeline::reads_device_copies(int device) const {
  if (!store_.has_device_tier()) return false;
  // Another device reads the copies over peer access where CUDA allows it, else the pool.
  return device == store_.device_tier_device() ||
         store_.device_path->peer_access(device, store_.device_tier_device());
}

void ReadPipeline::check_read(const ReadCall& call) const {
  if (call.row_begin < 0) {
    throw InvalidArgument("row_begin = " + std::to_string(call.row_begin) + " is negative");
  }
  if (call.slot_from_options) detail::check_kind(call.slots.front().kind, "options.kind");
  if (call.chunk_form) store_.check_chunks(call.chunks);
  if (call.allocate != nullptr) {
    detail::check_slots(call.slots);
  } else {
    check_outputs(call.slots, call.outs, call.stream);  // the slots too
  }
}

int64_t ReadPipeline::retrieve(const ReadCall& call) {
  HSS_RANGE("retrieve");
  check_read(call);
  std::vector<Chunk> made;
  std::span<const Chunk> chunks = call.chunks;
  int64_t n_tokens = chunks.empty() ? 0 : chunks.back().end;
  if (!call.chunk_form) {
    made = call.tokens.visit([&](auto ids) { return store_.token_database.process_tokens(ids); });
    chunks = made;
    n_tokens = static_cast<int64_t>(call.tokens.size());
  }
  // A batch of one read, without the per-list caches (each chunk is looked up once anyway).
  ReadItem read{chunks, n_tokens, call.slots, call.outs, call.row_begin, call.stream,
                nullptr, nullptr, 0};
  read.allocate = call.allocate;
  Walk walk;
  int64_t rows = 0;
  retrieve_reads(std::span<const ReadItem>(&read, 1), std::span<Walk>(&walk, 1),
                 std::span<int64_t>(&rows, 1), /*name_items=*/false);
  return rows;
}

void ReadPipeline::allocate_outputs(const Walk& w, const ReadItem& read) {
  AllocatedOutputs& out = *read.allocate;
  out.tensors.clear();
  out.views = {};
  if (read.row_begin >= w.prefix_tokens) return;
  const int64_t rows = w.prefix_tokens - read.row_begin;
  out.tensors.reserve(read.slots.size());
  for (size_t s = 0; s < read.slots.size(); ++s) out.tensors.emplace_back(rows, w.cols(s));
  if (out.tensors.size() == 1) {
    out.one_view = out.tensors.front().mutable_view();
    out.views = std::span<const MutableTensorView>(&out.one_view, 1);
    return;
  }
  out.many_views.clear();
  out.many_views.reserve(out.tensors.size());
  for (HostTensor& t : out.tensors) out.many_views.push_back(t.mutable_view());
  out.views = out.many_views;
}

void ReadPipeline::check_outputs(std::span<const Slot> slots,
                                           std::span<const MutableTensorView> outs,
                                           Stream stream) const {
  detail::check_slots(slots);
  if (outs.size() != slots.size()) {
    throw InvalidArgument("outs has " + std::to_string(outs.size()) + " views for " +
                          std::to_string(slots.size()) + " slots");
  }
  const auto check_one = [&](const MutableTensorView& out, const char* name) {
    detail::check_view(out.as_const(), name, store_.device_path != nullptr);
    store_.check_pointer(out.data, out.device, out.device_index, name);
  };
  if (outs.size() == 1) {
    check_one(outs[0], "out");  // the common, hot case: no name to spell out
  } else {
    for (size_t s = 0; s < outs.size(); ++s) {
      check_one(outs[s], ("outs[" + std::to_string(s) + "]").c_str());
    }
  }
  for (const MutableTensorView& out : outs) {
    if (out.device == Device::kCuda) {
      store_.check_stream(out.device, stream);
      break;
    }
  }
}

void ReadPipeline::retrieve_reads(std::span<const ReadItem> reads, std::span<Walk> walks,
                                            std::span<int64_t> rows, bool name_items) {
  // Each read's KV answers: the list's (a batch's reads of one list share them), or, where the
  // read-through asks KV too, the read's own, so each chunk's KV is asked once per call.
  // (No allocation unless tiers and a KV side are both there: a single read is the hot path.)
  const bool read_through_asks_kv =
      !store_.tiers.empty() && store_.storage_manager.load(std::memory_order_acquire) != nullptr;
  std::vector<detail::KvAnswers> own_answers;
  if (read_through_asks_kv) own_answers.resize(reads.size());
  const auto kv_answers = [&](size_t i) -> detail::KvAnswers* {
    if (reads[i].kv_answers != nullptr) return reads[i].kv_answers;
    return read_through_asks_kv ? &own_answers[i] : nullptr;
  };
  // The backing tiers fill the pool where a walk would stop (no-op without one), before the lock.
  // A read's outputs give each slot's width (an allocating read has none yet: 0).
  if (!store_.tiers.empty()) {
    std::vector<int64_t> widths;
    for (size_t i = 0; i < reads.size(); ++i) {
      widths.assign(reads[i].slots.size(), 0);
      for (size_t s = 0; s < widths.size() && s < reads[i].outs.size(); ++s) {
        widths[s] = reads[i].outs[s].cols;
      }
      (void)tier_reads_.read_through(reads[i].chunks, reads[i].slots, kv_answers(i), widths);
    }
  }
  // One lock for every walk's index part; KV checks and fence waits outside it.
  {
    HSS_RANGE("retrieve/walk");
    const auto lock = store_.lock_index();
    store_.check_open(lock);
    for (size_t i = 0; i < reads.size(); ++i) {
      store_.pin_prefix(lock, walks[i], reads[i].chunks, reads[i].slots, reads[i].lookups);
    }
  }
  for (size_t i = 0; i < reads.size(); ++i) {
    // Host outputs need the rows now; device outputs only order themselves after the copies.
    const auto& outs = reads[i].outs;
    const bool all_device =
        reads[i].allocate == nullptr &&
        std::all_of(outs.begin(), outs.end(),
                    [](const MutableTensorView& o) { return o.device == Device::kCuda; });
    walk_finish(walks[i], all_device ? PendingCopies::kOrderOnDevice : PendingCopies::kWaitOnHost,
                kv_answers(i));
  }
  // Outputs the pipeline makes, then every output against its walk before anything is written.
  for (size_t i = 0; i < reads.size(); ++i) {
    if (reads[i].allocate != nullptr) allocate_outputs(walks[i], reads[i]);
    check_walk_outputs(walks[i], reads[i].outputs(), reads[i].row_begin,
                       name_items ? std::optional<size_t>(i) : std::nullopt);
  }
  restore_walks(walks, reads, rows);
  // One touch per key and list: the LRU order after a run of touches depends only on each
  // key's last touch, so an item skips the chunks a later item of its list touches again (a
  // key erased in between is gone either way).
  // (A single read touches every chunk: nothing to compute, nothing allocated.)
  std::vector<int64_t> touch_from;
  if (reads.size() > 1) {
    touch_from.assign(reads.size(), 0);
    std::vector<int64_t> later_hits;
    for (size_t i = reads.size(); i-- > 0;) {
      if (reads[i].list >= later_hits.size()) later_hits.resize(reads[i].list + 1, 0);
      int64_t& later = later_hits[reads[i].list];
      touch_from[i] = std::min(later, walks[i].hits);
      later = std::max(later, walks[i].hits);
    }
  }
  {
    // The lookups of the walks stay valid unless a key was erased meanwhile (they look again).
    const auto lock = store_.lock_index();
    for (size_t i = 0; i < reads.size(); ++i) {
      store_.end_walk(lock, walks[i], reads[i].lookups, touch_from.empty() ? 0 : touch_from[i]);
    }
  }
  if (!store_.tiers.empty()) {
    for (const Walk& w : walks) discard_orphan(w);
  }
  uint64_t hit_tokens = 0, miss_tokens = 0;
  for (size_t i = 0; i < reads.size(); ++i) {
    hit_tokens += static_cast<uint64_t>(walks[i].prefix_tokens);
    miss_tokens += static_cast<uint64_t>(reads[i].n_tokens - walks[i].prefix_tokens);
  }
  store_.counters.retrieves.fetch_add(reads.size(), std::memory_order_relaxed);
  store_.counters.hit_tokens.fetch_add(hit_tokens, std::memory_order_relaxed);
  store_.counters.miss_tokens.fetch_add(miss_tokens, std::memory_order_relaxed);
}

void ReadPipeline::check_walk_outputs(const Walk& w,
                                                std::span<const MutableTensorView> outs,
                                                int64_t row_begin,
                                                std::optional<size_t> item) const {
  if (row_begin >= w.prefix_tokens) return;
  const int64_t rows = w.prefix_tokens - row_begin;
  // Checked before anything changes: a bad output view drops nothing and counts nothing.
  for (size_t s = 0; s < outs.size(); ++s) {
    if (outs[s].cols == w.cols(s) && outs[s].rows >= rows) continue;
    const std::string name = (item ? "items[" + std::to_string(*item) + "]: " : std::string()) +
                             (outs.size() == 1 ? "out" : "outs[" + std::to_string(s) + "]");
    if (outs[s].cols != w.cols(s)) {
      throw InvalidArgument(name + ".cols = " + std::to_string(outs[s].cols) +
                            " but the cached hidden dim is " + std::to_string(w.cols(s)));
    }
    if (outs[s].rows < rows) {
      throw InvalidArgument(name + ".rows = " + std::to_string(outs[s].rows) +
                            " is too small for the " + std::to_string(rows) +
                            " rows of the cached prefix");
    }
  }
}

void ReadPipeline::restore_walks(std::span<Walk> walks, std::span<const ReadItem> reads,
                                           std::span<int64_t> rows) {
  HSS_RANGE("retrieve/assemble");
  // Host outputs now; device outputs grouped per (device, stream), one launch per group after
  // the union of its walks' fences, holding its walks' pins until it has read the pool.
  detail::LaunchGroups<detail::RestoreJob> groups;
  // Device jobs' segments (jobs hold spans of them: their buffers do not move with the list).
  std::vector<std::vector<kernels::GatherSegment>> segments;
  // Host outputs' segments: one buffer for every host output of the call, reused.
  std::vector<kernels::GatherSegment> host_segments;
  uint64_t device_hits = 0;  // counted once every launch was enqueued
  for (size_t i = 0; i < reads.size(); ++i) {
    Walk& w = walks[i];
    const int64_t row_begin = reads[i].row_begin;
    rows[i] = 0;
    if (row_begin >= w.prefix_tokens) continue;  // nothing to restore
    rows[i] = w.prefix_tokens - row_begin;
    const std::span<const MutableTensorView> outs = reads[i].outputs();
    for (size_t s = 0; s < outs.size(); ++s) {
      const MutableTensorView& out = outs[s];
      // Any output dtype: same-type copies are bit-identical, narrowing rounds to nearest-even.
      const kernels::OutputView view{out.data, w.cols(s), out.stride(),
                                     detail::to_elem_type(out.dtype)};
      if (out.device == Device::kCuda) {
        const bool device_copies =
            w.has_device_pins() && reads_device_copies(out.device_index);
        device_hits += plan_restore(w, s, row_begin, segments.emplace_back(), device_copies);
        groups.add(out.device_index, reads[i].stream, {segments.back(), view}, i);
      } else {
        (void)plan_restore(w, s, row_begin, host_segments);
        detail::host_restore(host_segments, view, store_.host_copy_context());
      }
    }
  }
  // The pins of a walk whose jobs are all in one group move into it; groups sharing a walk (its
  // outputs on several devices) or holding several walks share or copy them.
  // Pins on the heap move; pins in a batch's arena are copied out (the arena dies with the call).
  if (groups.empty()) {  // host outputs only (the common call): nothing to hand on
    for (Walk& w : walks) {
      w.pinned.clear();
      if (w.device) w.device->pins.clear();
    }
    return;
  }
  // The device copies a restore reads are pinned with the entries until it has read them.
  for (Walk& w : walks) {
    if (!w.device) continue;
    for (EntryRef& copy : w.device->pins) {
      if (copy) w.pinned.push_back(std::move(copy));
    }
    w.device->pins.clear();
  }
  std::pmr::memory_resource* const heap = heap_resource();
  std::vector<std::shared_ptr<Walk::Pins>> walk_pins(walks.size());
  const auto pins_of = [&](size_t i) {
    if (!walk_pins[i]) {
      Walk::Pins& own = walks[i].pinned;
      walk_pins[i] = own.get_allocator().resource() == heap
                         ? std::make_shared<Walk::Pins>(std::move(own))
                         : std::make_shared<Walk::Pins>(own.begin(), own.end(), heap);
    }
    return walk_pins[i];
  };
  for (auto& group : groups) {
    const bool one_walk = std::all_of(group.items.begin(), group.items.end(),
                                      [&](size_t i) { return i == group.items.front(); });
    std::vector<detail::FenceRef> fences;
    std::shared_ptr<Walk::Pins> pins;
    if (one_walk) {
      fences = walks[group.items.front()].fences;  // distinct already
      pins = pins_of(group.items.front());
    } else {
      pins = std::make_shared<Walk::Pins>(heap);
      size_t last = SIZE_MAX;
      for (const size_t i : group.items) {
        if (i == last) continue;
        last = i;
        const Walk& w = walks[i];
        fences.insert(fences.end(), w.fences.begin(), w.fences.end());
        const std::span<const EntryRef> held = walk_pins[i]
                                                   ? std::span<const EntryRef>(*walk_pins[i])
                                                   : std::span<const EntryRef>(w.pinned);
        pins->insert(pins->end(), held.begin(), held.end());
      }
      std::sort(fences.begin(), fences.end());
      fences.erase(std::unique(fences.begin(), fences.end()), fences.end());
    }
    if (group.jobs.size() == 1) {
      // One device output: restore(), which honours hidden_state_restore_impl.
      const detail::RestoreJob& job = group.jobs.front();
      store_.device_path->restore(job.segments, job.out, group.device_index, group.stream, fences,
                            std::move(pins));
    } else {
      store_.device_path->restore_batch(group.jobs, group.device_index, group.stream, fences,
                                  std::move(pins));
    }
  }
  for (Walk& w : walks) w.pinned.clear();  // the walks' own pins drop; device restores hold theirs
  if (device_hits != 0) store_.count_device_hits(device_hits);
}

int64_t ReadPipeline::coverage(std::span<const Chunk> chunks,
                                         std::span<const Slot> slots) const {
  // The checks retrieve_chunks applies, so coverage never answers for input retrieve rejects.
  store_.check_chunks(chunks);
  detail::check_slots(slots);
  // Never a host wait: a copy in flight counts (a device restore orders itself after it, a host
  // restore waits for it); one a non-blocking query sees failed ends the prefix, as a restore
  // would.
  return plan_walk(chunks, slots, PendingCopies::kQuery).prefix_tokens;
}

}  // namespace hss::detail
