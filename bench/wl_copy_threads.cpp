// copy_threads: what hidden_state_copy_threads buys, and where splitting a copy starts to pay.
//
//   * "store/retrieve default": a 16K x 4096 float32 prefix (256 MiB) stored and retrieved (fresh
//     tensor and caller's buffer) by a store with the default config (`auto`), against the same
//     store with 1, 2 and N copy threads (N: this thread's usable CPUs, and 2N to show what
//     oversubscription costs) and against the machine's 1- and N-thread memcpy of the same bytes.
//   * "split S": the crossover. host_store / host_restore of S bytes of float32 rows (granules of
//     at most 1 MiB, as the pool hands them out) split over 2 threads against the same call on
//     the calling thread, S from 256 KiB to 64 MiB. The smallest S at which the split wins is the
//     CPU family's crossover: 2 x HostCopyStats::min_bytes_per_copy_thread (host_copy.cpp).
#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common.hpp"
#include "config/copy_threads.hpp"
#include "datapath/data_path.hpp"
#include "datapath/host/copy_workers.hpp"
#include "datapath/host/host_copy.hpp"

namespace hss::bench {
namespace {

constexpr int64_t kHidden = 4096;

std::string threads_name(const std::optional<int64_t>& threads) {
  return threads ? std::to_string(*threads) + " copy threads" : std::string("default (auto)");
}

/// A store of `tokens` float32 rows, re-written every rep.
Timed store_timed(const std::optional<int64_t>& threads, int64_t tokens,
                  const std::shared_ptr<const CopyBuffer>& input) {
  auto store = std::make_shared<BareStore>(256, pool_bytes_for(tokens / 256, 256, kHidden, 4),
                                           StorageDType::kFloat32, StoreImpl::kStaging, threads);
  auto toks = std::make_shared<std::vector<int32_t>>(make_tokens(tokens, 21));
  const TensorView view = host_view(input->data(), DType::kFloat32, tokens, kHidden);
  Timed t;
  t.name = threads_name(threads);
  t.prepare = [store, toks] { store->drop(*toks); };
  t.run = [store, toks, view, input] { (void)store->store.store_hidden_states(*toks, view); };
  t.bytes = static_cast<double>(tokens * kHidden * 4);
  t.tokens = static_cast<double>(tokens);
  return t;
}

/// A store holding the prefix, read into a fresh tensor or into one caller buffer.
struct ReadRig {
  std::shared_ptr<BareStore> store;
  std::shared_ptr<std::vector<int32_t>> toks;
  int64_t tokens;
  std::optional<int64_t> threads;

  ReadRig(const std::optional<int64_t>& t, int64_t n, const std::shared_ptr<const CopyBuffer>& in)
      : store(std::make_shared<BareStore>(256, pool_bytes_for(n / 256, 256, kHidden, 4),
                                          StorageDType::kFloat32, StoreImpl::kStaging, t)),
        toks(std::make_shared<std::vector<int32_t>>(make_tokens(n, 23))),
        tokens(n),
        threads(t) {
    (void)store->store.store_hidden_states(*toks,
                                           host_view(in->data(), DType::kFloat32, n, kHidden));
  }
  [[nodiscard]] Timed fresh() const {
    Timed t;
    t.name = threads_name(threads);
    t.run = [s = store, k = toks] {
      auto out = s->store.retrieve_hidden_states(*k);
      do_not_optimize(out ? out->data() : nullptr);
    };
    t.bytes = static_cast<double>(tokens * kHidden * 4);
    return t;
  }
  [[nodiscard]] Timed into() const {
    auto out = std::make_shared<CopyBuffer>(static_cast<size_t>(tokens * kHidden * 4));
    Timed t;
    t.name = threads_name(threads);
    t.run = [s = store, k = toks, out, n = tokens] {
      const MutableTensorView view{out->data(), DType::kFloat32, n, kHidden, 0, Device::kHost, 0};
      (void)s->store.retrieve_hidden_states_into(*k, view);
      do_not_optimize(out->data());
    };
    t.bytes = static_cast<double>(tokens * kHidden * 4);
    return t;
  }
};

/// 1, 2, N and 2N (deduplicated, ascending).
std::vector<int64_t> thread_counts(int usable) {
  std::set<int64_t> counts{1, 2, usable, 2 * static_cast<int64_t>(usable)};
  return {counts.begin(), counts.end()};
}

void defaults_vs_counts(Context& ctx, int usable) {
  const int64_t tokens = ctx.quick ? 2048 : 16384;
  auto input = std::make_shared<const CopyBuffer>(random_f32(tokens * kHidden, 5).data(),
                                                  static_cast<size_t>(tokens * kHidden * 4));
  std::vector<Timed> store_refs;
  std::vector<ReadRig> read_rigs;
  for (const int64_t n : thread_counts(usable)) {
    store_refs.push_back(store_timed(n, tokens, input));
    read_rigs.emplace_back(n, tokens, input);
  }
  store_refs.push_back(memcpy_reference(input, 1, "memcpy 1 thread"));
  store_refs.push_back(memcpy_threads_reference(input, usable));

  Params p;
  p.chunk_size = 256;
  p.hidden_dim = kHidden;
  p.tokens = tokens;
  p.dtype = "float32";
  p.storage = "float32";
  (void)ctx.report.measure("copy_threads", "store default", p,
                           store_timed(std::nullopt, tokens, input), store_refs);

  const ReadRig def(std::nullopt, tokens, input);
  std::vector<Timed> fresh_refs, into_refs;
  for (const ReadRig& rig : read_rigs) {
    fresh_refs.push_back(rig.fresh());
    into_refs.push_back(rig.into());
  }
  for (std::vector<Timed>* refs : {&fresh_refs, &into_refs}) {
    refs->push_back(memcpy_reference(input, 1, "memcpy 1 thread"));
    refs->push_back(memcpy_threads_reference(input, usable));
  }
  p.output = "fresh";
  (void)ctx.report.measure("copy_threads", "retrieve default", p, def.fresh(), fresh_refs);
  p.output = "into";
  (void)ctx.report.measure("copy_threads", "retrieve default", p, def.into(), into_refs);
}

/// host_store or host_restore of `bytes` over `threads` (forced split) or the calling thread.
struct SplitRig {
  std::shared_ptr<CopyBuffer> pool;
  std::shared_ptr<CopyBuffer> caller;
  std::vector<kernels::WriteSegment> writes;
  std::vector<kernels::GatherSegment> reads;
  int64_t rows;

