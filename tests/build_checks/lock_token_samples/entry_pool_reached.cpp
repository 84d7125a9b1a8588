// Must not compile: an entry made in the host pool's node pool directly (new_entry is the way).
#include "store/store_state.hpp"

std::size_t sample(hss::detail::StoreState& state) { return state.entries_.nodes(); }
