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

namespace {

/// The pool's size once the key table (config_keys.cpp, the one place keys are checked) accepts
/// the config as a store's: a store is the hidden-state cache enabled, whatever the switch says.
uint64_t checked_pool_bytes(const Config& config) {
  Config as_store = config;
  as_store.enable_hidden_state_cache = true;
  as_store.validate();
  return as_store.hidden_state_pool_bytes();
}

}  // namespace

HiddenStateStore::Impl::Impl(const Config& config, const TokenDatabase& token_database)
    // The HSS_* debugging variables win over every source (config_env.hpp): config_ is what
    // this store runs with, so config_.to_yaml() shows what is in effect.
    : config_(config.with_env_overrides()),
      token_database_(token_database),
      pool_(checked_pool_bytes(config_), static_cast<uint64_t>(config_.hidden_state_block_bytes),
            /*try_pinned=*/true, /*prefault=*/true, detail::store_device(config_)),
      // The pool is empty: the calibration may overwrite it.
      host_copy_(detail::choose_host_copy(
          config_, std::span<std::byte>(pool_.block_address(0), pool_.capacity_bytes()))),
      copy_threads_(detail::choose_copy_threads(config_.tuning.copy_threads,
                                                detail::this_thread_cpu_budget())),
      // Cheap: the workers start on the first split copy.
      copy_workers_(copy_threads_.threads > 1
                        ? std::make_unique<detail::CopyWorkers>(copy_threads_.threads)
                        : nullptr),
      device_path_(detail::DevicePath::create(config_)),
      mac_(detail::ValueMac::from_config(config_)),
      // Queued writes may keep half the pool from eviction; beyond that they copy.
      tiers_(detail::make_backing_tiers(config_), pool_.capacity_bytes() / 2) {
  // Process-wide: the recycler of restore outputs, and the log threshold when the config sets one.
  detail::host_buffer_pool_set_limit(static_cast<size_t>(config_.tuning.output_cache_bytes));
  if (config_.hidden_state_log_level) detail::set_log_level(*config_.hidden_state_log_level);
}

HiddenStateStore::Impl::~Impl() {
  try {
    close();
  } catch (...) {  // a destructor must not throw; close() only fails on a broken device
  }
}

void HiddenStateStore::Impl::reclaim_device_resources() noexcept {
  if (!device_path_) return;
  try {
    device_path_->poll();
  } catch (...) {  // a broken device: nothing to reclaim now; the next checked call reports it
  }
  (void)deferred_.reclaim();
}

void HiddenStateStore::Impl::check_pointer(const void* data, Device device, int device_index,
                                           const char* what) const {
  if (device_path_ && data != nullptr) {
    device_path_->check_pointer(data, device == Device::kCuda, device_index, what);
  }
}

void HiddenStateStore::Impl::check_stream(Device device, Stream stream) const {
  if (device_path_ && device == Device::kCuda) device_path_->check_stream(stream);
}

void HiddenStateStore::Impl::check_open_locked() const {
  if (closed_) throw Error("HiddenStateStore is closed");
}

void HiddenStateStore::Impl::check_chunks(std::span<const Chunk> chunks) {
  int64_t expected_start = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    if (c.start != expected_start || c.end <= c.start) {
      throw InvalidArgument("chunks[" + std::to_string(i) + "] = [" + std::to_string(c.start) +
                            ", " + std::to_string(c.end) + ") must be non-empty and start at " +
                            std::to_string(expected_start) +
                            " (chunks are contiguous from token 0)");
    }
    expected_start = c.end;
  }
}

size_t HiddenStateStore::Impl::num_cached_chunks() const {
  std::lock_guard lock(mutex_);
  return index_.ready_keys();
}

size_t HiddenStateStore::Impl::num_entries() const {
  std::lock_guard lock(mutex_);
  return index_.ready_entries();
}

