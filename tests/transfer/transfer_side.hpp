#pragma once
// One side of a pool transfer between two stores of one process (hss/pool_transfer.hpp): a
// store bound to a KV whose presence the test controls, and its transfer primitives.

#include "hss/hss.hpp"
#include "hss/pool_transfer.hpp"
#include "test_util.hpp"

namespace hss::test {

struct TransferSide {
  TransferSide(const Config& config, const ChunkedTokenDatabase& db)
      : store(config, db), transfer(store) {
    store.bind_storage_manager(&kv);
  }
  ControlledKv kv;
  HiddenStateStore store;
  PoolTransfer transfer;
};

}  // namespace hss::test
