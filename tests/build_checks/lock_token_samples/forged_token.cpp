// Must not compile: a token made without taking the mutex.
#include <mutex>

#include "store/store_state.hpp"

void sample(hss::detail::StoreState& state) {
  std::mutex other;
  const hss::detail::IndexLock lock(other);
  state.check_open(lock);
}
