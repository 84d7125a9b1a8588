// hss-store-loop: one operation in a loop, for profilers (perf, callgrind): nothing else runs in
// the process after the setup, so every sample of the loop is the operation's.
//
//   hss-store-loop store|retrieve|fresh|stream|memcpy [ITERATIONS] [--tokens N] [--hidden N]
//                  [--copy-threads N] [--alternate]
//   hss-store-loop batch-store|single-store|batch-retrieve|single-retrieve [ITERATIONS]
//                  [--chunks 1|2] [--kv]
//
// store: store_hidden_states of N x hidden float32 rows (chunk 256) into an empty pool (its keys
// dropped, untimed, before every iteration); retrieve: retrieve_hidden_states_into a caller's
// buffer; fresh: retrieve_hidden_states into a fresh HostTensor (the output recycler's buffer,
// released before the next iteration); stream / memcpy: the bench's references over the same
// bytes. Prints the median time, its p10..p90, the rate, the minor page faults per iteration and
// the store's host copy strategy. profiling/perf_host_store.sh drives it.
// batch-* / single-*: `hss-bench batch`'s engine step (batch_step.hpp) as one batch call or as
// 768 single calls, of two-chunk prefixes or (--chunks 1) one-chunk items, with (--kv) a KV side
// bound that holds every chunk (stores into a pool whose keys were dropped, untimed, before every
// iteration; retrieves of the stored step): prints the median per item and the minor page faults
// per iteration; what a profiler sees of one item, e.g.
//   valgrind --tool=callgrind --toggle-collect='hss::HiddenStateStore::store_*'
//       build/bench/hss-store-loop batch-store 30   (one command line)

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "batch_step.hpp"
#include "common.hpp"

namespace hss::bench {
namespace {

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

int usage() {
  std::fprintf(stderr,
               "usage: hss-store-loop store|retrieve|fresh|stream|memcpy [ITERATIONS] [--tokens N] "
               "[--hidden N] [--copy-threads N] [--alternate]\n"
               "       hss-store-loop batch-store|single-store|batch-retrieve|single-retrieve "
               "[ITERATIONS] [--chunks 1|2] [--kv]\n");
  return 2;
}

/// The batch step, one batch call or its single calls per iteration; prints the median per item.
int run_step(const std::string& mode, int iterations, int64_t chunks, bool kv) {
  const bool store = mode.ends_with("-store");
  const bool batch = mode.starts_with("batch-");
  const std::vector<float> rows(static_cast<size_t>(kStepMaxTokens * kStepHidden), 0.5f);
  std::vector<float> out_rows(static_cast<size_t>(kStepItems * kStepMaxTokens * kStepHidden));
  std::vector<void*> outs;
  for (int i = 0; i < kStepItems; ++i)
    outs.push_back(out_rows.data() + i * kStepMaxTokens * kStepHidden);
  StepStore s;
  const auto step = make_step(rows.data(), Device::kHost, outs, chunks);
  if (kv) s.bind_kv(*step);
  if (!store) (void)s.store.store_batch(step->stores);
  std::vector<double> seconds;
  long faults = 0;
  for (int i = 0; i < iterations; ++i) {
    if (store) s.drop_all(*step);
    const long faults_before = minor_faults();
    const auto start = std::chrono::steady_clock::now();
    if (store && batch) {
      (void)s.store.store_batch(step->stores);
    } else if (store) {
      for (const StoreItem& item : step->stores) {
        (void)s.store.store_hidden_states(item.token_ids, item.hidden_states, item.options);
      }
    } else if (batch) {
      (void)s.store.retrieve_batch_into(step->retrieves);
    } else {
      for (const RetrieveItem& item : step->retrieves) {
        (void)s.store.retrieve_hidden_states_into(item.token_ids, item.out, item.options);
      }
    }
    seconds.push_back(seconds_since(start));
    faults += minor_faults() - faults_before;
  }
  std::sort(seconds.begin(), seconds.end());
  std::printf(
      "%s: %d iterations of %d %lld-chunk items, median %.3f us per item, %.1f minor page faults "
      "per iteration\n",
      mode.c_str(), iterations, kStepItems, static_cast<long long>(chunks),
      seconds[seconds.size() / 2] / kStepItems * 1e6, static_cast<double>(faults) / iterations);
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string mode = argv[1];
  if (mode == "batch-store" || mode == "single-store" || mode == "batch-retrieve" ||
      mode == "single-retrieve") {
    int iterations = 20;
    int64_t chunks = 2;
    bool kv = false;
    for (int i = 2; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--chunks" && i + 1 < argc) {
        chunks = std::atoll(argv[++i]);
      } else if (arg == "--kv") {
        kv = true;
      } else if (!arg.empty() && arg[0] != '-') {
        iterations = std::atoi(argv[i]);
      } else {
        return usage();
      }
    }
    return iterations > 0 && chunks >= 1 && chunks <= kStepMaxChunks
               ? run_step(mode, iterations, chunks, kv)
               : usage();
  }
  if (mode != "store" && mode != "retrieve" && mode != "fresh" && mode != "stream" &&
      mode != "memcpy") {
    return usage();
  }
  int iterations = 20, copy_threads = 1;
  bool alternate = false;
  int64_t tokens = 16384, hidden = 4096;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> int64_t { return i + 1 < argc ? std::atoll(argv[++i]) : 0; };
    if (arg == "--tokens") {
      tokens = value();
    } else if (arg == "--hidden") {
      hidden = value();
    } else if (arg == "--alternate") {
      alternate = true;
    } else if (arg == "--copy-threads") {
      copy_threads = static_cast<int>(value());
    } else if (!arg.empty() && arg[0] != '-') {
      iterations = std::atoi(arg.c_str());
    } else {
      return usage();
    }
  }
  if (alternate && iterations < 2) return usage();
  if (iterations <= 0 || tokens <= 0 || hidden <= 0 || copy_threads <= 0) return usage();
  constexpr int64_t kChunk = 256;
  const auto bytes = static_cast<size_t>(tokens * hidden * 4);
  BareStore bare(kChunk, pool_bytes_for(tokens / kChunk, kChunk, hidden, 4), StorageDType::kFloat32,
                 StoreImpl::kStaging, copy_threads);
  CopyBuffer src(bytes), dst(bytes);
  const std::vector<int32_t> ids = make_tokens(tokens, 11);
  const TensorView view = host_view(src.data(), DType::kFloat32, tokens, hidden);
  const MutableTensorView out{dst.data(), DType::kFloat32, tokens, hidden, 0, Device::kHost, 0};
  CopyBuffer other_src(alternate ? bytes : 1), other_dst(alternate ? bytes : 1);
  std::vector<double> after_self, after_other;
  if (mode == "retrieve" || mode == "fresh") (void)bare.store.store_hidden_states(ids, view);

