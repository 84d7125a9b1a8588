#pragma once
// The tiles of the batched device store and restore (kernels' BatchStoreTile / BatchRestoreTile):
// how a batch's jobs are cut into per-block tiles, table by table. The CUDA path fills its pinned
// tables with these; the CUDA runtime model's twins of the batch kernels run the tables in CI
// (tests/gpu), and tests/datapath/test_batch_tiles.cpp checks the tiling on its own.

#include <cstddef>
#include <cstdint>
#include <span>

#include "datapath/data_path.hpp"
#include "hss/kernels/layout.hpp"

namespace hss::detail {

/// Tiles per launch table: 8192 tiles of up to 16 KiB of source each, 128 MiB per launch. An
/// engine step (hundreds of requests x a few layers) fits one table: one launch per stream.
inline constexpr size_t kBatchTilesPerTable = 8192;

/// Where tiling stopped: job, segment of that job, elements of that segment already tiled.
struct TileCursor {
  size_t job = 0;
  size_t segment = 0;
  int64_t consumed = 0;
};

/// Fills `table` with store tiles from `cursor` on (at most one tile's bytes of source each,
/// inside one source row when the source is strided) and advances the cursor. Returns the tiles
/// written: table.size() when the table filled, fewer when the jobs ran out (cursor.job ==
/// jobs.size()).
size_t fill_store_tiles(std::span<const StoreJob> jobs, TileCursor& cursor,
                        std::span<kernels::BatchStoreTile> table);

/// The same for restore tiles (inside one output row when the output is strided).
size_t fill_restore_tiles(std::span<const RestoreJob> jobs, TileCursor& cursor,
                          std::span<kernels::BatchRestoreTile> table);

/// True while `cursor` has tiles left to fill (it skips jobs without segments), so that a launch
/// slot is leased only for a table that will hold tiles.
[[nodiscard]] bool tiles_left(std::span<const StoreJob> jobs, TileCursor& cursor);
[[nodiscard]] bool tiles_left(std::span<const RestoreJob> jobs, TileCursor& cursor);

}  // namespace hss::detail
