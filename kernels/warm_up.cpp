// kernels::warm_up (hss/kernels/launch.hpp): one launch of every kernel instantiation over empty
// tiles. Host code over the launchers, so the CUDA build and the model's host twins share it.

#include <cstdint>

#include "hss/kernels/dispatch.hpp"
#include "hss/kernels/launch.hpp"

namespace hss::kernels {
namespace {

/// One empty tile of each kind. Views have one column so that the index arithmetic a block does
/// before it finds nothing to move divides by something.
struct WarmUpTable {
  WriteSegment write{nullptr, 0, 0, 0, ElemType::kFloat32};
  GatherSegment gather{nullptr, 0, 0, ElemType::kFloat32};
  BatchStoreTile store{{nullptr, ElemType::kFloat32, 1, 1}, {nullptr, 0, 0, 0, ElemType::kFloat32}};
  BatchRestoreTile restore{{nullptr, 0, 0, ElemType::kFloat32},
                           {nullptr, 1, 1, ElemType::kFloat32}};
  const void* cub_srcs[1] = {nullptr};
  void* cub_dsts[1] = {nullptr};
  uint64_t cub_sizes[1] = {0};
};

}  // namespace

size_t warm_up_table_bytes() { return sizeof(WarmUpTable); }

void warm_up(void* table_host, const void* table_device, void* cub_temp, size_t cub_temp_bytes,
             cudaStream_t stream) {
  *static_cast<WarmUpTable*>(table_host) = WarmUpTable{};
  const auto* t = static_cast<const WarmUpTable*>(table_device);
  dispatch_each_store_pair([&]<ElemType S, ElemType D>() {
    launch_gather_cast(SourceView{nullptr, S, 1, 1}, D, &t->write, 1, stream);
  });
  dispatch_each_quantise_pair([&]<ElemType S, ElemType T>() {
    launch_gather_quantise(SourceView{nullptr, S, 1, 1}, T, &t->write, 1, stream);
  });
  launch_store_batch(&t->store, 1, stream);
  dispatch_each_output([&]<ElemType D>() {
    launch_restore_gather(&t->gather, 1, OutputView{nullptr, 1, 1, D}, stream);
  });
  launch_restore_batch(&t->restore, 1, stream);
  launch_cub_batched_memcpy(cub_temp, cub_temp_bytes, t->cub_srcs, t->cub_dsts, t->cub_sizes, 1,
                            stream);
}

}  // namespace hss::kernels