bool HiddenStateStore::Impl::has_chunk(const CacheEngineKey& key, Slot slot) const {
  if (!is_valid(slot.kind)) {
    throw InvalidArgument("kind has an unknown value " +
                          std::to_string(static_cast<int>(slot.kind)));
  }
  std::lock_guard lock(mutex_);
  const detail::KeyRecord* record = index_.find(key);
  if (record == nullptr) return false;
  const EntryRef* entry = record->find(slot);
  // A failed device copy (the cached flag) is as good as absent: its rows never land.
  return entry != nullptr && (*entry)->ready() && !(*entry)->copy_failed();
}

bool HiddenStateStore::Impl::drop_key(const CacheEngineKey& key) {
  std::lock_guard lock(mutex_);
  check_open_locked();
  return index_.erase(key) > 0;
}

std::vector<CacheEngineKey> HiddenStateStore::Impl::lru_keys() const {
  std::vector<CacheEngineKey> keys;
  std::lock_guard lock(mutex_);
  keys.reserve(index_.keys());
  index_.for_each_lru(
      [&](const CacheEngineKey& key, const detail::KeyRecord&) { keys.push_back(key); });
  return keys;
}

bool HiddenStateStore::Impl::evict_one_lru() {
  std::lock_guard lock(mutex_);
  check_open_locked();
  const CacheEngineKey* victim = index_.eviction_candidate(0, /*freeable_only=*/false);
  if (victim == nullptr) return false;
  (void)index_.erase(*victim);
  counters_.hs_evictions.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void HiddenStateStore::Impl::flush() {
  if (device_path_) {
    device_path_->flush();
    reclaim_device_resources();
  }
  tiers_.flush();
}

void HiddenStateStore::Impl::close() {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    // Under the lock: a store that already passed its checks either published before this point
    // or finds the store closed when it publishes (its entries then stay detached).
    closed_ = true;
  }
  flush();
  tiers_.close();   // the tiers take no more writes (a closed store stores nothing anyway)
  leases_.clear();  // a closed store exports nothing: its consumers' releases answer false
  std::lock_guard lock(mutex_);
  index_.clear();
}

