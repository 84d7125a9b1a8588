// Must not compile: the index changed by a part, lock held but not through the catalog's named
// operations (drop_key, the write transaction): index(lock) is read-only.
#include "store/store_state.hpp"

bool sample(hss::detail::StoreState& state, const hss::CacheEngineKey& key) {
  const auto lock = state.lock_index();
  return state.index(lock).erase(key) > 0;
}
