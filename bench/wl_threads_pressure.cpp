// Workloads `threads` (1..N threads storing and retrieving disjoint prefixes of one store) and
// `pressure` (every store into a full pool evicts).

#include <algorithm>
#include <barrier>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "common.hpp"
#include "naive_store.hpp"

namespace hss::bench {
namespace {

/// Persistent worker threads, so a timed region pays two barrier crossings, not thread start-up.
class Gang {
 public:
  explicit Gang(int n) : start_(n + 1), done_(n + 1) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this, i] {
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          (*job_)(i);
          done_.arrive_and_wait();
        }
      });
    }
  }
  ~Gang() {
    stop_ = true;
    start_.arrive_and_wait();
  }
  Gang(const Gang&) = delete;
  Gang& operator=(const Gang&) = delete;

  /// Runs job(i) on worker i for every worker and returns when all are done.
  void run(const std::function<void(int)>& job) {
    job_ = &job;
    start_.arrive_and_wait();
    done_.arrive_and_wait();
  }
  [[nodiscard]] int size() const { return static_cast<int>(threads_.size()); }

 private:
  std::barrier<> start_, done_;
  const std::function<void(int)>* job_ = nullptr;
  bool stop_ = false;  // written before a barrier crossing, read after it
  std::vector<std::jthread> threads_;
};

struct ThreadsRig {
  int64_t chunk, hidden, tokens;
  int iterations;  // store + retrieve (+ drop) cycles per thread per run
  std::shared_ptr<BareStore> hss;
  std::vector<std::vector<int32_t>> prompts;  // one per thread, disjoint
  std::vector<std::vector<float>> rows;       // one input per thread
  std::vector<CopyBuffer> sinks;              // copy reference destinations

  ThreadsRig(int64_t c, int64_t h, int64_t t, int iters, int n)
      : chunk(c), hidden(h), tokens(t), iterations(iters) {
    hss =
        std::make_shared<BareStore>(c, pool_bytes_for(t / c * n, c, h, 4), StorageDType::kFloat32);
    for (int i = 0; i < n; ++i) {
      prompts.push_back(make_tokens(t, 1000 + static_cast<uint64_t>(i)));
      rows.push_back(random_f32(t * h, 50 + static_cast<uint64_t>(i)));
      sinks.emplace_back(static_cast<size_t>(t * h * 4));
    }
  }

  /// Thread i: store its prefix, retrieve it into a fresh tensor; with several iterations the
  /// drop that makes the next store write again is part of the loop.
  void work(int i) {
    const auto& prompt = prompts[static_cast<size_t>(i)];
    const TensorView view =
        host_view(rows[static_cast<size_t>(i)].data(), DType::kFloat32, tokens, hidden);
    for (int k = 0; k < iterations; ++k) {
      (void)hss->store.store_hidden_states(prompt, view);
      auto out = hss->store.retrieve_hidden_states(prompt);
      do_not_optimize(out ? out->data() : nullptr);
      if (iterations > 1) hss->drop(prompt);
    }
  }
  /// The same bytes moved by a copy: in, then out.
  void copy_work(int i, bool streaming) {
    auto& sink = sinks[static_cast<size_t>(i)];
    auto& src = rows[static_cast<size_t>(i)];
    for (int k = 0; k < iterations; ++k) {
      if (streaming) {
        stream_copy(sink.data(), src.data(), sink.size());
        stream_copy(src.data(), sink.data(), sink.size());
      } else {
        std::memcpy(sink.data(), src.data(), sink.size());
        do_not_optimize(sink.data());
        std::memcpy(src.data(), sink.data(), sink.size());
      }
      do_not_optimize(src.data());
    }
  }
  void drop_all() {
    for (const auto& p : prompts) hss->drop(p);
  }
  [[nodiscard]] double bytes_per_thread() const {
    return 2.0 * static_cast<double>(tokens * hidden * 4) * iterations;  // stored + retrieved
  }
};

/// One scaling series: 1..max_threads threads, each figure against the same work on one thread
/// (measured interleaved), plus the copy loops' own scaling, the machine's limit for these bytes.
void threads_series(Context& ctx, const std::string& label, int64_t hidden, int64_t tokens,
                    int iterations, int max_threads) {
  const int64_t chunk = 256;
  auto rig = std::make_shared<ThreadsRig>(chunk, hidden, tokens, iterations, max_threads);
  auto solo = std::make_shared<Gang>(1);
  const double per = rig->bytes_per_thread();
  const auto toks = static_cast<double>(tokens * iterations);
  auto prepare = [rig] { rig->drop_all(); };
  Timed one{"1 thread", prepare, [solo, rig] { solo->run([&](int i) { rig->work(i); }); }, per,
            toks};
  Timed copy_one{"memcpy 1 thread", nullptr,
                 [solo, rig] { solo->run([&](int i) { rig->copy_work(i, false); }); }, per, 0};
  Timed stream_one{"stream copy 1 thread", nullptr,
                   [solo, rig] { solo->run([&](int i) { rig->copy_work(i, true); }); }, per, 0};
  for (int n = 1; n <= max_threads; n *= 2) {
    auto gang = std::make_shared<Gang>(n);
    Timed cand{"store+retrieve", prepare, [gang, rig] { gang->run([&](int i) { rig->work(i); }); },
               per * n, toks * n};
    Params p;
    p.chunk_size = chunk;
    p.hidden_dim = hidden;
    p.tokens = tokens;
    p.threads = n;
    p.dtype = p.storage = "float32";
    p.output = "fresh";
    (void)ctx.report.measure("threads", "store+retrieve" + label, p, cand,
                             std::vector<Timed>{one, copy_one});
    if (n == 1) continue;
    Timed copy_n{"memcpy", nullptr,
                 [gang, rig] { gang->run([&](int i) { rig->copy_work(i, false); }); }, per * n, 0};
    (void)ctx.report.measure("threads", "memcpy" + label, p, copy_n,
                             std::span<const Timed>(&copy_one, 1));
    Timed stream_n{"stream copy", nullptr,
                   [gang, rig] { gang->run([&](int i) { rig->copy_work(i, true); }); }, per * n, 0};
    (void)ctx.report.measure("threads", "stream copy" + label, p, stream_n,
                             std::span<const Timed>(&stream_one, 1));
  }
}

}  // namespace

