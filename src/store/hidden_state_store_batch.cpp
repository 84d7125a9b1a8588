// Batch calls: an engine step (requests x layers) as one call instead of hundreds.
//
// A batch is the single calls' pipeline run once for every item: what this file adds is the
// checks of every item first and one key pass per distinct token list.
// store_batch:          check every item (a bad one: InvalidArgument "items[i]: ...", nothing
//                       done) -> one key pass per distinct token list -> store_plans (write.cpp):
//                       one index lock for every item's reservation (each item its own eviction
//                       guard, in item order) -> copies outside the lock (device items one launch
//                       per (device, stream)) -> one index lock to publish every item.
// retrieve_batch_into:  check every item -> one key pass per distinct token list ->
//                       retrieve_reads (read.cpp): one index lock for every item's walk -> KV
//                       checks and fences outside it -> every output checked against its walk
//                       before anything is written -> restores -> one index lock to apply every
//                       walk (touches, orphan drops) in item order.
// Results equal the single calls made in item order (a store batch larger than the free pool
// may evict differently: items of the batch are not evicted by later items of the same batch;
// a retrieve batch reads each chunk's KV once per list, as if no KV eviction landed during it).
//
// What the items share beyond the lock: the chunks of a token list and one index lookup per
// chunk of it (detail::RecordLookups, valid until a key is erased), on the read side one KV
// contains() per chunk of it (detail::KvAnswers), one map reserve and one
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

#include "base/heap_resource.hpp"
#include "store/read_pipeline.hpp"
#include "store/write_pipeline.hpp"
#include "hss/error.hpp"
#include "base/nvtx.hpp"
#include "format/dtype_codes.hpp"
#include "store/store_validation.hpp"

namespace hss::detail {

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
    const void* data = nullptr;
    size_t size = 0;
    bool int32 = false;
    bool operator==(const SpanKey&) const = default;
  };
  struct List {
    SpanKey span;
    std::vector<Chunk> chunks;
    detail::RecordLookups lookups;
    size_t items = 0;  // items of the batch passing this list
  };

  ChunkCache(const TokenDatabase& db, size_t items) : db_(db) {
    if (items >= kEmpty) {  // list indexes are 32-bit (billions of items: never a real batch)
      throw InvalidArgument("items has " + std::to_string(items) + " items, more than 2^32 - 2");
    }
    lists_.reserve(items);
    size_t buckets = 16;
    while (buckets < 2 * items) buckets *= 2;
    table_.assign(buckets, kEmpty);
  }
  /// The list of item `index`'s tokens: its position in lists().
  size_t list_of(size_t index, TokenIds tokens) {
    const SpanKey key{tokens.visit([](auto ids) { return static_cast<const void*>(ids.data()); }),
                      tokens.size(), tokens.is_int32()};
    if (last_ < lists_.size() && lists_[last_].span == key) return found(last_);
    const size_t mask = table_.size() - 1;
    size_t bucket = hash(key) & mask;
    for (; table_[bucket] != kEmpty; bucket = (bucket + 1) & mask) {
      if (lists_[table_[bucket]].span == key) return found(table_[bucket]);
    }
    List list;
    list.span = key;
    check_item(index, [&] {
      list.chunks = tokens.visit([&](auto ids) { return db_.process_tokens(ids); });
    });
    list.lookups = detail::RecordLookups(list.chunks.size());
    lists_.push_back(std::move(list));  // capacity reserved: no reallocation, spans stay valid
    table_[bucket] = static_cast<uint32_t>(lists_.size() - 1);
    return found(lists_.size() - 1);
  }
  [[nodiscard]] std::vector<List>& lists() { return lists_; }

 private:
  static constexpr uint32_t kEmpty = UINT32_MAX;
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
  std::vector<uint32_t> table_;  // list index per bucket, kEmpty when free (half the memset)
  size_t last_ = SIZE_MAX;
};

}  // namespace

