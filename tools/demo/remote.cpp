#include "demo/remote.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>

#include "common/cli.hpp"
#include "demo/pipeline.hpp"
#include "hss/hss.hpp"

namespace hss::demo {
namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<Engine> make_engine(const RemoteDemoOptions& o) {
  Config cfg = o.config;
  cfg.hidden_state_remote_url = {o.url};
  Metadata metadata;
  metadata.model_name = "hss-demo";  // both processes: the keys must agree
  return Engine::create(cfg, metadata);
}

void store_kv(Engine& engine, std::span<const int32_t> tokens, int64_t full) {
  std::vector<uint16_t> kv(static_cast<size_t>(full * kKvWidth));
  workload::kv_rows(tokens, 0, full, kKvWidth, kv);
  (void)engine.store(tokens.first(static_cast<size_t>(full)),
                     TensorView{kv.data(), DType::kBFloat16, full, kKvWidth, 0, Device::kHost, 0});
}

// Process A: prefill, store KV and every layer's hidden states; the write-behind ships them.
int thinker(const RemoteDemoOptions& o) {
  const auto engine = make_engine(o);
  HiddenStateStore& hs = *engine->hidden_state_store();
  const int64_t chunk = o.config.chunk_size;
  const int64_t cols = o.workload.hidden_dim;
  const auto start = Clock::now();
  std::vector<uint16_t> hidden;
  int64_t chunks = 0;
  for (const workload::Request& r : o.requests) {
    const std::span<const int32_t> tokens(r.tokens);
    const int64_t full = static_cast<int64_t>(tokens.size()) / chunk * chunk;
    if (full == 0) continue;
    store_kv(*engine, tokens, full);
    hidden.resize(static_cast<size_t>(full * cols));
    for (const int64_t layer : o.workload.layers) {
      workload::thinker_rows(tokens, 0, full, layer, cols, hidden);
      (void)hs.store_hidden_states(
          tokens.first(static_cast<size_t>(full)),
          TensorView{hidden.data(), DType::kBFloat16, full, cols, 0, Device::kHost, 0}, {layer, 0});
    }
    chunks += full / chunk;
  }
  hs.flush();  // waits for the write-behind queue too
  const RemoteStats s = hs.stats().remote;
  std::printf(
      "thinker (pid %d): %zu requests, %lld chunks x %zu layers stored in %.2f s; remote: "
      "%llu writes sent (%s), %llu dropped, server %s\n",
      static_cast<int>(::getpid()), o.requests.size(), static_cast<long long>(chunks),
      o.workload.layers.size(), std::chrono::duration<double>(Clock::now() - start).count(),
      static_cast<unsigned long long>(s.writes_sent),
      cli::format_bytes(static_cast<double>(s.bytes_written)).c_str(),
      static_cast<unsigned long long>(s.dropped_writes),
      s.servers_connected == s.servers ? "up" : "DOWN");
  std::fflush(stdout);
  return s.writes_sent > 0 ? cli::kExitOk : cli::kExitFailure;
}

// Process B: an empty pool; its own KV; every layer restored through the remote tier.
int talker(const RemoteDemoOptions& o) {
  const auto engine = make_engine(o);
  HiddenStateStore& hs = *engine->hidden_state_store();
  const int64_t chunk = o.config.chunk_size;
  const int64_t cols = o.workload.hidden_dim;
  const auto start = Clock::now();
  int64_t wanted = 0, restored = 0, mismatched = 0;
  std::vector<uint16_t> expected;
  for (const workload::Request& r : o.requests) {
    const std::span<const int32_t> tokens(r.tokens);
    const int64_t full = static_cast<int64_t>(tokens.size()) / chunk * chunk;
    if (full == 0) continue;
    store_kv(*engine, tokens, full);
    wanted += full;
    const std::vector<HostTensor> layers = hs.retrieve_layers(tokens, o.workload.layers);
    if (layers.empty()) continue;
    const int64_t rows = layers.front().rows();
    restored += rows;
    expected.resize(static_cast<size_t>(rows * cols));
    for (size_t l = 0; l < layers.size(); ++l) {
      workload::thinker_rows(tokens, 0, rows, o.workload.layers[l], cols, expected);
      const auto got = layers[l].values();
      for (int64_t i = 0; i < rows * cols; ++i) {
        const uint32_t want = static_cast<uint32_t>(expected[static_cast<size_t>(i)]) << 16;
        if (std::bit_cast<uint32_t>(got[static_cast<size_t>(i)]) != want) {
          ++mismatched;
          if (mismatched <= 4) {
            std::fprintf(stderr, "talker: MISMATCH request %d layer %lld row %lld\n", r.id,
                         static_cast<long long>(o.workload.layers[l]),
                         static_cast<long long>(i / cols));
          }
          i = (i / cols + 1) * cols - 1;  // one per row
        }
      }
    }
  }
  const HiddenStateStats st = hs.stats();
  const RemoteStats& s = st.remote;
  std::printf(
      "talker  (pid %d): restored %lld of %lld stored rows (every layer) in %.2f s; "
      "remote: %llu hits (%s), %llu misses, %llu corrupt, %llu chunks read through; "
      "%lld mismatched rows\n",
      static_cast<int>(::getpid()), static_cast<long long>(restored),
      static_cast<long long>(wanted), std::chrono::duration<double>(Clock::now() - start).count(),
      static_cast<unsigned long long>(s.hits),
      cli::format_bytes(static_cast<double>(s.bytes_read)).c_str(),
      static_cast<unsigned long long>(s.misses), static_cast<unsigned long long>(s.corrupt_values),
      static_cast<unsigned long long>(s.read_through_chunks), static_cast<long long>(mismatched));
  std::fflush(stdout);
  return mismatched == 0 && s.hits > 0 ? cli::kExitOk : cli::kExitFailure;
}

// Runs fn in a child process; returns its exit status (1 when it died or threw).
int in_child(const char* name, int (*fn)(const RemoteDemoOptions&), const RemoteDemoOptions& o) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("hss-demo: fork");
    return cli::kExitFailure;
  }
  if (pid == 0) {
    int status = cli::kExitFailure;
    try {
      status = fn(o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hss-demo: %s failed: %s\n", name, e.what());
    }
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(status);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return cli::kExitFailure;
  return WEXITSTATUS(status);
}

}  // namespace

int run_remote_demo(const RemoteDemoOptions& o) {
  std::printf("hss-demo --remote %s: thinker and talker in two processes sharing one server\n",
              o.url.c_str());
  if (const int status = in_child("thinker", thinker, o); status != cli::kExitOk) {
    std::fprintf(stderr, "hss-demo: the thinker process failed (exit %d)\n", status);
    return cli::kExitFailure;
  }
  if (const int status = in_child("talker", talker, o); status != cli::kExitOk) {
    std::fprintf(stderr, "hss-demo: FAILED: the talker process failed (exit %d)\n", status);
    return cli::kExitFailure;
  }
  std::printf("hss-demo --remote: OK, every restored row bit-identical\n");
  return cli::kExitOk;
}

}  // namespace hss::demo
