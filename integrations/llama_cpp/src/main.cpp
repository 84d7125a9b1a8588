// hss-llama: a C++ engine (llama.cpp) linking hsstore. A thinker runs prompts that share a prefix;
// a talker reads the thinker's final hidden states as input embeddings and generates tokens.
//
//   hss-llama --models DIR [--thinker FILE] [--threads N] [--prompt-tokens N] [--chunk N]
//             [--new-tokens N] [--bench ROUNDS]
//
// DIR holds thinker.gguf and talker.gguf (make_tiny_models.py); --thinker another thinker (the
// talker must have its width). The demo prints, for a cold
// request and requests sharing 25%, 75% and 100% of its prefix, the rows restored and computed
// and whether the hidden states, the talker's tokens and its logits equal a cold run's (a fresh
// context and store); then the KV-only counter-example. Exit 0 when every warm run equals its
// cold run and the KV-only input is truncated, 1 otherwise (a ctest of label llama runs it).
// --bench: time until the consumer holds every hidden state of a 75%-cached prompt, hsstore
// (restore 75%, compute 25%) against a full recompute, interleaved rounds; median and range.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "hss/config.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"
#include "hss_llama/talker.hpp"
#include "hss_llama/thinker.hpp"

namespace {

using hss::llama_cpp::Talker;
using hss::llama_cpp::TalkerOptions;
using hss::llama_cpp::Thinker;
using hss::llama_cpp::ThinkerOptions;
using hss::llama_cpp::ThinkerResult;

struct Args {
  std::string models;
  std::string thinker;  ///< default: models/thinker.gguf
  int threads = 1;
  int prompt_tokens = 128;
  int chunk = 16;
  int new_tokens = 4;
  int bench_rounds = 0;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "hss-llama: %s\nusage: hss-llama --models DIR [--threads N] [--prompt-tokens N] "
               "[--chunk N] [--new-tokens N] [--bench ROUNDS]\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + flag).c_str());
    const char* value = argv[++i];
    auto number = [&] {
      char* end = nullptr;
      const long v = std::strtol(value, &end, 10);
      if (*value == '\0' || *end != '\0' || v < 0 || v > 1 << 20) {
        usage((flag + ": not a count: " + value).c_str());
      }
      return static_cast<int>(v);
    };
    if (flag == "--models")
      args.models = value;
    else if (flag == "--thinker")
      args.thinker = value;
    else if (flag == "--threads")
      args.threads = number();
    else if (flag == "--prompt-tokens")
      args.prompt_tokens = number();
    else if (flag == "--chunk")
      args.chunk = number();
    else if (flag == "--new-tokens")
      args.new_tokens = number();
    else if (flag == "--bench")
      args.bench_rounds = number();
    else
      usage(("unknown option " + flag).c_str());
  }
  if (args.models.empty()) usage("--models is required");
  if (args.thinker.empty()) args.thinker = args.models + "/thinker.gguf";
  return args;
}

/// Deterministic token ids in [0, vocab): the same prompt in every run.
std::vector<int32_t> tokens(uint64_t seed, int n, int vocab) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (int32_t& t : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t = static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
  }
  return out;
}