  explicit SplitRig(size_t bytes)
      : pool(std::make_shared<CopyBuffer>(bytes)),
        caller(std::make_shared<CopyBuffer>(bytes)),
        rows(static_cast<int64_t>(bytes / (kHidden * 4))) {
    const int64_t rows_per_granule = std::max<int64_t>(1, (int64_t{1} << 20) / (kHidden * 4));
    for (int64_t row = 0; row < rows; row += rows_per_granule) {
      const int64_t n = std::min(rows_per_granule, rows - row) * kHidden;
      auto* dst = reinterpret_cast<float*>(pool->data()) + row * kHidden;
      writes.push_back({dst, row, 0, n, kernels::ElemType::kFloat32});
      reads.push_back({dst, row * kHidden, n, kernels::ElemType::kFloat32});
    }
  }

  [[nodiscard]] Timed timed(bool store, int threads) const {
    std::shared_ptr<detail::CopyWorkers> workers;
    if (threads > 1) workers = std::make_shared<detail::CopyWorkers>(threads);
    // The store's strategy for this machine (streaming above its threshold, as a store runs it).
    const detail::HostCopyContext context{&detail::default_host_copy(), workers.get(), 1};
    Timed t;
    t.name = threads > 1 ? std::to_string(threads) + " threads" : "1 thread";
    t.run = [rig = *this, store, context, workers] {
      if (store) {
        detail::host_store({rig.caller->data(), kernels::ElemType::kFloat32, kHidden, kHidden},
                           rig.writes, context);
      } else {
        detail::host_restore(rig.reads, {rig.caller->data(), kHidden, kHidden}, context);
      }
      do_not_optimize(rig.caller->data());
      do_not_optimize(rig.pool->data());
    };
    t.bytes = static_cast<double>(rows * kHidden * 4);
    return t;
  }
};

void split_sweep(Context& ctx) {
  std::vector<size_t> sizes_kib{256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
  if (ctx.quick) sizes_kib = {512, 8192};
  for (const size_t kib : sizes_kib) {
    const SplitRig rig(kib << 10);
    for (const bool store : {true, false}) {
      Params p;
      p.hidden_dim = kHidden;
      p.tokens = rig.rows;
      p.threads = 2;
      p.dtype = "float32";
      const std::vector<Timed> refs{rig.timed(store, 1)};
      (void)ctx.report.measure(
          "copy_threads",
          std::string(store ? "store" : "restore") + " split " + std::to_string(kib) + " KiB", p,
          rig.timed(store, 2), refs);
    }
  }
}

}  // namespace

void run_copy_threads(Context& ctx) {
  const detail::CpuBudget budget = detail::this_thread_cpu_budget();
  const detail::CopyThreadsChoice chosen = detail::choose_copy_threads(std::nullopt, budget);
  const BareStore probe(256, uint64_t{64} << 20, StorageDType::kFloat32, StoreImpl::kStaging,
                        std::nullopt);
  const HostCopyStats copy = probe.store.stats().host_copy;
  ctx.report.note("copy_threads", "default: " + std::to_string(chosen.threads) + " copy threads (" +
                                      chosen.reason + "); splits parts of >= " +
                                      std::to_string(copy.min_bytes_per_copy_thread >> 10) +
                                      " KiB; " + copy.summary);
  defaults_vs_counts(ctx, budget.usable());
  split_sweep(ctx);
  ctx.report.print_workload("copy_threads");
}

}  // namespace hss::bench