void HiddenStateStore::Impl::check_invariants() const {
  auto fail = [](const std::string& what) { throw Error("check_invariants: " + what); };
  std::vector<uint32_t> free_ids;
  std::lock_guard lock(mutex_);
  // The free list under the index lock (lock order index -> pool): every grant happens under
  // it, so no granule granted since the snapshot shows up as both free and held. Releases may
  // still come (a detached entry's last reader), but only of granules the index no longer holds.
  pool_.free_ids(free_ids);
  std::vector<uint8_t> owner(pool_.num_blocks(), 0);
  for (uint32_t id : free_ids) {
    if (id >= owner.size()) fail("free granule id " + std::to_string(id) + " out of range");
    if (owner[id]++ != 0) fail("granule " + std::to_string(id) + " is on the free list twice");
  }
  uint64_t ready = 0, bytes = 0, blocks = 0, lru_count = 0, ready_keys = 0;
  std::array<detail::StoreIndex::KindTotals, kNumActivationKinds> kinds{};
  uint64_t entries = 0;
  index_.for_each_lru([&](const CacheEngineKey& key, const detail::KeyRecord& record) {
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
      if (e.blocks.size() != pool_.blocks_for(e.payload_bytes())) {
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
  if (lru_count != index_.keys()) fail("LRU list and map disagree on the number of keys");
  if (lru_count != index_.lru_size()) fail("LRU list and its length disagree");
  // Every entry of the index lives in a node of the entry pool (entry_pool.hpp).
  if (entries > entries_.nodes_in_use()) {
    fail(std::to_string(entries) + " entries in the index but " +
         std::to_string(entries_.nodes_in_use()) + " entry nodes in use");
  }
  if (ready_keys != index_.ready_keys()) fail("count of cached keys disagrees with the index");
  if (ready != index_.ready_entries() || bytes != index_.bytes_held() ||
      blocks != index_.blocks_held()) {
    fail("accounting of READY entries disagrees with the index");
  }
  for (size_t k = 0; k < kinds.size(); ++k) {
    const auto& totals = index_.kind_totals(static_cast<ActivationKind>(k));
    if (kinds[k].entries != totals.entries || kinds[k].bytes != totals.bytes) {
      fail("per-kind accounting of " + std::string(to_string(static_cast<ActivationKind>(k))) +
           " disagrees");
    }
  }
}

HiddenStateStats HiddenStateStore::Impl::stats() const {
  HiddenStateStats s;
  {
    std::lock_guard lock(mutex_);
    s.entries_held = index_.ready_entries();
    s.keys_held = index_.ready_keys();
    s.bytes_held = index_.bytes_held();
    s.blocks_held = index_.blocks_held();
    s.closed = closed_;
    for (size_t k = 0; k < s.per_kind.size(); ++k) {
      const auto& totals = index_.kind_totals(static_cast<ActivationKind>(k));
      s.per_kind[k].entries_held = totals.entries;
      s.per_kind[k].bytes_held = totals.bytes;
    }
  }
  s.pool_capacity_bytes = pool_.capacity_bytes();
  s.pool_free_bytes = pool_.free_blocks() * pool_.granule_bytes();
  s.granule_bytes = pool_.granule_bytes();
  s.pinned = pool_.pinned();
  s.device_path = device_path_ != nullptr;
  s.stores = counters_.stores.load();
  s.chunks_written = counters_.chunks_written.load();
  s.retrieves = counters_.retrieves.load();
  s.hit_tokens = counters_.hit_tokens.load();
  s.miss_tokens = counters_.miss_tokens.load();
  s.hs_evictions = counters_.hs_evictions.load();
  s.coupled_evictions = counters_.coupled_evictions.load();
  s.allocation_failures = counters_.allocation_failures.load();
  s.copy_failures = counters_.copy_failures.load();
  s.staging_waits = device_path_ ? device_path_->staging_waits() : 0;
  s.device_launches = device_path_ ? device_path_->launches() : 0;
  s.launch_waits = device_path_ ? device_path_->launch_waits() : 0;
  for (size_t k = 0; k < s.per_kind.size(); ++k) {
    s.per_kind[k].chunks_written = counters_.kind_chunks_written[k].load();
  }
  s.remote = detail::remote_stats_of(tiers_);
  s.host_copy = host_copy_.info;
  s.host_copy.copy_threads = copy_threads_.threads;
  s.host_copy.copy_threads_auto = copy_threads_.automatic;
  s.host_copy.copy_threads_reason = copy_threads_.reason;
  s.host_copy.copy_workers_started = copy_workers_ ? copy_workers_->started() : 0;
  s.host_copy.min_bytes_per_copy_thread = host_copy_context().min_split_bytes;
  s.host_copy.split_copies = copy_workers_ ? copy_workers_->split_runs() : 0;
  const detail::LeaseTable::Counts leases = leases_.counts();
  const TransferCounters& t = transfer_counters_;
  s.transfer = {t.exports.load(),
                t.exported_entries.load(),
                t.exported_bytes.load(),
                leases.held,
                leases.bytes,
                leases.released,
                leases.expired,
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

void HiddenStateStore::bind_storage_manager(const StorageManager* m) { impl_->bind(m); }

// The token forms take either width: each visits the ids at their own width (nothing widened).
StoreResult HiddenStateStore::store_hidden_states(TokenIds t, const TensorView& h,
                                                  const StoreOptions& o) {
  return t.visit([&](auto ids) { return impl_->store_tokens(ids, h, o); });
}
StoreResult HiddenStateStore::store_chunks(std::span<const Chunk> c, const TensorView& h,
                                           const StoreOptions& o) {
  return impl_->store_chunks(c, h, o);
}

// Every retrieve is one Impl::ReadCall: Impl::retrieve checks it (in one place) and runs it.
std::optional<HostTensor> HiddenStateStore::retrieve_hidden_states(TokenIds t,
                                                                   const RetrieveOptions& o) {
  const Slot slot{o.kind, o.layer_idx};
  Impl::AllocatedOutputs made;
  Impl::ReadCall call{.tokens = t, .slots = std::span<const Slot>(&slot, 1),
                      .slot_from_options = true, .allocate = &made, .row_begin = o.row_begin};
  (void)impl_->retrieve(call);
  return first_or_none(std::move(made.tensors));
}
std::optional<HostTensor> HiddenStateStore::retrieve_chunks(std::span<const Chunk> c,
                                                            const RetrieveOptions& o) {
  const Slot slot{o.kind, o.layer_idx};
  Impl::AllocatedOutputs made;
  Impl::ReadCall call{.chunks = c, .chunk_form = true, .slots = std::span<const Slot>(&slot, 1),
                      .slot_from_options = true, .allocate = &made, .row_begin = o.row_begin};
  (void)impl_->retrieve(call);
  return first_or_none(std::move(made.tensors));
}

int64_t HiddenStateStore::retrieve_hidden_states_into(TokenIds t, const MutableTensorView& out,
                                                      const RetrieveOptions& o) {
  const Slot slot{o.kind, o.layer_idx};
  return impl_->retrieve({.tokens = t, .slots = std::span<const Slot>(&slot, 1),
                          .slot_from_options = true,
                          .outs = std::span<const MutableTensorView>(&out, 1),
                          .row_begin = o.row_begin, .stream = o.stream});
}
int64_t HiddenStateStore::retrieve_chunks_into(std::span<const Chunk> c,
                                               const MutableTensorView& out,
                                               const RetrieveOptions& o) {
  const Slot slot{o.kind, o.layer_idx};
  return impl_->retrieve({.chunks = c, .chunk_form = true,
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
  Impl::AllocatedOutputs made;
  (void)impl_->retrieve({.tokens = t, .slots = slots, .allocate = &made, .row_begin = row_begin});
  return std::move(made.tensors);
}

int64_t HiddenStateStore::coverage(std::span<const Chunk> chunks,
                                   std::span<const int64_t> layers) const {
  return impl_->coverage(chunks, std::span<const Slot>(hidden_slots(layers)));
}
int64_t HiddenStateStore::coverage(std::span<const Chunk> chunks,
                                   std::span<const Slot> slots) const {
  return impl_->coverage(chunks, slots);
}
int64_t HiddenStateStore::coverage(std::span<const Chunk> chunks, std::span<const int64_t> layers,
                                   CoverageScope scope) const {
  return coverage(chunks, std::span<const Slot>(hidden_slots(layers)), scope);
}
int64_t HiddenStateStore::coverage(std::span<const Chunk> chunks, std::span<const Slot> slots,
                                   CoverageScope scope) const {
  return scope == CoverageScope::kLocal ? impl_->coverage(chunks, slots)
                                        : impl_->coverage_with_tiers(chunks, slots);
}

int64_t HiddenStateStore::retrieve_layers_into(TokenIds t, std::span<const Slot> slots,
                                               std::span<const MutableTensorView> outs,
                                               const RetrieveLayersOptions& o) {
  return impl_->retrieve({.tokens = t, .slots = slots, .outs = outs, .row_begin = o.row_begin,
                          .stream = o.stream});
}
int64_t HiddenStateStore::retrieve_layers_into(std::span<const Chunk> c,
                                               std::span<const Slot> slots,
                                               std::span<const MutableTensorView> outs,
                                               const RetrieveLayersOptions& o) {
  return impl_->retrieve({.chunks = c, .chunk_form = true, .slots = slots, .outs = outs,
                          .row_begin = o.row_begin, .stream = o.stream});
}
std::vector<StoreResult> HiddenStateStore::store_batch(std::span<const StoreItem> items) {
  return impl_->store_batch(items);
}
std::vector<int64_t> HiddenStateStore::retrieve_batch_into(std::span<const RetrieveItem> items) {
  return impl_->retrieve_batch_into(items);
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
