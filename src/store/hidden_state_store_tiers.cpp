// The store's read side of the backing tiers (tiers/tier_chain.hpp): read-through before a
// retrieve's walk, and coverage counting the values a tier holds. (Write-behind is one call at
// the end of the store path.) Nothing here knows which tiers there are.
//
// Locks: the index mutex is never held across a fetch. Values arrive in a tier's callback,
// possibly under that tier's own read lock (the Redis tier's per-server lock); inserting one
// takes the index mutex briefly (lock order: a tier's read lock, then the index mutex, then the
// pool's free-stack mutex).

#include <algorithm>
#include <string>

#include "store/tier_read_through.hpp"
#include "base/nvtx.hpp"
#include "format/dtype_codes.hpp"
#include "index/entry_bytes.hpp"

namespace hss::detail {

namespace {

// A tier checks what it returns (tiers/backing_tier.hpp); the store still takes only a value of
// the chunk's rows, in a row format with a wire code, whose payload is exactly rows x cols in
// that format, so that no tier's slip becomes an exception out of a retrieve or rows served
// short. An FP8 value keeps its format (codes and scales as the writer's pool held them), so a
// retrieve dequantises it exactly as it would the same entry never spilled, on the host path and
// in the CUDA kernels alike.
bool fits(const detail::TierValue& value, const Chunk& chunk) noexcept {
  if (!detail::wire_code(value.format)) return false;
  if (value.rows != chunk.size() || value.cols <= 0) return false;
  const auto bytes = value.format.checked_payload_bytes(value.rows, value.cols);
  return bytes && *bytes == value.payload.size();
}

}  // namespace

size_t TierReadThrough::read_through(std::span<const Chunk> chunks,
                                            std::span<const Slot> slots,
                                            detail::KvAnswers* kv_answers,
                                            std::span<const int64_t> widths) {
  if (store_.tiers.empty() || chunks.empty()) return 0;
  HSS_RANGE("retrieve/read_through");
  struct Missing {
    size_t chunk;
    Slot slot;
    size_t slot_index;
  };
  std::vector<Missing> missing;
  // Each slot's width, so that a tier reads no value larger than one of this shape can be (its
  // read-size guard; 0 would let a disk tier read a file of any size): the caller's output's,
  // else that of an entry of the slot this prefix holds, else unknown (0: any width, the pool's
  // bytes still bound the read: below).
  std::vector<int64_t> cols(slots.size(), 0);
  for (size_t s = 0; s < slots.size() && s < widths.size(); ++s) cols[s] = widths[s];
  size_t from = chunks.size();  // where the walk would stop locally
  uint64_t guard = 0;
  {
    const auto lock = store_.lock_index();
    store_.check_open(lock);
    guard = store_.new_guard(lock);  // this prefix's keys are off limits to its own inserts' evictions
    for (size_t i = 0; i < chunks.size(); ++i) {
      detail::KeyRecord* record = store_.find_record(lock, chunks[i].key);
      if (record != nullptr) record->guard = guard;
      for (size_t s = 0; s < slots.size(); ++s) {
        const Slot& slot = slots[s];
        if (record != nullptr && cols[s] == 0) {
          const detail::EntryRef* held = record->find(slot);
          if (held != nullptr && (*held)->ready()) cols[s] = (*held)->cols;
        }
        if (record != nullptr && record->holds_ready(slot, chunks[i].size())) continue;
        from = std::min(from, i);
        if (store_.config.slot_allowed(slot.kind, slot.layer_idx)) missing.push_back({i, slot, s});
      }
    }
  }
  if (missing.empty() || missing.front().chunk != from) return 0;  // nothing to extend with
  // Only chunks whose KV is present can extend the prefix (KV presence decides, per chunk).
  const size_t end = store_.kv_prefix_end(chunks, from, kv_answers);
  std::erase_if(missing, [&](const Missing& m) { return m.chunk >= end; });
  if (missing.empty()) return 0;

  // A slot of unknown width (an allocating retrieve, nothing of the slot held) is still bounded:
  // no value larger than the pool, which could never hold it, is read.
  const uint64_t pool_bytes = store_.pool().capacity_bytes();
  std::vector<detail::TierRequest> requests;
  requests.reserve(missing.size());
  for (const Missing& m : missing) {
    const Chunk& chunk = chunks[m.chunk];
    requests.push_back({chunk.key, m.slot, chunk.size(), cols[m.slot_index], pool_bytes});
  }
  // Each value goes into the pool as it arrives (no value is held longer than its copy). A value
  // past a chunk missing elsewhere is kept too: the walk, not the fetch, ends the prefix.
  return store_.tiers.fetch_each(requests, [&](size_t i, const detail::TierValue& value) {
    return fits(value, chunks[missing[i].chunk]) &&
           insert_fetched(chunks[missing[i].chunk], missing[i].slot, value, guard) ==
               InsertResult::kInserted;
  });
}

TierReadThrough::InsertResult TierReadThrough::insert_fetched(
    const Chunk& chunk, Slot slot, const detail::TierValue& value, uint64_t guard) {
  auto entry = store_.new_entry(value.rows, value.cols, value.format, slot);
  {
    const auto lock = store_.lock_index();
    if (store_.is_closed(lock)) return InsertResult::kNoRoom;
    const detail::KeyRecord* record = store_.index(lock).find(chunk.key);
    if (record != nullptr && record->find(slot) != nullptr) return InsertResult::kPresent;
    // PENDING: invisible and not evictable while its bytes are copied in below.
    if (!store_.reserve_entry(lock, chunk.key, entry, guard, nullptr)) return InsertResult::kNoRoom;
  }
  detail::fill_entry(*entry, store_.pool(), value.payload);  // no lock: a copy
  const auto lock = store_.lock_index();
  (void)store_.commit_entry(lock, chunk.key, *entry);  // unless dropped meanwhile (close, drop_key)
  return InsertResult::kInserted;
}

int64_t TierReadThrough::coverage_with_tiers(std::span<const Chunk> chunks,
                                             std::span<const Slot> slots, int64_t local) const {
  return coverage_walk(chunks, slots, local, nullptr);
}

TierCoverage TierReadThrough::coverage_by_tier(std::span<const Chunk> chunks,
                                               std::span<const Slot> slots, int64_t local) const {
  TierCoverage out;
  out.tokens = coverage_walk(chunks, slots, local, &out.chunk_tiers);
  return out;
}

void TierReadThrough::name_device_chunks(std::span<const Chunk> chunks,
                                         std::span<const Slot> slots,
                                         std::vector<std::string>& chunk_tiers) const {
  // "device" where every slot of the chunk has a device copy (a device restore there reads no
  // pool byte of it).
  const auto lock = store_.lock_index();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const detail::KeyRecord* record = store_.index(lock).find(chunks[i].key);
    if (record == nullptr) continue;
    const bool resident = std::all_of(slots.begin(), slots.end(), [&](const Slot& slot) {
      const EntryRef* entry = record->find(slot);
      return entry != nullptr && (*entry)->device_copy && !(*entry)->device_copy->copy_failed();
    });
    if (resident) chunk_tiers[i] = "device";
  }
}

