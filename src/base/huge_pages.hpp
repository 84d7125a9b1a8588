#pragma once
// Anonymous memory mapped for transparent huge pages: the one place hsstore maps large host
// buffers (the pool's arena without pinning, restored tensors' buffers, the disk tier's read
// buffers).
//
// Why huge pages: a fresh 4 KiB page costs a fault on first touch (a 256 MiB restore into fresh
// memory pays 65536 of them); and an O_DIRECT read into 4 KiB pages becomes one device request
// per ~1 MiB (a request holds at most max_segments pages; virtio-blk: 254) with every page
// pinned, while into 2 MiB pages a 4 MiB read is one request (docs/perf.md, "Local disk tier").
//
// Why aligned: the kernel backs only whole, aligned 2 MiB ranges with huge pages. Kernels
// before 6.7 did not align large anonymous mappings, so an unaligned mapping lost its first
// and last huge page to 4 KiB pages. The mapping starts on a kHugePageBytes boundary.
//
// MADV_HUGEPAGE is advice: with THP off (`never`, or not built in) the mapping keeps 4 KiB
// pages, aligned, and everything works as before, slower. Where THP's defrag setting is
// `madvise` (or `always`), a first fault may compact memory to find a huge page: a one-time
// stall per page, which is why every user keeps its mappings (the pool for its life, the
// recycler and the disk tier's buffer cache for reuse). Thread safety: none needed (no state).

#include <cstddef>

namespace hss::detail {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

/// Maps `bytes` (> 0) of private anonymous memory starting on a kHugePageBytes boundary, asks
/// for huge pages, and touches nothing. `noreserve`: MAP_NORESERVE (no swap reservation).
/// nullptr when the kernel refuses (errno set). Free with unmap_huge_pages(p, bytes).
[[nodiscard]] void* map_huge_pages(size_t bytes, bool noreserve = false) noexcept;

/// Unmaps what map_huge_pages(bytes) returned (nullptr: nothing).
void unmap_huge_pages(void* p, size_t bytes) noexcept;

}  // namespace hss::detail
