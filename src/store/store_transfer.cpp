// The store's side of the pool transfer (hss/pool_transfer.hpp): exports under a lease, imports
// into reserved PENDING entries, checked before they are published.
//
// Locks: the index mutex for index updates only (as everywhere); hashing, MACs and the lease
// table's mutex are never under it.

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>

#include "index/entry_bytes.hpp"

#include "hss/detail/checked.hpp"
#include "hss/error.hpp"
#include "base/nvtx.hpp"
#include "store/import_state.hpp"
#include "store/store_transfer.hpp"
#include "format/value_codec.hpp"
#include "store/store_validation.hpp"

namespace hss::detail {


namespace {

constexpr std::chrono::milliseconds kMaxLease{3600000};
// A source entry of more extents than this is malformed (a 64-byte granule pool of 4 GiB would
// need 2^26; a real producer merges adjacent granules into one extent).
constexpr size_t kMaxExtentsPerEntry = size_t{1} << 26;

// The entry's granules as absolute extents, adjacent ones merged.
std::vector<Extent> entry_extents(const detail::Entry& entry, const detail::BlockPool& pool) {
  std::vector<Extent> extents;
  uint64_t left = entry.payload_bytes();
  for (const uint32_t id : entry.blocks) {
    if (left == 0) break;
    const uint64_t n = std::min(left, pool.granule_bytes());
    const auto addr = reinterpret_cast<uint64_t>(pool.block_address(id));
    if (!extents.empty() && extents.back().addr + extents.back().bytes == addr) {
      extents.back().bytes += n;
    } else {
      extents.push_back({addr, n});
    }
    left -= n;
  }
  return extents;
}

std::string entry_name(const CacheEngineKey& key, Slot slot) {
  return detail::remote_key(key, to_string(slot.kind), slot.layer_idx);
}

// The index of a key or slot named twice, if any (sorted, not hashed: the keys come from a
// peer, who could choose chunk hashes that collide in a hash set).
std::optional<size_t> first_repeated_key(std::span<const Chunk> chunks) {
  std::vector<size_t> order(chunks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto tie = [&](size_t i) {
    const CacheEngineKey& k = chunks[i].key;
    return std::tie(k.chunk_hash, k.worker_id, k.world_size, k.fmt, k.model_name, k.kv_dtype);
  };
  std::ranges::sort(order, [&](size_t a, size_t b) { return tie(a) < tie(b); });
  for (size_t i = 1; i < order.size(); ++i) {
    if (chunks[order[i - 1]].key == chunks[order[i]].key) return std::max(order[i - 1], order[i]);
  }
  return std::nullopt;
}

std::optional<size_t> first_repeated_slot(std::span<const Slot> slots) {
  std::vector<std::pair<int, int64_t>> sorted;
  sorted.reserve(slots.size());
  for (const Slot& s : slots) sorted.emplace_back(static_cast<int>(s.kind), s.layer_idx);
  std::ranges::sort(sorted);
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1] == sorted[i]) {
      for (size_t j = 0; j < slots.size(); ++j) {
        if (static_cast<int>(slots[j].kind) == sorted[i].first && slots[j].layer_idx == sorted[i].second) {
          return j;
        }
      }
    }
  }
  return std::nullopt;
}

}  // namespace

void StoreTransfer::refuse_export(const std::string& why, bool bad_request) const {
  store_.transfer_counters.refused_exports.fetch_add(1, std::memory_order_relaxed);
  if (bad_request) throw InvalidArgument(why);
  throw Error("export refused: " + why);
}

std::vector<MemoryRegion> StoreTransfer::memory_regions() const {
  return {
      {reinterpret_cast<uint64_t>(store_.pool().block_address(0)), store_.pool().capacity_bytes(), store_.pool().pinned()}};
}