int64_t TierReadThrough::coverage_walk(std::span<const Chunk> chunks, std::span<const Slot> slots,
                                       int64_t local,
                                       std::vector<std::string>* chunk_tiers) const {
  size_t from = 0;  // the pool's prefix: every slot local
  while (from < chunks.size() && chunks[from].end <= local) ++from;
  if (chunk_tiers != nullptr) {
    chunk_tiers->assign(from, "host");
    if (store_.has_device_tier()) name_device_chunks(chunks.first(from), slots, *chunk_tiers);
  }
  if (store_.tiers.empty()) return local;
  const size_t end = store_.kv_prefix_end(chunks, from);
  std::vector<detail::TierRequest> requests;
  std::vector<size_t> chunk_of;
  {
    const auto lock = store_.lock_index();
    for (size_t i = from; i < end; ++i) {
      const detail::KeyRecord* record = store_.index(lock).find(chunks[i].key);
      for (const Slot& slot : slots) {
        if (record != nullptr && record->holds_ready(slot, chunks[i].size())) continue;
        requests.push_back({chunks[i].key, slot, chunks[i].size(), 0});
        chunk_of.push_back(i);
      }
    }
  }
  const std::vector<int32_t> where = store_.tiers.locate(requests);
  // Per chunk past the pool's prefix: the last tier any of its slots is read from (-1: all
  // local; kept only when names are asked for); the prefix ends at the first (chunk, slot) no
  // tier holds, or at KV's end.
  std::vector<int32_t> slowest(chunk_tiers != nullptr ? end - from : 0, -1);
  size_t stop = end;
  for (size_t r = 0; r < requests.size(); ++r) {
    if (where[r] == TierChain::kNotHeld) {
      stop = chunk_of[r];
      break;
    }
    if (chunk_tiers == nullptr) continue;
    int32_t& s = slowest[chunk_of[r] - from];
    s = std::max(s, where[r]);
  }
  if (chunk_tiers != nullptr) {
    for (size_t i = from; i < stop; ++i) {
      const int32_t t = slowest[i - from];
      chunk_tiers->emplace_back(
          t < 0 ? std::string("host")
                : std::string(store_.tiers.tier(static_cast<size_t>(t)).name()));
    }
  }
  return stop == 0 ? 0 : std::max(local, chunks[stop - 1].end);
}

}  // namespace hss::detail
