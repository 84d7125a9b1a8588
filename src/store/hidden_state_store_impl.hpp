#pragma once
// HiddenStateStore::Impl: the store's parts, each with one job, over the state they share.
//
//   StoreState       store_state.{hpp,cpp},              the closed catalog (index, LRU, mutex,
//                    index_lock.hpp, pinned_walk.hpp     pools, entries: private) behind the
//                                                        write and read transactions; config,
//                                                        copy paths, tiers, counters
//   WritePipeline    write_pipeline.hpp,                 every store call (a single store is a
//                    hidden_state_store_write.cpp, _batch batch of one plan)
//   ReadPipeline     read_pipeline.hpp,                  every retrieve call and coverage (a
//                    hidden_state_store_read.cpp, _batch  single retrieve is a batch of one read)
//   TierReadThrough  tier_read_through.hpp,              read-through and coverage over the
//                    hidden_state_store_tiers.cpp         backing tiers
//   StoreTransfer    store_transfer.{hpp,cpp}            P/D export and import, behind the narrow
//                                                        TransferSide (transfer_side.hpp)
//   Impl             hidden_state_store.cpp              construction, queries, maintenance,
//                                                        stats, the public surface
//
// Lock order: the index mutex, then the pool's free-stack mutex. Never the reverse, never a KV
// backend's lock or a copy under the index mutex.

#include <vector>

#include "hss/hidden_state_store.hpp"
#include "store/read_pipeline.hpp"
#include "store/store_state.hpp"
#include "store/store_transfer.hpp"
#include "store/tier_read_through.hpp"
#include "store/write_pipeline.hpp"

namespace hss {

class HiddenStateStore::Impl {
 public:
  Impl(const Config& config, const TokenDatabase& token_database);
  /// Closes the store (a destructor never throws).
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  [[nodiscard]] const Config& config() const { return state.config; }
  void bind(const StorageManager* manager) {
    state.storage_manager.store(manager, std::memory_order_release);
  }

  // ---- queries and maintenance (hidden_state_store.cpp)
  [[nodiscard]] size_t num_cached_chunks() const;
  [[nodiscard]] size_t num_entries() const;
  [[nodiscard]] bool has_chunk(const CacheEngineKey& key, Slot slot) const;
  bool drop_key(const CacheEngineKey& key);
  [[nodiscard]] std::vector<CacheEngineKey> lru_keys() const;
  bool evict_one_lru();
  void check_invariants() const;
  void flush();
  void close();
  [[nodiscard]] HiddenStateStats stats() const;

  // ---- the parts (declared in dependency order: each may use those above it)
  detail::StoreState state;
  detail::TierReadThrough tier_reads{state};
  detail::ReadPipeline read{state, tier_reads};
  detail::WritePipeline write{state};
  detail::StoreTransfer transfer{state, read};
};

}  // namespace hss
