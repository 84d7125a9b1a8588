// Workloads `batch` and `gpu_batch`: the per-item cost of an engine step (batch_step.hpp: 768
// items) issued as one batch call (store_batch / retrieve_batch_into) against the same items
// issued as single calls, for one-chunk items (issue 20's targets are for these) and two-chunk
// prefixes. gpu_batch does the same with device tensors (needs a device).

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "batch_step.hpp"
#include "common.hpp"

#if HSS_BENCH_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hss::bench {
namespace {

constexpr int64_t kChunk = kStepChunk;
constexpr int64_t kHidden = kStepHidden;
constexpr int64_t kMaxTokens = kStepMaxTokens;
constexpr int kLayers = kStepLayers;
constexpr int kItems = kStepItems;

/// "one-chunk items" / "two-chunk items": the case names' shape.
std::string shape_name(int64_t chunks) {
  return std::string(chunks == 1 ? "one" : "two") + "-chunk items";
}

void batch_case(Context& ctx, const std::string& workload, Device device, const void* rows,
                const std::vector<void*>& outs, const std::function<void()>& sync, int64_t chunks) {
  auto hss = std::make_shared<StepStore>();
  auto step = make_step(rows, device, outs, chunks);
  const int64_t tokens = step->tokens;
  const std::string shape = shape_name(chunks);
  const double bytes = static_cast<double>(kItems * tokens * kHidden * 4);
  auto drop_all = [hss, step] { hss->drop_all(*step); };
  auto store_batch = [hss, step, sync] {
    (void)hss->store.store_batch(step->stores);
    sync();
  };
  auto store_singles = [hss, step, sync] {
    for (const StoreItem& item : step->stores) {
      (void)hss->store.store_hidden_states(item.token_ids, item.hidden_states, item.options);
    }
    sync();
  };
  Params p;
  p.chunk_size = kChunk;
  p.hidden_dim = kHidden;
  p.tokens = tokens;
  p.layers = kLayers;
  p.dtype = "float32";
  p.storage = "float32";
  p.output = device == Device::kCuda ? "device" : "host";
  const Timed singles{"768 single calls", drop_all, store_singles, bytes, 0};
  // Figures are copied: measure() returns a reference into a vector that the next call grows.
  const Figure store_fig = ctx.report.measure(workload, "store_batch 768 " + shape, p,
                                              {"store_batch", drop_all, store_batch, bytes, 0},
                                              std::span<const Timed>(&singles, 1));
  auto fill = [hss, step, sync] {
    (void)hss->store.store_batch(step->stores);
    sync();
  };
  const Timed read_singles{"768 single calls", fill,
                           [hss, step, sync] {
                             for (const RetrieveItem& item : step->retrieves) {
                               (void)hss->store.retrieve_hidden_states_into(item.token_ids,
                                                                            item.out, item.options);
                             }
                             sync();
                           },
                           bytes, 0};
  const Timed read_batch{"retrieve_batch_into", fill,
                         [hss, step, sync] {
                           (void)hss->store.retrieve_batch_into(step->retrieves);
                           sync();
                         },
                         bytes, 0};
  const Figure read_fig = ctx.report.measure(workload, "retrieve_batch_into 768 " + shape, p,
                                             read_batch, std::span<const Timed>(&read_singles, 1));
  // The same reads with a KV side bound, as in an engine: every retrieve asks it contains() per
  // chunk (a batch once per chunk of a token list, single calls once per item).
  hss->bind_kv(*step);
  const Figure kv_fig =
      ctx.report.measure(workload, "retrieve_batch_into 768 " + shape + ", KV bound", p, read_batch,
                         std::span<const Timed>(&read_singles, 1));
  hss->store.bind_storage_manager(nullptr);
  if (device == Device::kCuda) {
    // Launches and copy calls enqueued for one step, batch against single calls.
    auto launches = [hss] { return hss->store.stats().device_launches; };
    drop_all();
    uint64_t before = launches();
    store_batch();
    const uint64_t batch_store = launches() - before;
    drop_all();
    before = launches();
    store_singles();
    const uint64_t single_store = launches() - before;
    before = launches();
    (void)hss->store.retrieve_batch_into(step->retrieves);
    sync();
    const uint64_t batch_read = launches() - before;
    char line[256];
    std::snprintf(line, sizeof line,
                  "device launches per step of %d %s: store_batch %llu vs %llu single calls; "
                  "retrieve_batch_into %llu",
                  kItems, shape.c_str(), static_cast<unsigned long long>(batch_store),
                  static_cast<unsigned long long>(single_store),
                  static_cast<unsigned long long>(batch_read));
    ctx.report.note(workload, line);
  }
  for (const Figure* f : {&store_fig, &read_fig, &kv_fig}) {
    const double batch_us = f->seconds.median / kItems * 1e6;
    const double single_us = f->refs.front().seconds.median / kItems * 1e6;
    char line[256];
    std::snprintf(line, sizeof line,
                  "%s: %.2f us per item in one batch, %.2f us per single call, batch %.2fx faster",
                  f->name.c_str(), batch_us, single_us, f->refs.front().ratio.median);
    ctx.report.note(workload, line);
  }
}

}  // namespace

void run_batch(Context& ctx) {
  const auto rows = random_f32(kMaxTokens * kHidden, 61);
  auto out_store =
      std::make_shared<std::vector<float>>(static_cast<size_t>(kItems * kMaxTokens * kHidden));
  std::vector<void*> outs;
  for (int i = 0; i < kItems; ++i) outs.push_back(out_store->data() + i * kMaxTokens * kHidden);
  for (const int64_t chunks : {int64_t{1}, int64_t{2}}) {
    batch_case(
        ctx, "batch", Device::kHost, rows.data(), outs, [] {}, chunks);
  }
  ctx.report.print_workload("batch");
}

void run_gpu_batch(Context& ctx) {
#if HSS_BENCH_WITH_CUDA
  if (!build_info().cuda || !runtime_info().device_available) {
    ctx.report.skip("gpu_batch", "all cases", "no CUDA device (" + runtime_info().reason + ")");
    return;
  }
  const auto host_rows = random_f32(kMaxTokens * kHidden, 61);
  void* rows = nullptr;
  void* outs_base = nullptr;
  const size_t row_bytes = host_rows.size() * sizeof(float);
  if (cudaMalloc(&rows, row_bytes) != cudaSuccess ||
      cudaMalloc(&outs_base, row_bytes * kItems) != cudaSuccess) {
    ctx.report.skip("gpu_batch", "all cases", "cudaMalloc failed");
    return;
  }
  (void)cudaMemcpy(rows, host_rows.data(), row_bytes, cudaMemcpyHostToDevice);
  std::vector<void*> outs;
  for (int i = 0; i < kItems; ++i) outs.push_back(static_cast<char*>(outs_base) + i * row_bytes);
  for (const int64_t chunks : {int64_t{1}, int64_t{2}}) {
    batch_case(
        ctx, "gpu_batch", Device::kCuda, rows, outs, [] { (void)cudaStreamSynchronize(nullptr); },
        chunks);
  }
  ctx.report.print_workload("gpu_batch");
  (void)cudaFree(rows);
  (void)cudaFree(outs_base);
#else
  ctx.report.skip("gpu_batch", "all cases",
                  "no CUDA device (hss-bench built with HSS_WITH_CUDA=OFF)");
#endif
}

}  // namespace hss::bench