ChunkExport StoreTransfer::export_chunks(std::span<const Chunk> chunks,
                                                  std::span<const Slot> slots, size_t first_chunk,
                                                  std::chrono::milliseconds lease) {
  HSS_RANGE("transfer/export");
  store_.check_chunks(chunks);
  detail::check_slots(slots);
  if (first_chunk > chunks.size()) {
    throw InvalidArgument("first_chunk = " + std::to_string(first_chunk) + " is past the " +
                          std::to_string(chunks.size()) + " chunks");
  }
  if (lease.count() < 1 || lease > kMaxLease) {
    throw InvalidArgument("lease = " + std::to_string(lease.count()) +
                          " ms must be in [1, 3600000]");
  }
  if (chunks.size() > UINT32_MAX) throw InvalidArgument("more than 2^32 chunks");
  // A peer's request costs the walk (pins under the index mutex) and the export: bounded by the
  // config, and every key and slot leased once.
  const auto max_chunks = static_cast<size_t>(store_.config.hidden_state_transfer_max_chunks);
  if (chunks.size() > max_chunks) {
    refuse_export("chunks: " + std::to_string(chunks.size()) +
                      " chunks is over hidden_state_transfer_max_chunks = " +
                      std::to_string(max_chunks), true);
  }
  if (const auto i = first_repeated_key(chunks)) {
    refuse_export("chunks[" + std::to_string(*i) + "] repeats the key of an earlier chunk", true);
  }
  if (const auto j = first_repeated_slot(slots)) {
    refuse_export("slots[" + std::to_string(*j) + "] repeats an earlier slot", true);
  }
  store_.expire_leases();
  ReadPipeline::Walk w = read_.plan_walk(chunks, slots, ReadPipeline::PendingCopies::kWaitOnHost);
  {
    const auto lock = store_.lock_index();
    store_.end_walk(lock, w);  // drops an orphan (KV gone here), touches the prefix; no retrieve
  }
  read_.discard_orphan(w);
  ChunkExport out;
  out.prefix_tokens = w.prefix_tokens;
  out.lease_ms = static_cast<uint32_t>(lease.count());
  const auto hits = static_cast<size_t>(w.hits);
  if (hits <= first_chunk) return out;
  out.first_chunk = static_cast<uint32_t>(first_chunk);
  out.chunks = static_cast<uint32_t>(hits - first_chunk);
  std::vector<EntryRef> pins;
  pins.reserve((hits - first_chunk) * slots.size());
  out.entries.reserve(pins.capacity());
  uint64_t bytes = 0;
  for (size_t c = first_chunk; c < hits; ++c) {
    for (size_t s = 0; s < slots.size(); ++s) {
      const EntryRef& entry = w.pinned[c * slots.size() + s];
      // Computed once per entry: its bytes never change while it is READY (or leased).
      std::call_once(entry->digest_once, [&] {
        const auto pieces = detail::entry_pieces(*entry, store_.pool());
        entry->digest.hash = detail::hash_pieces(pieces);
        if (store_.mac) {
          detail::RemoteHeader header{entry->format, entry->rows, entry->cols,
                                      entry->digest.hash, detail::kRemoteFlagMac};
          std::array<std::byte, kEntryHeaderBytes> header_bytes{};
          detail::encode_remote_header(header, header_bytes);
          entry->digest.mac =
              store_.mac->compute(entry_name(chunks[c].key, slots[s]), header_bytes, pieces);
        }
      });
      ExportedEntry e;
      e.chunk = static_cast<uint32_t>(c);
      e.slot = slots[s];
      const detail::RemoteHeader header{entry->format, entry->rows, entry->cols,
                                        entry->digest.hash,
                                        entry->digest.mac ? detail::kRemoteFlagMac : uint8_t{0}};
      detail::encode_remote_header(header, e.header);
      e.mac = entry->digest.mac;
      e.extents = entry_extents(*entry, store_.pool());
      bytes += entry->payload_bytes();
      out.entries.push_back(std::move(e));
      pins.push_back(entry);
    }
  }
  const size_t entries = pins.size();
  const auto max_bytes = static_cast<uint64_t>(store_.config.hidden_state_transfer_max_lease_bytes);
  if (bytes > max_bytes) {
    refuse_export("the export's " + std::to_string(bytes) +
                      " payload bytes are over hidden_state_transfer_max_lease_bytes = " +
                      std::to_string(max_bytes), false);
  }
  out.lease_id = store_.leases.add(std::move(pins), bytes, detail::LeaseTable::Clock::now() + lease);
  if (out.lease_id == 0) {
    refuse_export("the producer holds hidden_state_transfer_max_leases leases or "
                  "_max_leased_bytes bytes already", false);
  }
  store_.transfer_counters.exports.fetch_add(1, std::memory_order_relaxed);
  store_.transfer_counters.exported_entries.fetch_add(entries, std::memory_order_relaxed);
  store_.transfer_counters.exported_bytes.fetch_add(bytes, std::memory_order_relaxed);
  return out;
}

bool StoreTransfer::release_lease(uint64_t lease_id) noexcept {
  return store_.leases.release(lease_id, detail::LeaseTable::Clock::now());
}

std::pair<size_t, size_t> StoreTransfer::missing_range(std::span<const Chunk> chunks,
                                                                std::span<const Slot> slots) const {
  store_.check_chunks(chunks);
  detail::check_slots(slots);
  size_t from = chunks.size();
  {
    const auto lock = store_.lock_index();
    store_.check_open(lock);
    for (size_t i = 0; i < chunks.size() && from == chunks.size(); ++i) {
      const detail::KeyRecord* record = store_.index(lock).find(chunks[i].key);
      for (const Slot& slot : slots) {
        if (record == nullptr || !record->holds_ready(slot, chunks[i].size())) {
          from = i;
          break;
        }
      }
    }
  }
  return {from, from == chunks.size() ? from : store_.kv_prefix_end(chunks, from)};
}

