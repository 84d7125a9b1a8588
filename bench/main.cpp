// hss-bench: hsstore's numbers, each a ratio to a reference measured in the same run.
//
//   hss-bench [WORKLOAD...] [--quick] [--check] [--json FILE] [--reps N]
//
// Exit status: 0 after a run; 1 when a workload failed (an exception) or, with --check, when a
// figure is NaN or zero; 2 on bad arguments. Never on a speed threshold: targets are a report.

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

namespace hss::bench {
namespace {

struct Workload {
  const char* name;
  void (*run)(Context&);
  const char* what;
};

constexpr Workload kWorkloads[] = {
    {"store", run_store, "host float32/bfloat16 (and device bfloat16) rows into the pool"},
    {"retrieve", run_retrieve, "a cached prefix into a fresh tensor, a caller's buffer, a device"},
    {"keys", run_keys, "hashing a prompt into chunk keys"},
    {"small", run_small, "store + retrieve of one 256 x 1024 chunk (per-call overhead)"},
    {"mixed", run_mixed, "replay of hss-demo's request stream against the naive store"},
    {"threads", run_threads, "1..N threads storing and retrieving disjoint prefixes"},
    {"pressure", run_pressure, "stores into a full pool: every write evicts"},
    {"gpu_store", run_gpu_store, "device rows stored + flush vs cudaMemcpyAsync D2H"},
    {"gpu_store_mapped", run_gpu_store_mapped,
     "device stores, hidden_state_store_impl staging vs mapped, vs cudaMemcpyAsync D2H"},
    {"gpu_retrieve", run_gpu_retrieve, "restore strategies into device memory vs H2D memcpy"},
    {"gpu_small", run_gpu_small, "one 256 x 1024 chunk: device store, restore vs cudaMemcpyAsync"},
    {"gpu_overlap", run_gpu_overlap,
     "store while the caller's stream is busy; restore during another stream's H2D copy"},
    {"gpu_fp8", run_gpu_fp8,
     "16K x 4096 device bf16 rows: fp8_e4m3 / fp8_e5m2 device store and restore vs bf16 ones"},
    {"gpu_tier", run_gpu_tier,
     "16K x 4096 device bf16 rows: resident restore (device tier) and a half-resident one vs "
     "D2D cudaMemcpyAsync and the pool restore; the write-through store vs the tier off"},
    {"remote", run_remote, "Redis tier: read-through restore vs raw GETs, store with tier on/off"},
    {"batch", run_batch,
     "768 host items (256 requests x 3 layers; one-chunk and two-chunk prefixes) as one batch vs "
     "single calls; the retrieve also with a KV side bound"},
    {"gpu_batch", run_gpu_batch, "the same with device items (needs a device)"},
    {"copy_threads", run_copy_threads,
     "16K x 4096 store/retrieve, default (auto) copy threads vs 1, 2, N, 2N and 1-/N-thread "
     "memcpy; the split crossover from 256 KiB to 64 MiB"},
    {"mac", run_mac,
     "HMAC-SHA256 and xxHash3 of a 256 MiB payload (remote-value checks) vs memcpy"},
    {"tiers", run_tiers,
     "pool hit, cold disk hit, promotion, spill and store with the disk tier on/off vs raw "
     "pread/pwrite of the same bytes; serial vs pooled preads (HSS_BENCH_DISK_DIR)"},
    {"fp8", run_fp8,
     "16K x 4096 float32 rows stored as fp8_e4m3 / fp8_e5m2 and retrieved into float32, vs the "
     "same with float32 storage and memcpy"},
};

// The issue's targets, read off the full run's figures (host path).
std::vector<Target> issue_targets() {
  auto at = [](int64_t chunk, int64_t hidden, int64_t tokens, int64_t threads = 0) {
    Params p;
    p.chunk_size = chunk;
    p.hidden_dim = hidden;
    p.tokens = tokens;
    p.threads = threads;
    return p;
  };
  return {
      {"retrieve 16K f32 h4096, fresh result: >= 0.8 of memcpy into an existing buffer",
       "retrieve/f32 fresh", at(256, 4096, 16384), "memcpy", 0.8},
      {"store bf16 native: >= 1.5x the tokens/s of bf16 with float32 storage",
       "store/bf16 native vs float32 storage", at(256, 4096, 16384), "store bf16 float32-storage",
       1.5},
      {"store from host f32: >= 0.7 of memcpy", "store/f32", at(256, 4096, 16384), "memcpy", 0.7},
      {"store from host bf16: >= 0.6 of memcpy of the float32 bytes written",
       "store/bf16 float32-storage", at(256, 4096, 16384), "memcpy", 0.6},
      {"keys of a 32K prompt: < 1% of retrieving it at h4096 (value = fraction)",
       "keys/keys vs retrieve", at(256, 4096, 32768), "retrieve fresh", 0.01, true, true},
      {"store + retrieve of one 256 x 1024 chunk: within 2x memcpy (value = memcpy/self)",
       "small/store+retrieve fresh", at(256, 1024, 256), "memcpy", 0.5},
      {"two threads on disjoint prefixes: >= 1.6x one thread", "threads/store+retrieve",
       at(256, 4096, 4096, 2), "1 thread", 1.6},
      {"mixed (hss-demo's config: native storage, pool = 1/2 working set): >= 5x naive",
       "mixed/replay native-storage half pool", at(256, 1024, 0), "naive", 5.0},
      {"mixed with float32 storage, pool = working set: >= 5x naive",
       "mixed/replay float32-storage", at(256, 1024, 0), "naive", 5.0},
      {"issue 22: store 16K f32 from host: >= 0.9 of the faster of memcpy and streaming copy",
       "store/f32", at(256, 4096, 16384), "faster copy", 0.9},
      {"issue 22: retrieve 16K f32, fresh tensor: >= 0.9 of the faster of memcpy and streaming",
       "retrieve/f32 fresh", at(256, 4096, 16384), "faster copy", 0.9},
      {"issue 22: retrieve 16K f32 into a buffer: >= 0.9 of the faster of memcpy and streaming",
       "retrieve/f32 into", at(256, 4096, 16384), "faster copy", 0.9},
      {"issue 22: one 256 x 1024 chunk, store + retrieve: >= 0.45 of memcpy",
       "small/store+retrieve fresh", at(256, 1024, 256), "memcpy", 0.45},
      {"issue 22: retrieve 16K f32 with 2 copy threads: >= 0.9 of a 2-thread memcpy",
       "retrieve/f32 fresh copy threads", at(256, 4096, 16384, 2), "memcpy 2 threads", 0.9},
      {"(the same against a 2-thread streaming copy, the stronger reference here)",
       "retrieve/f32 fresh copy threads", at(256, 4096, 16384, 2), "stream copy 2 threads", 0.9},
      {"remote read-through of 16K f32 h4096: >= 0.7 of raw pipelined GETs",
       "remote/read-through f32", at(256, 4096, 16384), "raw GETs", 0.7},
      {"write-behind adds <= 5% to store time (value = on/off throughput)",
       "remote/store f32 remote on", at(256, 4096, 16384), "remote off", 0.95},
      {"issue 32: disk hit (cold page cache) >= 0.8x the raw sequential read of the same bytes",
       "tiers/disk hit f32 cold", at(256, 4096, 16384), "raw read", 0.8},
      {"(the same against a raw O_DIRECT read)", "tiers/disk hit f32 cold", at(256, 4096, 16384),
       "raw read O_DIRECT", 0.8},
      {"(the same against a raw O_DIRECT read into huge pages, the strongest reference)",
       "tiers/disk hit f32 cold", at(256, 4096, 16384), "raw read O_DIRECT huge pages", 0.8},
      {"issue 32: spill slows a host store by <= 5% (value = on/off throughput)",
       "tiers/store f32 disk on", at(256, 4096, 16384), "disk off", 0.95},
  };
}

std::string machine_line() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads";
}

int usage(std::ostream& out, int status) {
  out << "usage: hss-bench [WORKLOAD...] [--quick] [--check] [--json FILE] [--reps N]\n"
         "  no WORKLOAD (or 'all') runs every workload\n"
         "  --quick      seconds-long version of each workload (ctest)\n"
         "  --check      exit 1 if any figure is NaN or zero\n"
         "  --json FILE  write every figure as JSON (bench/plot.py draws charts from it)\n"
         "  --reps N     timed repetitions per figure (default 7, 3 with --quick)\n"
         "workloads:\n";
  for (const Workload& w : kWorkloads) out << "  " << w.name << ": " << w.what << "\n";
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names;
  bool quick = false, check = false;
  std::string json;
  int reps = 0;
  std::string command = "hss-bench";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    command += " " + arg;
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--check") {
      check = true;
    } else if (arg == "--json" && i + 1 < argc) {
      json = argv[++i];
      command += " " + json;
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
      command += std::string(" ") + argv[i];
      if (reps <= 0) return usage(std::cerr, 2);
    } else if (arg == "--help" || arg == "-h") {
      return usage(std::cout, 0);
    } else if (!arg.empty() && arg[0] == '-') {
      std::cerr << "hss-bench: unknown option " << arg << "\n";
      return usage(std::cerr, 2);
    } else if (arg != "all") {
      bool known = false;
      for (const Workload& w : kWorkloads) known = known || arg == w.name;
      if (!known) {
        std::cerr << "hss-bench: unknown workload " << arg << "\n";
        return usage(std::cerr, 2);
      }
      names.push_back(arg);
    }
  }
  // The library logs at info by default; a benchmark's stderr should carry only problems.
  (void)setenv("HSS_LOG_LEVEL", "warn", 0);

  Report report(reps > 0 ? reps : (quick ? 3 : 7));
  Context ctx{report, quick};
  const std::time_t now = std::time(nullptr);
  std::cout << "hss-bench " << build_info().version << (quick ? " --quick" : "") << " on "
            << machine_line() << ", " << std::asctime(std::localtime(&now))
            << "ratios: candidate throughput / reference throughput, both measured in this run, "
               "interleaved rep by rep\n";
  int failures = 0;
  for (const Workload& w : kWorkloads) {
    if (!names.empty() && std::find(names.begin(), names.end(), w.name) == names.end()) continue;
    std::cout << "\n== " << w.name << ": " << w.what << " ==\n" << std::flush;
    try {
      w.run(ctx);
    } catch (const std::exception& e) {
      std::cerr << "hss-bench: workload " << w.name << " failed: " << e.what() << "\n";
      ++failures;
    }
  }
  // Only the targets whose workload ran: a GPU-only run has no host targets to report.
  std::vector<Target> targets;
  for (const Target& t : issue_targets()) {
    const std::string workload = t.figure.substr(0, t.figure.find('/'));
    if (names.empty() || std::find(names.begin(), names.end(), workload) != names.end()) {
      targets.push_back(t);
    }
  }
  if (!quick && !targets.empty()) report.print_targets(targets);
  if (!json.empty()) {
    if (!report.write_json(json, command, targets)) {
      std::cerr << "hss-bench: cannot write " << json << "\n";
      ++failures;
    } else {
      std::cout << "\nwrote " << json << "\n";
    }
  }
  if (check) {
    const auto bad = report.unsound_figures();
    for (const std::string& b : bad) std::cerr << "hss-bench --check: unsound figure " << b << "\n";
    if (!bad.empty()) ++failures;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace hss::bench

int main(int argc, char** argv) { return hss::bench::main(argc, argv); }