  std::vector<double> seconds;
  const long faults_before = minor_faults();
  for (int i = 0; i < iterations; ++i) {
    if (mode == "store") bare.drop(ids);
    const bool after_copy = alternate && i % 2 == 1;
    if (after_copy) std::memcpy(other_dst.data(), other_src.data(), bytes);
    const auto start = std::chrono::steady_clock::now();
    if (mode == "store") {
      (void)bare.store.store_hidden_states(ids, view);
    } else if (mode == "retrieve") {
      (void)bare.store.retrieve_hidden_states_into(ids, out);
    } else if (mode == "fresh") {
      const auto result = bare.store.retrieve_hidden_states(ids);
      if (result) do_not_optimize(result->data());
    } else if (mode == "stream") {
      stream_copy(dst.data(), src.data(), bytes);
    } else {
      std::memcpy(dst.data(), src.data(), bytes);
    }
    do_not_optimize(dst.data());
    seconds.push_back(seconds_since(start));
    if (alternate) (after_copy ? after_other : after_self).push_back(seconds.back());
  }
  const double faults_per_iteration =
      static_cast<double>(minor_faults() - faults_before) / iterations;
  std::sort(seconds.begin(), seconds.end());
  auto at = [&](double q) { return seconds[static_cast<size_t>(q * (seconds.size() - 1))]; };
  const double median = at(0.5);
  std::printf(
      "%s: %d iterations of %s, median %s, %.2f GB/s, %.1f minor faults per iteration\n"
      "  p10 %s, p25 %s, p75 %s, p90 %s\nhost copy: %s\n",
      mode.c_str(), iterations, format_bytes(static_cast<double>(bytes)).c_str(),
      format_seconds(median).c_str(), static_cast<double>(bytes) / median / 1e9,
      faults_per_iteration, format_seconds(at(0.1)).c_str(), format_seconds(at(0.25)).c_str(),
      format_seconds(at(0.75)).c_str(), format_seconds(at(0.9)).c_str(),
      bare.store.stats().host_copy.summary.c_str());
  if (alternate) {
    for (auto* v : {&after_self, &after_other}) std::sort(v->begin(), v->end());
    std::printf("  after itself: median %s; after another copy of the same size: median %s\n",
                format_seconds(after_self[after_self.size() / 2]).c_str(),
                format_seconds(after_other[after_other.size() / 2]).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace hss::bench

int main(int argc, char** argv) { return hss::bench::run(argc, argv); }
