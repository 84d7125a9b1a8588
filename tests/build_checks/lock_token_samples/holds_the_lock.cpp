// Compiles: the index lock is taken through lock_index() and its token passed on.
#include "store/store_state.hpp"

bool sample(hss::detail::StoreState& state, const hss::CacheEngineKey& key) {
  const auto lock = state.lock_index();
  state.check_open(lock);
  return state.index(lock).find(key) != nullptr;
}
