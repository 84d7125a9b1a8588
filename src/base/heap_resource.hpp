#pragma once
// The heap as a std::pmr::memory_resource, for the per-call vectors of the store and read
// pipelines (a PinnedWalk's pins, a StorePlan's writes and segments) when no arena backs them.
//
// Why not std::pmr::new_delete_resource(): libstdc++ 12's passes every request to the aligned
// operator new (memalign and its free, about 190 instructions a pair more than malloc's) even
// for the 8- and 16-byte alignments these vectors ask; on a one-chunk store and retrieve that
// was ~2.5% of every instruction (callgrind, docs/perf.md). Here an alignment the plain
// operator new guarantees takes the plain operator new.
//
// Thread safety: stateless, any thread. Two of them compare equal (one heap).

#include <memory_resource>

namespace hss::detail {

/// The process's one HeapResource. Never null; lives for the whole process.
[[nodiscard]] std::pmr::memory_resource* heap_resource() noexcept;

}  // namespace hss::detail
