// Workloads `keys` (hashing a prompt into chunk keys) and `small` (one-chunk calls, where the
// per-call overhead is what a decode-time pipeline feels).

#include <cstring>
#include <memory>

#include "common.hpp"

namespace hss::bench {
namespace {

Timed keys_timed(int64_t chunk, const std::shared_ptr<std::vector<int32_t>>& tokens) {
  auto db = std::make_shared<ChunkedTokenDatabase>(chunk, false);
  Timed t;
  t.name = "keys";
  t.run = [db, tokens] {
    auto chunks = db->process_tokens(*tokens);
    do_not_optimize(chunks.data());
  };
  t.bytes = static_cast<double>(tokens->size() * sizeof(int32_t));
  t.tokens = static_cast<double>(tokens->size());
  return t;
}

}  // namespace

void run_keys(Context& ctx) {
  const std::vector<int64_t> lengths =
      ctx.quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{1024, 4096, 16384, 32768};
  const std::vector<int64_t> chunks =
      ctx.quick ? std::vector<int64_t>{256} : std::vector<int64_t>{64, 256, 1024};
  for (int64_t chunk : chunks) {
    for (int64_t n : lengths) {
      auto tokens = std::make_shared<std::vector<int32_t>>(make_tokens(n, 17));
      Params p;
      p.chunk_size = chunk;
      p.tokens = n;
      Timed ref = memcpy_reference(tokens->data(), tokens->size() * sizeof(int32_t));
      ref.prepare = [tokens] {};
      (void)ctx.report.measure("keys", "keys", p, keys_timed(chunk, tokens),
                               std::span<const Timed>(&ref, 1));
    }
  }

  // The target: keys of a prompt against retrieving its hidden states (hidden_dim 4096).
  const int64_t n = ctx.quick ? 4096 : 32768;
  const int64_t hidden = ctx.quick ? 1024 : 4096;
  const int64_t chunk = 256;
  auto tokens = std::make_shared<std::vector<int32_t>>(make_tokens(n, 19));
  auto rig = std::make_shared<BareStore>(chunk, pool_bytes_for(n / chunk, chunk, hidden, 4),
                                         StorageDType::kFloat32);
  {
    const std::vector<float> rows = random_f32(n * hidden, 3);
    (void)rig->store.store_hidden_states(*tokens,
                                         host_view(rows.data(), DType::kFloat32, n, hidden));
  }
  Timed retrieve;
  retrieve.name = "retrieve fresh";
  retrieve.run = [rig, tokens] {
    auto out = rig->store.retrieve_hidden_states(*tokens);
    do_not_optimize(out ? out->data() : nullptr);
  };
  Timed keys = keys_timed(chunk, tokens);
  // A time ratio: both sides are "one prompt".
  keys.work = retrieve.work = 1;
  retrieve.bytes = static_cast<double>(n * hidden * 4);
  Params p;
  p.chunk_size = chunk;
  p.hidden_dim = hidden;
  p.tokens = n;
  (void)ctx.report.measure("keys", "keys vs retrieve", p, keys,
                           std::span<const Timed>(&retrieve, 1));
  ctx.report.print_workload("keys");
}

namespace {

/// Reads 8 MiB before a sample, so that the L1 and L2 caches hold other (clean) data whatever ran
/// last. Why: the harness alternates candidate and reference, so without it a sample ran half the
/// time after itself (its source, pool block and output still in L2) and half the time after the
/// reference (evicted); with a 2 MiB L2 (Sapphire Rapids) that can make one-chunk times bimodal
/// (issue 22: p25 40 us, median 72 us for the same call). 8 MiB is more than any current L2;
/// the L3 keeps both sides' data, so each sample starts L2-cold and L3-warm alike. Reads, not
/// writes: dirty scratch lines would make the timed copy pay their write-back.
struct CacheSettler {
  CopyBuffer scratch{size_t{8} << 20};
  void settle() const {
    uint64_t sum = 0;
    const auto* words = reinterpret_cast<const uint64_t*>(scratch.data());
    for (size_t i = 0; i < scratch.size() / 8; i += 8) sum += words[i];  // one word per line
    do_not_optimize(&sum);
  }
};

/// One figure set of `small`: `batch` distinct one-chunk prompts per sample. batch 1 is the
/// literal decode-time loop (store a chunk, retrieve it, the block is reused next call, so it is
/// in L3), each sample after a CacheSettler read when `settle`; a larger batch spreads the calls
/// over `batch` pool blocks (cache-cold).
void small_case(Context& ctx, int64_t hidden, int batch, const std::string& suffix, int reps,
                bool settle) {
  const int64_t chunk = 256;
  auto hss = std::make_shared<BareStore>(chunk, pool_bytes_for(batch, chunk, hidden, 4),
                                         StorageDType::kFloat32);
  auto prompts = std::make_shared<std::vector<std::vector<int32_t>>>();
  for (int i = 0; i < batch; ++i) {
    prompts->push_back(make_tokens(chunk, 100 + static_cast<uint64_t>(i)));
  }
  auto rows = std::make_shared<std::vector<float>>(random_f32(chunk * hidden, 5));
  const TensorView view = host_view(rows->data(), DType::kFloat32, chunk, hidden);
  auto out = std::make_shared<CopyBuffer>(static_cast<size_t>(chunk * hidden * 4));
  const MutableTensorView out_view{out->data(), DType::kFloat32, chunk, hidden,
                                   0,           Device::kHost,   0};
  const double bytes = static_cast<double>(chunk * hidden * 4) * batch;
  const double tokens = static_cast<double>(chunk * batch);
  auto settler = settle ? std::make_shared<const CacheSettler>() : nullptr;
  auto settled = [settler] {
    if (settler) settler->settle();
  };
  auto drop_all = [hss, prompts, settled] {
    for (const auto& p : *prompts) hss->drop(p);
    settled();
  };
  auto store_all = [hss, prompts, view, settled] {
    for (const auto& p : *prompts) (void)hss->store.store_hidden_states(p, view);
    settled();
  };

  // memcpy of one chunk's bytes per call, into a buffer that already exists.
  Timed ref = memcpy_reference(rows->data(), static_cast<size_t>(chunk * hidden * 4));
  {
    Timed one = ref;
    ref.run = [one, batch] {
      for (int i = 0; i < batch; ++i) one.run();
    };
    ref.bytes = bytes;
    ref.prepare = [rows, settled] { settled(); };
  }

  Params p;
  p.chunk_size = chunk;
  p.hidden_dim = hidden;
  p.tokens = chunk;
  p.dtype = "float32";
  p.storage = "float32";
  const std::span<const Timed> refs(&ref, 1);

  p.output = "fresh";
  (void)ctx.report.measure("small", "store+retrieve fresh" + suffix, p,
                           {"store+retrieve fresh", drop_all,
                            [hss, prompts, view] {
                              for (const auto& prompt : *prompts) {
                                (void)hss->store.store_hidden_states(prompt, view);
                                auto r = hss->store.retrieve_hidden_states(prompt);
                                do_not_optimize(r ? r->data() : nullptr);
                              }
                            },
                            bytes, tokens},
                           refs, reps);
  p.output = "into";
  (void)ctx.report.measure("small", "store+retrieve into" + suffix, p,
                           {"store+retrieve into", drop_all,
                            [hss, prompts, view, out_view] {
                              for (const auto& prompt : *prompts) {
                                (void)hss->store.store_hidden_states(prompt, view);
                                (void)hss->store.retrieve_hidden_states_into(prompt, out_view);
                              }
                              do_not_optimize(out_view.data);
                            },
                            bytes, tokens},
                           refs, reps);
  p.output = "";
  (void)ctx.report.measure("small", "store" + suffix, p,
                           {"store", drop_all,
                            [hss, prompts, view] {
                              for (const auto& prompt : *prompts) {
                                (void)hss->store.store_hidden_states(prompt, view);
                              }
                            },
                            bytes, tokens},
                           refs, reps);
  p.output = "fresh";
  (void)ctx.report.measure("small", "retrieve fresh" + suffix, p,
                           {"retrieve fresh", store_all,
                            [hss, prompts] {
                              for (const auto& prompt : *prompts) {
                                auto r = hss->store.retrieve_hidden_states(prompt);
                                do_not_optimize(r ? r->data() : nullptr);
                              }
                            },
                            bytes, tokens},
                           refs, reps);
  p.output = "into";
  (void)ctx.report.measure("small", "retrieve into" + suffix, p,
                           {"retrieve into", store_all,
                            [hss, prompts, out_view] {
                              for (const auto& prompt : *prompts) {
                                (void)hss->store.retrieve_hidden_states_into(prompt, out_view);
                              }
                              do_not_optimize(out_view.data);
                            },
                            bytes, tokens},
                           refs, reps);
}

}  // namespace

void run_small(Context& ctx) {
  // Per-call figures: many short samples, the median is what a decode step pays.
  const int reps = ctx.quick ? 31 : 301;
  ctx.report.note("small",
                  "the one-chunk figures (not cold pool, not tiny) start every sample, "
                  "candidate and reference alike, after reading 8 MiB of scratch");
  small_case(ctx, 1024, 1, "", reps, true);
  // The same back to back: each sample's cache state depends on what ran before it.
  small_case(ctx, 1024, 1, " unsettled", reps, false);
  // The same calls spread over 32 pool blocks that are not in cache.
  small_case(ctx, 1024, 32, " cold pool", ctx.quick ? 3 : 15, false);
  // hidden_dim 16: 16 KiB per chunk, so the time is the per-call overhead.
  small_case(ctx, 16, 1, " tiny", reps, false);
  ctx.report.print_workload("small");
}

}  // namespace hss::bench