void StoreTransfer::reserve_import(std::span<const Chunk> chunks,
                                            const ChunkExport& source, Reservation::State& state) {
  HSS_RANGE("transfer/reserve");
  store_.check_chunks(chunks);
  // Everything about the source is checked before anything changes: it comes from a peer.
  std::vector<Reservation::State::Item> items;
  items.reserve(source.entries.size());
  size_t last_chunk = 0;
  for (size_t j = 0; j < source.entries.size(); ++j) {
    const ExportedEntry& e = source.entries[j];
    const std::string where = "source.entries[" + std::to_string(j) + "]";
    if (e.chunk >= chunks.size() || e.chunk < last_chunk) {
      throw InvalidArgument(where + ".chunk = " + std::to_string(e.chunk) +
                            " is out of order or past the " + std::to_string(chunks.size()) +
                            " chunks");
    }
    last_chunk = e.chunk;
    if (!is_valid(e.slot.kind)) {
      throw InvalidArgument(where + ".slot.kind has an unknown value " +
                            std::to_string(static_cast<int>(e.slot.kind)));
    }
    const auto header = detail::decode_remote_header(e.header);
    if (!header) throw InvalidArgument(where + ".header is not a valid value header");
    const Chunk& chunk = chunks[e.chunk];
    if (header->rows != chunk.size() || header->cols > detail::kMaxCols) {
      throw InvalidArgument(where + " has " + std::to_string(header->rows) + " x " +
                            std::to_string(header->cols) + " rows x cols for a chunk of " +
                            std::to_string(chunk.size()) + " tokens");
    }
    const uint64_t payload =
        detail::remote_payload_bytes(header->format, header->rows, header->cols);
    uint64_t given = 0;
    if (e.extents.size() > kMaxExtentsPerEntry)
      throw InvalidArgument(where + " has too many extents");
    for (const Extent& x : e.extents) {
      if (x.bytes == 0 || x.bytes > payload - given) {
        throw InvalidArgument(where + ".extents do not add up to its " + std::to_string(payload) +
                              " payload bytes");
      }
      given += x.bytes;
    }
    if (given != payload) {
      throw InvalidArgument(where + ".extents hold " + std::to_string(given) + " bytes, the " +
                            "header needs " + std::to_string(payload));
    }
    Reservation::State::Item item;
    item.chunk = e.chunk;
    item.header = *header;
    item.header_bytes = e.header;
    item.mac = e.mac;
    // The entry keeps the producer's row format (FP8: its codes and scales, bit for bit).
    // Capacity only: granules are granted under the lock (an Entry releases what `blocks` holds).
    item.entry = store_.new_entry(header->rows, header->cols, header->format, e.slot);
    items.push_back(std::move(item));
  }
  state.chunks.assign(chunks.begin(), chunks.end());
  state.items.reserve(items.size());
  state.reserved.reserve(items.size());
  std::vector<bool> skipped(items.size(), false);  // held already, or being written elsewhere
  store_.reclaim_device_resources();
  store_.expire_leases();

  size_t granted = 0;
  {
    const auto lock = store_.lock_index();
    store_.check_open(lock);
    const uint64_t guard = store_.new_guard(lock);  // the keys of this chunk list are off limits
    store_.guard_keys(lock, chunks, guard);
    try {
      for (; granted < items.size(); ++granted) {
        Reservation::State::Item& item = items[granted];
        const Chunk& chunk = chunks[item.chunk];
        const detail::Entry& entry = *item.entry;
        const detail::KeyRecord* record = store_.index(lock).find(chunk.key);
        const detail::Entry* replaces = nullptr;  // the slot's entry of another shape
        if (const EntryRef* held = record ? record->find(entry.slot) : nullptr) {
          if (!(*held)->ready() || ((*held)->rows == entry.rows && (*held)->cols == entry.cols &&
                                    (*held)->format == entry.format)) {
            skipped[granted] = true;  // present, or being written by another call
            continue;
          }
          replaces = held->get();
        }
        // The key's guard keeps it (and so `replaces`) out of the grant's evictions.
        if (!store_.reserve_entry(lock, chunk.key, item.entry, guard, replaces)) {
          break;  // prefix-strict: nothing after the first miss
        }
      }
    } catch (...) {
      for (size_t i = 0; i < granted; ++i) {
        if (!skipped[i]) store_.abort_entry(lock, chunks[items[i].chunk].key, *items[i].entry);
      }
      throw;
    }
  }
  // Chunks fully reserved or present, from the first chunk of the source on (items are in chunk
  // order and granting stops at the first that did not fit).
  if (!items.empty()) {
    const size_t end = granted == items.size() ? items.back().chunk + 1 : items[granted].chunk;
    state.chunks_covered = end - items.front().chunk;
  }
  for (size_t i = 0; i < granted; ++i) {
    if (skipped[i]) continue;
    state.reserved.push_back({i, entry_extents(*items[i].entry, store_.pool())});
    state.items.push_back(std::move(items[i]));
  }
  // `reserved[k].source_entry` names the source entry: item i is source entry i.
  store_.transfer_counters.reserved.fetch_add(state.items.size(), std::memory_order_relaxed);
}

