#include "hss/hidden_state_store.hpp"

#include <algorithm>
#include <string>
#include <unordered_set>

#include "base/log.hpp"
#include "datapath/cuda_runtime.hpp"
#include "hss/detail/host_buffer.hpp"
#include "hss/error.hpp"
#include "store/backing_tiers.hpp"
#include "store/hidden_state_store_impl.hpp"
#include "store/store_validation.hpp"

namespace hss {

using detail::EntryRef;


HiddenStateStore::Impl::Impl(const Config& config, const TokenDatabase& token_database)
    : state(config, token_database) {}

HiddenStateStore::Impl::~Impl() {
  try {
    close();
  } catch (...) {  // a destructor must not throw; close() only fails on a broken device
  }
}

size_t HiddenStateStore::Impl::num_cached_chunks() const {
  const auto lock = state.lock_index();
  return state.index(lock).ready_keys();
}

size_t HiddenStateStore::Impl::num_entries() const {
  const auto lock = state.lock_index();
  return state.index(lock).ready_entries();
}

bool HiddenStateStore::Impl::has_chunk(const CacheEngineKey& key, Slot slot) const {
  if (!is_valid(slot.kind)) {
    throw InvalidArgument("kind has an unknown value " +
                          std::to_string(static_cast<int>(slot.kind)));
  }
  const auto lock = state.lock_index();
  const detail::KeyRecord* record = state.index(lock).find(key);
  if (record == nullptr) return false;
  const EntryRef* entry = record->find(slot);
  // A failed device copy (the cached flag) is as good as absent: its rows never land.
  return entry != nullptr && (*entry)->ready() && !(*entry)->copy_failed();
}

bool HiddenStateStore::Impl::drop_key(const CacheEngineKey& key) {
  const auto lock = state.lock_index();
  state.check_open(lock);
  return state.drop_key(lock, key);
}

std::vector<CacheEngineKey> HiddenStateStore::Impl::lru_keys() const {
  std::vector<CacheEngineKey> keys;
  const auto lock = state.lock_index();
  keys.reserve(state.index(lock).keys());
  state.index(lock).for_each_lru(
      [&](const CacheEngineKey& key, const detail::KeyRecord&) { keys.push_back(key); });
  return keys;
}

bool HiddenStateStore::Impl::evict_one_lru() {
  const auto lock = state.lock_index();
  state.check_open(lock);
  return state.evict_for_space(lock, /*guard=*/0, /*freeable_only=*/false);
}

void HiddenStateStore::Impl::flush() {
  if (state.device_path) {
    state.device_path->flush();
    state.reclaim_device_resources();
  }
  state.tiers.flush();
}

void HiddenStateStore::Impl::close() {
  {
    const auto lock = state.lock_index();
    if (state.is_closed(lock)) return;
    // Under the lock: a store that already passed its checks either published before this point
    // or finds the store closed when it publishes (its entries then stay detached).
    state.mark_closed(lock);
  }
  flush();
  state.tiers.close();   // the tiers take no more writes (a closed store stores nothing anyway)
  state.leases.clear();  // a closed store exports nothing: its consumers' releases answer false
  const auto lock = state.lock_index();
  state.drop_all(lock);
}

void HiddenStateStore::Impl::check_invariants() const {
  auto fail = [](const std::string& what) { throw Error("check_invariants: " + what); };
  std::vector<uint32_t> free_ids;
  const auto lock = state.lock_index();
  // The free list under the index lock (lock order index -> pool): every grant happens under
  // it, so no granule granted since the snapshot shows up as both free and held. Releases may
  // still come (a detached entry's last reader), but only of granules the index no longer holds.
  state.pool().free_ids(free_ids);
  std::vector<uint8_t> owner(state.pool().num_blocks(), 0);
  for (uint32_t id : free_ids) {
    if (id >= owner.size()) fail("free granule id " + std::to_string(id) + " out of range");
    if (owner[id]++ != 0) fail("granule " + std::to_string(id) + " is on the free list twice");
  }
  uint64_t ready = 0, bytes = 0, blocks = 0, lru_count = 0, ready_keys = 0;
  std::array<detail::StoreIndex::KindTotals, kNumActivationKinds> kinds{};
  uint64_t entries = 0;
  state.index(lock).for_each_lru([&](const CacheEngineKey& key, const detail::KeyRecord& record) {
    ++lru_count;
    entries += record.slots.size();
    if (record.key != &key) fail("LRU record of key " + key.to_string() + " points elsewhere");
    if ((record.lru_next != nullptr && record.lru_next->lru_prev != &record) ||
        (record.lru_prev != nullptr && record.lru_prev->lru_next != &record)) {
      fail("LRU links of key " + key.to_string() + " disagree");
    }
    if (record.slots.empty()) fail("key " + key.to_string() + " has no slots");
    const auto ready_slots = std::count_if(record.slots.begin(), record.slots.end(),
                                           [](const EntryRef& e) { return e->ready(); });
    if (static_cast<uint32_t>(ready_slots) != record.ready_slots) {
      fail("key " + key.to_string() + " counts its READY slots wrong");
    }
    ready_keys += ready_slots > 0 ? 1 : 0;
    for (size_t i = 0; i < record.slots.size(); ++i) {
      const detail::Entry& e = *record.slots[i];
      for (size_t j = 0; j < i; ++j) {
        if (record.slots[j]->slot == e.slot) fail("key " + key.to_string() + " has a slot twice");
      }
      if (e.blocks.size() != state.pool().blocks_for(e.payload_bytes())) {
        fail("entry of key " + key.to_string() + " holds " + std::to_string(e.blocks.size()) +
             " granules for " + std::to_string(e.payload_bytes()) + " bytes");
      }
      for (uint32_t id : e.blocks) {
        if (id >= owner.size() || owner[id]++ != 0) {
          fail("granule " + std::to_string(id) + " is held twice or also free");
        }
      }
      if (e.ready()) {
        ++ready;
        bytes += e.payload_bytes();
        blocks += e.blocks.size();
        ++kinds[static_cast<size_t>(e.slot.kind)].entries;
        kinds[static_cast<size_t>(e.slot.kind)].bytes += e.payload_bytes();
      }
    }
  });
  if (lru_count != state.index(lock).keys())
    fail("LRU list and map disagree on the number of keys");
  if (lru_count != state.index(lock).lru_size()) fail("LRU list and its length disagree");
  // Every entry of the index lives in a node of the entry pool (entry_pool.hpp).
  if (entries > state.entry_nodes_in_use()) {
    fail(std::to_string(entries) + " entries in the index but " +
         std::to_string(state.entry_nodes_in_use()) + " entry nodes in use");
  }
  if (ready_keys != state.index(lock).ready_keys())
    fail("count of cached keys disagrees with the index");
  if (ready != state.index(lock).ready_entries() || bytes != state.index(lock).bytes_held() ||
      blocks != state.index(lock).blocks_held()) {
    fail("accounting of READY entries disagrees with the index");
  }
  for (size_t k = 0; k < kinds.size(); ++k) {
    const auto& totals = state.index(lock).kind_totals(static_cast<ActivationKind>(k));
    if (kinds[k].entries != totals.entries || kinds[k].bytes != totals.bytes) {
      fail("per-kind accounting of " + std::string(to_string(static_cast<ActivationKind>(k))) +
           " disagrees");
    }
  }
}

HiddenStateStats HiddenStateStore::Impl::stats() const {
  HiddenStateStats s;
  {
    const auto lock = state.lock_index();
    s.entries_held = state.index(lock).ready_entries();
    s.keys_held = state.index(lock).ready_keys();
    s.bytes_held = state.index(lock).bytes_held();
    s.blocks_held = state.index(lock).blocks_held();
    s.closed = state.is_closed(lock);
    for (size_t k = 0; k < s.per_kind.size(); ++k) {
      const auto& totals = state.index(lock).kind_totals(static_cast<ActivationKind>(k));
      s.per_kind[k].entries_held = totals.entries;
      s.per_kind[k].bytes_held = totals.bytes;
    }
  }
  s.pool_capacity_bytes = state.pool().capacity_bytes();
  s.pool_free_bytes = state.pool().free_blocks() * state.pool().granule_bytes();
  s.granule_bytes = state.pool().granule_bytes();
  s.pinned = state.pool().pinned();
  s.device_path = state.device_path != nullptr;
  s.stores = state.counters.stores.load();
  s.chunks_written = state.counters.chunks_written.load();
  s.retrieves = state.counters.retrieves.load();
  s.hit_tokens = state.counters.hit_tokens.load();
  s.miss_tokens = state.counters.miss_tokens.load();
  s.hs_evictions = state.counters.hs_evictions.load();
  s.coupled_evictions = state.counters.coupled_evictions.load();
  s.allocation_failures = state.counters.allocation_failures.load();
  s.copy_failures = state.counters.copy_failures.load();
  s.staging_waits = state.device_path ? state.device_path->staging_waits() : 0;
  s.device_launches = state.device_path ? state.device_path->launches() : 0;
  s.launch_waits = state.device_path ? state.device_path->launch_waits() : 0;
  for (size_t k = 0; k < s.per_kind.size(); ++k) {
    s.per_kind[k].chunks_written = state.counters.kind_chunks_written[k].load();
  }
  detail::add_tier_views(state.tiers, s);
  s.tiers = state.tiers.stats();
  // The device-resident tier is asked first (a device restore on its device reads it first).
  if (auto device_row = state.device_tier_stats()) s.tiers.insert(s.tiers.begin(), *device_row);
  s.host_copy = state.host_copy.info;
  s.host_copy.copy_threads = state.copy_threads.threads;
  s.host_copy.copy_threads_auto = state.copy_threads.automatic;
  s.host_copy.copy_threads_reason = state.copy_threads.reason;
  s.host_copy.copy_workers_started = state.copy_workers ? state.copy_workers->started() : 0;
  s.host_copy.min_bytes_per_copy_thread = state.host_copy_context().min_split_bytes;
  s.host_copy.split_copies = state.copy_workers ? state.copy_workers->split_runs() : 0;
  const detail::LeaseTable::Counts leases = state.leases.counts();
  const detail::StoreState::TransferCounters& t = state.transfer_counters;
  s.transfer = {t.exports.load(),
                t.exported_entries.load(),
                t.exported_bytes.load(),
                leases.held,
                leases.bytes,
                leases.released,
                leases.expired,
                t.refused_exports.load(),
                t.reserved.load(),
                t.imported.load(),
                t.imported_bytes.load(),
                t.rejected.load(),
                t.unauthenticated.load(),
                t.abandoned.load()};
  return s;
}

// ---------------------------------------------------------------------------------------------
// public surface

namespace {
constexpr Slot hidden_slot(int64_t layer) { return {ActivationKind::kHidden, layer}; }

std::vector<Slot> hidden_slots(std::span<const int64_t> layers) {
  std::vector<Slot> slots;
  slots.reserve(layers.size());
  for (int64_t layer : layers) slots.push_back(hidden_slot(layer));
  return slots;
}

std::optional<HostTensor> first_or_none(std::vector<HostTensor> tensors) {
  if (tensors.empty()) return std::nullopt;
  return std::move(tensors.front());
}
}  // namespace

HiddenStateStore::HiddenStateStore(const Config& config, const TokenDatabase& token_database)
    : impl_(std::make_unique<Impl>(config, token_database)) {}
HiddenStateStore::~HiddenStateStore() = default;

detail::TransferSide& detail::transfer_side(HiddenStateStore& store) {
  return store.impl_->transfer;
}

void HiddenStateStore::bind_storage_manager(const StorageManager* m) { impl_->bind(m); }

// The token forms take either width: each visits the ids at their own width (nothing widened).
StoreResult HiddenStateStore::store_hidden_states(TokenIds t, const TensorView& h,
                                                  const StoreOptions& o) {
  return t.visit([&](auto ids) { return impl_->write.store_tokens(ids, h, o); });
}
StoreResult HiddenStateStore::store_chunks(std::span<const Chunk> c, const TensorView& h,
                                           const StoreOptions& o) {
  return impl_->write.store_chunks(c, h, o);
}

// Every retrieve is one detail::ReadPipeline::ReadCall: Impl::retrieve checks it (in one place) and runs it.
std::optional<HostTensor> HiddenStateStore::retrieve_hidden_states(TokenIds t,
                                                                   const RetrieveOptions& o) {
  const Slot slot{o.kind, o.layer_idx};
  detail::ReadPipeline::AllocatedOutputs made;
  detail::ReadPipeline::ReadCall call{.tokens = t, .slots = std::span<const Slot>(&slot, 1),
                      .slot_from_options = true, .allocate = &made, .row_begin = o.row_begin};
  (void)impl_->read.retrieve(call);
  return first_or_none(std::move(made.tensors));
}
std::optional<HostTensor> HiddenStateStore::retrieve_chunks(std::span<const Chunk> c,
                                                            const RetrieveOptions& o) {
  const Slot slot{o.kind, o.layer_idx};
  detail::ReadPipeline::AllocatedOutputs made;
  detail::ReadPipeline::ReadCall call{.chunks = c, .chunk_form = true, .slots = std::span<const Slot>(&slot, 1),
                      .slot_from_options = true, .allocate = &made, .row_begin = o.row_begin};
  (void)impl_->read.retrieve(call);
  return first_or_none(std::move(made.tensors));
}

int64_t HiddenStateStore::retrieve_hidden_states_into(TokenIds t, const MutableTensorView& out,
                                                      const RetrieveOptions& o) {
  const Slot slot{o.kind, o.layer_idx};
  return impl_->read.retrieve({.tokens = t, .slots = std::span<const Slot>(&slot, 1),
                          .slot_from_options = true,
                          .outs = std::span<const MutableTensorView>(&out, 1),
                          .row_begin = o.row_begin, .stream = o.stream});
}
int64_t HiddenStateStore::retrieve_chunks_into(std::span<const Chunk> c,
                                               const MutableTensorView& out,
                                               const RetrieveOptions& o) {
  const Slot slot{o.kind, o.layer_idx};
  return impl_->read.retrieve({.chunks = c, .chunk_form = true,
                          .slots = std::span<const Slot>(&slot, 1), .slot_from_options = true,
                          .outs = std::span<const MutableTensorView>(&out, 1),
                          .row_begin = o.row_begin, .stream = o.stream});
}

std::vector<HostTensor> HiddenStateStore::retrieve_layers(TokenIds t,
                                                          std::span<const int64_t> layers,
                                                          int64_t row_begin) {
  return retrieve_layers(t, std::span<const Slot>(hidden_slots(layers)), row_begin);
}
std::vector<HostTensor> HiddenStateStore::retrieve_layers(TokenIds t, std::span<const Slot> slots,
                                                          int64_t row_begin) {
  detail::ReadPipeline::AllocatedOutputs made;
  (void)impl_->read.retrieve({.tokens = t, .slots = slots, .allocate = &made, .row_begin = row_begin});
  return std::move(made.tensors);
}

int64_t HiddenStateStore::coverage(std::span<const Chunk> chunks,
                                   std::span<const int64_t> layers) const {
  return impl_->read.coverage(chunks, std::span<const Slot>(hidden_slots(layers)));
}
int64_t HiddenStateStore::coverage(std::span<const Chunk> chunks,
                                   std::span<const Slot> slots) const {
  return impl_->read.coverage(chunks, slots);
}
int64_t HiddenStateStore::coverage(std::span<const Chunk> chunks, std::span<const int64_t> layers,
                                   CoverageScope scope) const {
  return coverage(chunks, std::span<const Slot>(hidden_slots(layers)), scope);
}
TierCoverage HiddenStateStore::coverage_by_tier(std::span<const Chunk> chunks,
                                                std::span<const Slot> slots) const {
  return impl_->tier_reads.coverage_by_tier(chunks, slots, impl_->read.coverage(chunks, slots));
}
int64_t HiddenStateStore::coverage(std::span<const Chunk> chunks, std::span<const Slot> slots,
                                   CoverageScope scope) const {
  return scope == CoverageScope::kLocal ? impl_->read.coverage(chunks, slots)
                                        : impl_->tier_reads.coverage_with_tiers(chunks, slots,
                                                                    impl_->read.coverage(chunks, slots));
}

int64_t HiddenStateStore::retrieve_layers_into(TokenIds t, std::span<const Slot> slots,
                                               std::span<const MutableTensorView> outs,
                                               const RetrieveLayersOptions& o) {
  return impl_->read.retrieve({.tokens = t, .slots = slots, .outs = outs, .row_begin = o.row_begin,
                          .stream = o.stream});
}
int64_t HiddenStateStore::retrieve_layers_into(std::span<const Chunk> c,
                                               std::span<const Slot> slots,
                                               std::span<const MutableTensorView> outs,
                                               const RetrieveLayersOptions& o) {
  return impl_->read.retrieve({.chunks = c, .chunk_form = true, .slots = slots, .outs = outs,
                          .row_begin = o.row_begin, .stream = o.stream});
}
std::vector<StoreResult> HiddenStateStore::store_batch(std::span<const StoreItem> items) {
  return impl_->write.store_batch(items);
}
std::vector<int64_t> HiddenStateStore::retrieve_batch_into(std::span<const RetrieveItem> items) {
  return impl_->read.retrieve_batch_into(items);
}

size_t HiddenStateStore::num_cached_chunks() const { return impl_->num_cached_chunks(); }
size_t HiddenStateStore::num_entries() const { return impl_->num_entries(); }
bool HiddenStateStore::has_chunk(const CacheEngineKey& key, int64_t layer,
                                 ActivationKind kind) const {
  return impl_->has_chunk(key, {kind, layer});
}
bool HiddenStateStore::drop_key(const CacheEngineKey& key) { return impl_->drop_key(key); }
std::vector<CacheEngineKey> HiddenStateStore::lru_keys() const { return impl_->lru_keys(); }
bool HiddenStateStore::evict_one_lru() { return impl_->evict_one_lru(); }
void HiddenStateStore::check_invariants() const { impl_->check_invariants(); }
void HiddenStateStore::flush() { impl_->flush(); }
void HiddenStateStore::close() { impl_->close(); }
HiddenStateStats HiddenStateStore::stats() const { return impl_->stats(); }
const Config& HiddenStateStore::config() const { return impl_->config(); }

}  // namespace hss
