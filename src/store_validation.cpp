#include "store_validation.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

#include "hss/error.hpp"

namespace hss::detail {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

void check_kind(ActivationKind kind, const char* name) {
  if (!is_valid(kind)) {
    throw InvalidArgument(std::string(name) + " has an unknown value " +
                          str(static_cast<int>(kind)));
  }
}

}  // namespace

void check_view(const TensorView& view, const char* name, bool device_ok) {
  const std::string n(name);
  if (!is_valid(view.dtype)) {
    throw InvalidArgument(n + ".dtype has an unknown value " + str(static_cast<int>(view.dtype)));
  }
  if (!is_valid(view.device)) {
    throw InvalidArgument(n + ".device has an unknown value " + str(static_cast<int>(view.device)));
  }
  if (view.rows < 0) throw InvalidArgument(n + ".rows = " + str(view.rows) + " is negative");
  if (view.rows > kMaxRows) {
    throw InvalidArgument(n + ".rows = " + str(view.rows) + " exceeds the limit of 2^31");
  }
  if (view.cols <= 0) {
    throw InvalidArgument(n + ".cols = " + str(view.cols) +
                          ": hidden states must be 2-D with at least one column");
  }
  if (view.cols > kMaxCols) {
    throw InvalidArgument(n + ".cols = " + str(view.cols) + " exceeds the limit of 2^24");
  }
  if (view.row_stride != 0 && (view.row_stride < view.cols || view.row_stride > kMaxCols * 64)) {
    throw InvalidArgument(n + ".row_stride = " + str(view.row_stride) +
                          " must be 0 or in [cols = " + str(view.cols) + ", 2^30]");
  }
  if (view.rows > 0 && view.data == nullptr) {
    throw InvalidArgument(n + ".data is null with rows = " + str(view.rows));
  }
  if (view.device == Device::kCuda && !device_ok) {
    throw InvalidArgument(n + ".device = cuda but no CUDA device is usable in this process");
  }
  // A GPU loads an element only from an address aligned to its size: a misaligned load is a
  // sticky cudaErrorMisalignedAddress that loses the context. Every framework's tensors are
  // element-aligned (row strides count elements), so such a view is a caller bug: refuse it
  // before any launch rather than slow every kernel down with byte loads (docs/kernels.md).
  const size_t esize = element_size(view.dtype);
  if (view.device == Device::kCuda && reinterpret_cast<uintptr_t>(view.data) % esize != 0) {
    char address[32];
    std::snprintf(address, sizeof address, "%p", view.data);
    throw InvalidArgument(n + ".data = " + address + " is not aligned to its " +
                          std::to_string(esize) + "-byte " + std::string(to_string(view.dtype)) +
                          " elements: device views must be element-aligned");
  }
  if (view.device_index < 0) {
    throw InvalidArgument(n + ".device_index = " + str(view.device_index) + " is negative");
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