std::vector<StoreResult> WritePipeline::store_batch(std::span<const StoreItem> items) {
  HSS_RANGE("store_batch");
  // 1. Every check first (and the key pass, which validates token ids): nothing done yet.
  ChunkCache cache(store_.token_database, items.size());
  std::vector<size_t> list_of(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const StoreItem& item = items[i];
    check_item(i, [&] {
      detail::check_store_arguments(static_cast<int64_t>(item.token_ids.size()), item.hidden_states,
                                    item.options, store_.device_path != nullptr);
      store_.check_pointer(item.hidden_states.data, item.hidden_states.device,
                    item.hidden_states.device_index, "hidden_states");
      store_.check_stream(item.hidden_states.device, item.options.stream);
    });
    list_of[i] = cache.list_of(i, item.token_ids);
  }
  auto& lists = cache.lists();
  // At most one new key per chunk of each distinct list: the map and the prepared keys are
  // sized once for the whole batch, so no item rehashes or grows them.
  size_t distinct_chunks = 0;
  for (const auto& list : lists) distinct_chunks += list.chunks.size();

  // 2. The phases of a single store (store_plans), once for every item. Every item's writes and
  //    segments come from one arena sized for the batch (a chunk needs at most one write and,
  //    with granules of a chunk or more, one segment; more only grows the arena).
  // The granules, as full chunks in the item's storage format (RowFormat: FP8 scales included):
  // the estimate for the batch's GranuleStash (chunk_size <= 2^20, cols <= 2^24: no overflow).
  size_t item_chunks = 0;
  size_t granules = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const size_t chunks = chunks_to_write(lists[list_of[i]].chunks, items[i].options.token_offset);
    item_chunks += chunks;
    const RowFormat format = RowFormat::of(storage_for(items[i].hidden_states));
    granules += chunks * store_.pool().blocks_for(format.payload_bytes(store_.config.chunk_size,
                                                                     items[i].hidden_states.cols));
  }
  // Upstream: the heap, never the process-wide default resource an application may have set.
  std::pmr::monotonic_buffer_resource arena(
      item_chunks * (sizeof(Write) + sizeof(kernels::WriteSegment)) + 64 * sizeof(Write),
      heap_resource());
  std::vector<StorePlan> plans;
  plans.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    auto& list = lists[list_of[i]];
    StorePlan& plan = plans.emplace_back(&arena);
    plan.chunks = list.chunks;
    plan.hidden = &items[i].hidden_states;
    plan.options = &items[i].options;
    plan.lookups = &list.lookups;
    plan.slot_hint = std::min<size_t>(list.items, 64);
  }
  store_plans(plans, distinct_chunks, items.size() > 1 ? granules : 0);
  std::vector<StoreResult> results(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    results[i] = {static_cast<int64_t>(plans[i].writes.size()), plans[i].cached};
  }
  return results;
}

std::vector<int64_t> ReadPipeline::retrieve_batch_into(
    std::span<const RetrieveItem> items) {
  HSS_RANGE("retrieve_batch");
  ChunkCache cache(store_.token_database, items.size());
  std::vector<size_t> list_of(items.size());
  std::vector<Slot> slots(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const RetrieveItem& item = items[i];
    slots[i] = {item.options.kind, item.options.layer_idx};
    // The checks of a single retrieve_hidden_states_into (check_read), named items[i].
    check_item(i, [&] {
      check_read({.tokens = item.token_ids,
                  .slots = std::span<const Slot>(&slots[i], 1),
                  .slot_from_options = true,
                  .outs = std::span<const MutableTensorView>(&item.out, 1),
                  .row_begin = item.options.row_begin,
                  .stream = item.options.stream});
    });
    list_of[i] = cache.list_of(i, item.token_ids);
  }
  auto& lists = cache.lists();
  // Each chunk's KV asked once per list of several items (the layers of a request). Made only
  // while a KV side is bound: a manager bound later in the call is asked once per item.
  std::vector<detail::KvAnswers> kv_answers;
  if (store_.storage_manager.load(std::memory_order_acquire) != nullptr) kv_answers.resize(lists.size());

  std::vector<ReadItem> reads(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const RetrieveItem& item = items[i];
    reads[i] = {lists[list_of[i]].chunks,
                static_cast<int64_t>(item.token_ids.size()),
                std::span<const Slot>(&slots[i], 1),
                std::span<const MutableTensorView>(&item.out, 1),
                item.options.row_begin,
                item.options.stream,
                &lists[list_of[i]].lookups,
                // A list of one item asks each chunk once anyway: no answers to keep.
                !kv_answers.empty() && lists[list_of[i]].items > 1 ? &kv_answers[list_of[i]]
                                                                   : nullptr,
                list_of[i]};
  }
  // Host items' pins in one arena for the batch (a walk pins at most min(chunks, 4096) entries
  // per slot: pin_prefix's reserve); device items' pins go with their launch, so on the
  // heap. Declared before the walks: it outlives their pins.
  size_t pin_bytes = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].out.device != Device::kCuda) {
      pin_bytes +=
          std::min<size_t>(lists[list_of[i]].chunks.size(), 4096) * sizeof(detail::EntryRef);
    }
  }
  std::pmr::monotonic_buffer_resource arena(pin_bytes + 64, heap_resource());
  std::vector<Walk> walks;
  walks.reserve(items.size());
  for (const RetrieveItem& item : items) {
    walks.emplace_back(item.out.device == Device::kCuda ? heap_resource() : &arena);
  }
  std::vector<int64_t> rows(items.size());
  retrieve_reads(reads, walks, rows, /*name_items=*/true);
  return rows;
}

}  // namespace hss::detail
