// Must not compile: the store's mutex taken directly, around the token.
#include <mutex>

#include "store/store_state.hpp"

void sample(hss::detail::StoreState& state) { std::lock_guard lock(state.mutex_); }
