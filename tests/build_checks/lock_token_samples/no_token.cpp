// Must not compile: a function that needs the index lock, called without its token.
#include "store/store_state.hpp"

void sample(hss::detail::StoreState& state) { state.check_open(); }
