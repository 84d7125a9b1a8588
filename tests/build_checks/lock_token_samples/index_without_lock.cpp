// Must not compile: the index, reached without the lock.
#include "store/store_state.hpp"

bool sample(hss::detail::StoreState& state, const hss::CacheEngineKey& key) {
  return state.index_.find(key) != nullptr;
}
