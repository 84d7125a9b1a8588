#pragma once
// Every pipeline stage of hsstore is an NVTX range in domain "hss" (store, store/keys,
// store/alloc, store/gather_cast, store/d2h, retrieve, retrieve/walk, retrieve/assemble, evict).
// A range hook sees the same push/pop events, on builds with and without NVTX: tests use it to
// prove the ranges are emitted, and an engine can forward them to its own profiler.
//
// Thread safety: set_range_hook may be called at any time; the hook itself is called from every
// thread that runs a range, concurrently, and must be thread-safe.

#include <string_view>

namespace hss::trace {

/// push == true when a range opens, false when it closes.
using RangeHook = void (*)(std::string_view name, bool push, void* user_data);

/// Installs (or, with nullptr, removes) the hook.
void set_range_hook(RangeHook hook, void* user_data = nullptr);

}  // namespace hss::trace