size_t StoreTransfer::check_import(Reservation::State& state, size_t first,
                                            size_t count) const {
  using Check = Reservation::State::Item::Check;
  size_t failed = 0;
  for (size_t i = first; i < first + count; ++i) {
    Reservation::State::Item& item = state.items[i];
    const auto pieces = detail::entry_pieces(*item.entry, store_.pool());
    item.check = detail::hash_pieces(pieces) == item.header.payload_hash ? Check::kPass
                                                                         : Check::kBadChecksum;
    if (item.check == Check::kPass && store_.mac) {
      // This store trusts only what a holder of its key exported.
      const bool ok = item.mac && (item.header.flags & detail::kRemoteFlagMac) != 0 &&
                      store_.mac->verify(entry_name(state.chunks[item.chunk].key, item.entry->slot),
                                   item.header_bytes, pieces, *item.mac);
      if (!ok) item.check = Check::kUnauthenticated;
    }
    failed += item.check == Check::kPass ? 0 : 1;
  }
  return failed;
}

ImportResult StoreTransfer::publish_import(Reservation::State& state) {
  HSS_RANGE("transfer/publish");
  using Check = Reservation::State::Item::Check;
  ImportResult result;
  for (size_t i = 0; i < state.items.size(); ++i) {
    if (state.items[i].check == Check::kUnchecked) (void)check_import(state, i, 1);
  }
  std::vector<uint8_t> pass(state.items.size(), 0);
  std::vector<uint8_t> unauthenticated(state.items.size(), 0);
  for (size_t i = 0; i < state.items.size(); ++i) {
    pass[i] = state.items[i].check == Check::kPass ? 1 : 0;
    unauthenticated[i] = state.items[i].check == Check::kUnauthenticated ? 1 : 0;
  }
  {
    const auto lock = store_.lock_index();
    for (size_t i = 0; i < state.items.size(); ++i) {
      Reservation::State::Item& item = state.items[i];
      const CacheEngineKey& key = state.chunks[item.chunk].key;
      // An entry dropped meanwhile (close, drop_key) is DETACHED: neither published nor counted.
      if (pass[i] != 0) {
        if (store_.commit_entry(lock, key, *item.entry)) {
          ++result.published;
          result.bytes += item.entry->payload_bytes();
        }
      } else {
        store_.abort_entry(lock, key, *item.entry);
      }
    }
  }
  for (size_t i = 0; i < pass.size(); ++i) {
    result.rejected += pass[i] == 0 ? 1 : 0;
    result.unauthenticated += unauthenticated[i];
  }
  store_.transfer_counters.imported.fetch_add(result.published, std::memory_order_relaxed);
  store_.transfer_counters.imported_bytes.fetch_add(result.bytes, std::memory_order_relaxed);
  store_.transfer_counters.rejected.fetch_add(result.rejected, std::memory_order_relaxed);
  store_.transfer_counters.unauthenticated.fetch_add(result.unauthenticated, std::memory_order_relaxed);
  state.items.clear();
  state.reserved.clear();
  return result;
}

std::optional<std::array<std::byte, kEntryMacBytes>> StoreTransfer::handshake_tag(
    std::string_view label, std::span<const std::byte> transcript) const {
  if (!store_.mac) return std::nullopt;
  if (label.empty() || label.size() > 64) {
    throw InvalidArgument("label: " + std::to_string(label.size()) +
                          " bytes; a handshake label is 1..64 bytes");
  }
  // The name's prefix is never a value's ("hss:v1:<key>:..."): a tag is no value MAC, and the
  // label keeps the two sides' tags apart (one cannot be replayed as the other).
  const std::span<const std::byte> pieces[] = {transcript};
  return store_.mac->compute("hss:peer-auth:v1:" + std::string(label), {}, pieces);
}

void StoreTransfer::abandon_import(Reservation::State& state) noexcept {
  if (state.items.empty()) return;
  {
    const auto lock = store_.lock_index();
    for (const Reservation::State::Item& item : state.items) {
      store_.abort_entry(lock, state.chunks[item.chunk].key, *item.entry);
    }
  }
  store_.transfer_counters.abandoned.fetch_add(state.items.size(), std::memory_order_relaxed);
  state.items.clear();  // the granules return to the pool with the last reference
  state.reserved.clear();
}

}  // namespace hss::detail
