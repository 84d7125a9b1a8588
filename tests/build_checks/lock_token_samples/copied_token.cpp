// Must not compile: a token copied out of its scope would outlive the lock it proves.
#include "store/store_state.hpp"

void sample(hss::detail::StoreState& state) {
  const auto lock = state.lock_index();
  const hss::detail::IndexLock copy = lock;
  state.check_open(copy);
}
