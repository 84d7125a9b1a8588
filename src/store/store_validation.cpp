#include "store/store_validation.hpp"

#include <bit>
#include <cstdint>
#include <cstdio>
#include <string>

#include "hss/detail/checked.hpp"
#include "hss/error.hpp"

namespace hss::detail {
namespace {

std::string str(int64_t v) { return std::to_string(v); }


// Every condition of check_view in one expression, without a call or a string: the accepted
// view, which is every view of a correct caller, costs a few compares. The limits are
// checked.hpp's (view_dims_ok, view_span_if_within_limit), the same the checks below apply; a view
// refused here goes through those checks, which say what is wrong.
bool view_is_valid(const TensorView& v, bool device_ok) noexcept {
  if (!is_valid(v.dtype) || !is_valid(v.device) || !view_dims_ok(v.rows, v.cols, v.row_stride)) {
    return false;
  }
  if (v.rows > 0 &&
      (v.data == nullptr || !view_span_if_within_limit(v.dtype, v.rows, v.cols, v.row_stride))) {
    return false;
  }
  if (v.device == Device::kCuda &&
      (!device_ok || reinterpret_cast<uintptr_t>(v.data) % element_size(v.dtype) != 0)) {
    return false;
  }
  return v.device_index >= 0;
}

}  // namespace

void check_kind(ActivationKind kind, const char* name) {
  if (!is_valid(kind)) {
    throw InvalidArgument(std::string(name) + " has an unknown value " +
                          str(static_cast<int>(kind)));
  }
}

void check_view(const TensorView& view, const char* name, bool device_ok) {
  if (view_is_valid(view, device_ok)) [[likely]]
    return;
  // A view of the name: the string is only built on the error paths.
  const std::string_view n(name);
  // The one shape validator (hss/detail/checked.hpp), shared with the KV backend, then the byte
  // span: every loop and kernel may then index the view in int64_t without overflow (layout.hpp).
  check_view_shape(view.dtype, view.device, view.rows, view.cols, view.row_stride, n);
  (void)view_span_bytes(view.dtype, view.rows, view.cols, view.row_stride, n);
  if (view.rows > 0 && view.data == nullptr) {
    throw InvalidArgument(std::string(n) + ".data is null with rows = " + str(view.rows));
  }
  if (view.device == Device::kCuda && !device_ok) {
    throw InvalidArgument(std::string(n) +
                          ".device = cuda but no CUDA device is usable in this process");
  }
  // A GPU loads an element only from an address aligned to its size: a misaligned load is a
  // sticky cudaErrorMisalignedAddress that loses the context. Every framework's tensors are
  // element-aligned (row strides count elements), so such a view is a caller bug: refuse it
  // before any launch rather than slow every kernel down with byte loads (docs/kernels.md).
  const size_t esize = element_size(view.dtype);
  if (view.device == Device::kCuda && reinterpret_cast<uintptr_t>(view.data) % esize != 0) {
    char address[32];
    std::snprintf(address, sizeof address, "%p", view.data);
    throw InvalidArgument(std::string(n) + ".data = " + address + " is not aligned to its " +
                          std::to_string(esize) + "-byte " + std::string(to_string(view.dtype)) +
                          " elements: device views must be element-aligned");
  }
  if (view.device_index < 0) {
    throw InvalidArgument(std::string(n) + ".device_index = " + str(view.device_index) +
                          " is negative");
  }
}

void check_store_arguments(int64_t n_tokens, const TensorView& hidden, const StoreOptions& opt,
                           bool device_ok) {
  if (opt.token_offset < 0 || opt.token_offset > n_tokens) {
    throw InvalidArgument("token_offset = " + str(opt.token_offset) + " is outside [0, " +
                          str(n_tokens) + "] (len(token_ids))");
  }
  check_kind(opt.kind, "options.kind");
  check_view(hidden, "hidden_states", device_ok);
  if (hidden.rows != n_tokens - opt.token_offset) {
    throw InvalidArgument(
        "hidden_states.rows = " + str(hidden.rows) +
        " must equal len(token_ids) - token_offset = " + str(n_tokens - opt.token_offset));
  }
}

void check_retrieve_options(const RetrieveOptions& opt) {
  if (opt.row_begin < 0) {
    throw InvalidArgument("row_begin = " + str(opt.row_begin) + " is negative");
  }
  check_kind(opt.kind, "options.kind");
}

void check_slots(std::span<const Slot> slots) {
  if (slots.empty()) throw InvalidArgument("layer_idxs (slots) is empty");
  for (const Slot& slot : slots) check_kind(slot.kind, "slots[].kind");
}

}  // namespace hss::detail