std::vector<int32_t> sharing(const std::vector<int32_t>& base, int shared, uint64_t seed,
                             int vocab) {
  std::vector<int32_t> out(base.begin(), base.begin() + shared);
  const std::vector<int32_t> tail = tokens(seed, static_cast<int>(base.size()) - shared, vocab);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

bool same_bits(const hss::HostTensor& a, const hss::HostTensor& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

/// One engine: its config, token database, store, thinker and talker.
struct Engine {
  hss::Config config;
  hss::ChunkedTokenDatabase token_database;
  std::unique_ptr<hss::HiddenStateStore> store;
  std::unique_ptr<Thinker> thinker;

  Engine(const Args& args, bool use_store)
      : config(make_config(args)),
        token_database(args.chunk, true, hss::Metadata{"llama.cpp", "thinker.gguf", 1, 0, "f32"}) {
    if (use_store) store = std::make_unique<hss::HiddenStateStore>(config, token_database);
    ThinkerOptions options;
    options.model_path = args.thinker;
    options.threads = args.threads;
    options.use_hidden_state_store = use_store;
    thinker = std::make_unique<Thinker>(options, store.get(), token_database);
  }
  static hss::Config make_config(const Args& args) {
    hss::Config config;
    config.chunk_size = args.chunk;
    config.save_unfull_chunk = true;
    config.max_hidden_state_cpu_size = 0.0625;  // GiB: far more than these prompts need
    return config;
  }
};

const char* yes(bool b) { return b ? "yes" : "NO"; }

int demo(const Args& args) {
  Engine engine(args, true);
  Talker talker({args.models + "/talker.gguf", 256, args.threads}, engine.thinker->n_embd());
  const int vocab = engine.thinker->n_vocab();
  const int n = args.prompt_tokens;
  const std::vector<int32_t> base = tokens(1, n, vocab);
  std::printf(
      "hss-llama: thinker %d layers x %d wide (captures l_out-%d and the final state), "
      "talker reads its final states; %d-token prompts, %d-token chunks, %d thread(s)\n",
      engine.thinker->n_layer(), engine.thinker->n_embd(), engine.thinker->capture_layer(), n,
      args.chunk, args.threads);
  std::printf("%-8s %6s %9s %9s %16s %16s %14s\n", "request", "shared", "restored", "computed",
              "states==cold", "talker==cold", "logits==cold");
  bool ok = true;
  struct Request {
    const char* name;
    int shared_percent;
  };
  const Request requests[] = {{"cold", 0}, {"25%", 25}, {"75%", 75}, {"100%", 100}};
  std::vector<int32_t> kv_only_prompt;
  for (const Request& request : requests) {
    const int shared = n * request.shared_percent / 100;
    const std::vector<int32_t> prompt =
        request.shared_percent == 0 || request.shared_percent == 100
            ? base
            : sharing(base, shared, 100 + static_cast<uint64_t>(request.shared_percent), vocab);
    if (request.shared_percent == 75) kv_only_prompt = prompt;
    const ThinkerResult warm = engine.thinker->run(prompt);
    const hss::llama_cpp::TalkerOutput said = talker.generate(warm.final_states, args.new_tokens);
    Engine cold_engine(args, true);
    const ThinkerResult cold = cold_engine.thinker->run(prompt);
    const hss::llama_cpp::TalkerOutput cold_said =
        talker.generate(cold.final_states, args.new_tokens);
    const bool states = same_bits(warm.final_states, cold.final_states) &&
                        same_bits(warm.layer_states, cold.layer_states);
    const bool talk = said.tokens == cold_said.tokens;
    const bool logits = said.logits.size() == cold_said.logits.size() &&
                        std::memcmp(said.logits.data(), cold_said.logits.data(),
                                    said.logits.size() * sizeof(float)) == 0;
    std::printf("%-8s %6d %9lld %9lld %16s %16s %14s\n", request.name, shared,
                static_cast<long long>(warm.rows_restored),
                static_cast<long long>(warm.rows_computed), yes(states), yes(talk), yes(logits));
    ok = ok && states && talk && logits && warm.rows_restored + warm.rows_computed == n;
  }
  std::string said_tokens;
  {
    Engine cold_engine(args, true);
    for (int32_t t :
         talker.generate(cold_engine.thinker->run(base).final_states, args.new_tokens).tokens) {
      said_tokens += ' ';
      said_tokens += std::to_string(t);
    }
  }
  std::printf("talker's tokens for the base prompt:%s\n", said_tokens.c_str());

  // The counter-example: llama.cpp's KV prefix reuse alone.
  Engine kv_only(args, false);
  (void)kv_only.thinker->run(base);
  const ThinkerResult truncated = kv_only.thinker->run(kv_only_prompt);
  Engine cold_engine(args, true);
  const ThinkerResult cold = cold_engine.thinker->run(kv_only_prompt);
  const bool talk = talker.generate(truncated.final_states, args.new_tokens).tokens ==
                    talker.generate(cold.final_states, args.new_tokens).tokens;
  std::printf(
      "KV-only (no hsstore), 75%% request: llama.cpp reused the KV of %lld tokens and "
      "computed %lld rows, so the talker got %lld of %d rows: its input is TRUNCATED "
      "(the reused prefix yields no hidden states); talker==cold: %s\n",
      static_cast<long long>(truncated.kv_tokens_reused),
      static_cast<long long>(truncated.rows_computed),
      static_cast<long long>(truncated.final_states.rows()), n, talk ? "yes" : "no");
  ok = ok && truncated.final_states.rows() == n - truncated.kv_tokens_reused &&
       truncated.kv_tokens_reused > 0;
  std::printf("hss-llama: %s\n", ok ? "all as expected" : "SOMETHING DIFFERED");
  return ok ? 0 : 1;
}

int bench(const Args& args) {
  Engine engine(args, true);
  const int vocab = engine.thinker->n_vocab();
  const int n = args.prompt_tokens;
  const int shared = n * 3 / 4;
  const std::vector<int32_t> base = tokens(7, n, vocab);
  (void)engine.thinker->run(base);
  std::vector<double> with_store, recompute;
  using Clock = std::chrono::steady_clock;
  for (int round = 0; round < args.bench_rounds; ++round) {
    const std::vector<int32_t> cached = sharing(base, shared, 1000 + 2 * round, vocab);
    const std::vector<int32_t> fresh = tokens(1001 + 2 * static_cast<uint64_t>(round), n, vocab);
    for (int leg = 0; leg < 2; ++leg) {
      const bool store_leg = (leg == 0) == (round % 2 == 0);  // interleaved, order alternating
      const auto t0 = Clock::now();
      const ThinkerResult r = engine.thinker->run(store_leg ? cached : fresh);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (r.final_states.rows() != n || r.rows_restored != (store_leg ? shared : 0)) {
        std::fprintf(stderr, "hss-llama: bench round %d restored %lld rows\n", round,
                     static_cast<long long>(r.rows_restored));
        return 1;
      }
      (store_leg ? with_store : recompute).push_back(ms);
    }
  }
  auto report = [](const char* name, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const double median =
        v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    std::printf("%-34s median %8.3f ms  range %8.3f .. %8.3f ms  (%zu rounds)\n", name, median,
                v.front(), v.back(), v.size());
    return median;
  };
  std::printf(
      "hss-llama bench: %d-token prompt, 75%% (%d tokens) cached, %d-token chunks, "
      "%d thread(s), interleaved rounds\n",
      n, shared, args.chunk, args.threads);
  const double a = report("hsstore (restore 75%, compute 25%)", with_store);
  const double b = report("full recompute (100%)", recompute);
  std::printf("speedup (median): %.2fx\n", b / a);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    return args.bench_rounds > 0 ? bench(args) : demo(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hss-llama: %s\n", e.what());
    return 1;
  }
}
