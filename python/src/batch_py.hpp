#pragma once
// HiddenStateStore.store_batch / retrieve_batch_into for Python: an engine step (requests x
// layers) as one call into the C++ batch API instead of one Python call per item. Each item is a
// tuple (token_ids, tensor[, layer_idx[, token_offset | row_begin[, kind]]]); items passing the
// same token-id object share one conversion and one key pass. Arguments are converted with the
// GIL held, the C++ batch runs with it released. A bad item raises hsstore.InvalidArgument
// (a ValueError) naming items[i], and nothing of the batch is done.

#include <nanobind/nanobind.h>

#include "store_py.hpp"

namespace hss::python {

/// The chunks newly written per item (LMCache's number, as store_hidden_states returns).
[[nodiscard]] nb::list store_batch(PyHiddenStateStore& s, nb::handle items);
/// The rows written per item (0 on a miss), as retrieve_hidden_states_into returns.
[[nodiscard]] nb::list retrieve_batch_into(PyHiddenStateStore& s, nb::handle items);

}  // namespace hss::python
