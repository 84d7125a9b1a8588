#pragma once
// Umbrella header: everything an engine needs from hsstore.

#include "hss/activation.hpp"
#include "hss/build_info.hpp"
#include "hss/cache_key.hpp"
#include "hss/config.hpp"
#include "hss/engine.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/local_cpu_backend.hpp"
#include "hss/pool_transfer.hpp"
#include "hss/storage_manager.hpp"
#include "hss/tensor.hpp"
#include "hss/token_database.hpp"
#include "hss/token_ids.hpp"
#include "hss/trace.hpp"
#include "hss/transfer_wire.hpp"