void run_threads(Context& ctx) {
  const int hw = static_cast<int>(std::max(2U, std::thread::hardware_concurrency()));
  // Memory-bound: a 64 MiB prefix per thread (the case).
  if (ctx.quick) {
    threads_series(ctx, "", 1024, 1024, 1, hw);
  } else {
    threads_series(ctx, "", 4096, 4096, 1, hw);
  }
  // Cache-resident: one 256 KiB chunk per thread, many calls, so the lock and the per-call
  // path are what scale (or not), not the memory bus.
  threads_series(ctx, " hot", 256, 256, ctx.quick ? 16 : 64, hw);
  ctx.report.print_workload("threads");
}

void run_pressure(Context& ctx) {
  const int64_t chunk = 256, hidden = ctx.quick ? 1024 : 4096;
  const int64_t pool_chunks = ctx.quick ? 16 : 64;
  const int64_t prompt_chunks = ctx.quick ? 4 : 16;
  const int64_t tokens = prompt_chunks * chunk;
  // Exactly pool_chunks chunks fit: the block is one chunk, the pool pool_chunks blocks.
  const uint64_t pool = static_cast<uint64_t>(pool_chunks * chunk * hidden * 4);
  auto full = std::make_shared<BareStore>(chunk, pool, StorageDType::kFloat32);
  auto roomy = std::make_shared<BareStore>(chunk, pool_bytes_for(prompt_chunks, chunk, hidden, 4),
                                           StorageDType::kFloat32);
  auto rows = std::make_shared<std::vector<float>>(random_f32(tokens * hidden, 23));
  const TensorView view = host_view(rows->data(), DType::kFloat32, tokens, hidden);
  auto prompt = std::make_shared<std::vector<int32_t>>(make_tokens(tokens, 29));
  // Fill the pool: from here on every chunk written evicts one.
  for (int64_t i = 0; i < pool_chunks / prompt_chunks + 1; ++i) {
    refresh_keys(*prompt);
    (void)full->store.store_hidden_states(*prompt, view);
  }
  const uint64_t evictions_before = full->store.stats().hs_evictions;

  const double bytes = static_cast<double>(tokens * hidden * 4);
  Timed cand{"store full pool", [prompt] { refresh_keys(*prompt); },
             [full, prompt, view] { (void)full->store.store_hidden_states(*prompt, view); }, bytes,
             static_cast<double>(tokens)};
  auto roomy_prompt = std::make_shared<std::vector<int32_t>>(make_tokens(tokens, 31));
  Timed peer{
      "store free pool", [roomy, roomy_prompt] { roomy->drop(*roomy_prompt); },
      [roomy, roomy_prompt, view] { (void)roomy->store.store_hidden_states(*roomy_prompt, view); },
      bytes, static_cast<double>(tokens)};
  struct NaiveState {
    ChunkedTokenDatabase db;
    NaiveStore naive;
    std::vector<int32_t> prompt;
    NaiveState(int64_t c, size_t capacity, int64_t n)
        : db(c, false), naive(db, capacity), prompt(make_tokens(n, 37)) {}
  };
  auto naive = std::make_shared<NaiveState>(chunk, static_cast<size_t>(pool), tokens);
  for (int64_t i = 0; i < pool_chunks / prompt_chunks + 1; ++i) {
    refresh_keys(naive->prompt);
    (void)naive->naive.store(naive->prompt, view, 0);
  }
  Timed naive_t{"naive", [naive] { refresh_keys(naive->prompt); },
                [naive, view] { (void)naive->naive.store(naive->prompt, view, 0); }, bytes, 0};
  Timed ref = memcpy_reference(rows->data(), static_cast<size_t>(bytes));
  ref.prepare = [rows] {};
  Params p;
  p.chunk_size = chunk;
  p.hidden_dim = hidden;
  p.tokens = tokens;
  p.dtype = p.storage = "float32";
  const std::vector<Timed> refs{ref, peer, naive_t};
  (void)ctx.report.measure("pressure", "store full pool", p, cand, refs);
  const HiddenStateStats stats = full->store.stats();
  ctx.report.note("pressure",
                  "pool of " + std::to_string(pool_chunks) +
                      " chunks: " + std::to_string(stats.hs_evictions - evictions_before) +
                      " keys evicted by the timed stores, " +
                      std::to_string(stats.allocation_failures) + " allocation failures");
  ctx.report.print_workload("pressure");
}

}  // namespace hss::bench
