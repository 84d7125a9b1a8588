// Must not compile: granules taken from the host pool past the write transaction (grant_blocks,
// reserve): the pool is private, pool() is read-only.
#include <cstdint>
#include <span>

#include "store/store_state.hpp"

bool sample(hss::detail::StoreState& state, std::span<uint32_t> ids) {
  const auto lock = state.lock_index();
  return state.pool().allocate(ids);
}
