#pragma once
// Argument checks shared by the store's entry points. Each throws InvalidArgument naming the
// argument and its value, before anything is changed.

#include <cstdint>

#include "hss/detail/checked.hpp"
#include "hss/hidden_state_store.hpp"

namespace hss::detail {

/// Documented limits of a tensor view: the sizes they imply fit comfortably in 63 bits.
inline constexpr int64_t kMaxCols = limits::kMaxCols;  // the documented limits (hss::limits)
inline constexpr int64_t kMaxRows = limits::kMaxRows;

/// The view validator every public entry point uses: check_view_shape (dtype and device in their
/// enums, rows in [0, 2^31], cols in [1, 2^24], row_stride 0 or in [cols, 2^32]), the byte span
/// at most 2^48 (view_span_bytes), data non-null when rows > 0, a cuda view only when `device_ok`,
/// element-aligned device data, device_index >= 0. Impl trusts what passed it.
void check_view(const TensorView& view, const char* name, bool device_ok);

/// A store of hidden_states for a token list of n_tokens tokens: token_offset in [0, n_tokens],
/// rows == n_tokens - token_offset, a valid kind, a valid view.
void check_store_arguments(int64_t n_tokens, const TensorView& hidden, const StoreOptions& opt,
                           bool device_ok);

/// A kind inside the enum (InvalidArgument naming `name` and the value otherwise).
void check_kind(ActivationKind kind, const char* name);

/// row_begin >= 0, a valid kind.
void check_retrieve_options(const RetrieveOptions& opt);

/// Slots of a multi-slot restore or coverage: non-empty, kinds valid.
void check_slots(std::span<const Slot> slots);

}  // namespace hss::detail
