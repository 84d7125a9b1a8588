// hsstore._cpp_bench: the same calls bench/py_bench.py makes from Python, timed in C++ in the
// same process, so the Python figures have a same-run native reference (per-call overhead =
// Python time - C++ time). Not part of the public API.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "hss/config.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"

namespace hss::python {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

template <typename T>
void keep(const T* p) {
  asm volatile("" : : "g"(p) : "memory");
}

std::vector<double> run(const std::string& workload, int64_t chunk_size, int64_t hidden_dim,
                        int64_t tokens, int reps) {
  if (chunk_size <= 0 || hidden_dim <= 0 || tokens <= 0 || reps <= 0) {
    throw InvalidArgument("_cpp_bench: chunk_size, hidden_dim, tokens and reps must be > 0");
  }
  Config config;
  config.chunk_size = chunk_size;
  config.enable_hidden_state_cache = true;
  // Room for the rows twice over (a store of fresh keys while the old ones are still held).
  config.max_hidden_state_cpu_size =
      static_cast<double>(2 * tokens * hidden_dim * 4 + (64 << 20)) / (1024.0 * 1024 * 1024);
  ChunkedTokenDatabase db(chunk_size, false);
  HiddenStateStore store(config, db);
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i * 7 + 1);
  std::vector<float> rows(static_cast<size_t>(tokens * hidden_dim));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (float& v : rows) v = dist(rng);
  const TensorView view{rows.data(), DType::kFloat32, tokens, hidden_dim, 0, Device::kHost, 0};
  const std::vector<Chunk> chunks = db.process_tokens(std::span<const int32_t>(ids));
  auto drop_all = [&] {
    for (const Chunk& c : chunks) (void)store.drop_key(c.key);
  };

  std::vector<double> out;
  out.reserve(static_cast<size_t>(reps));
  const bool needs_data = workload == "retrieve" || workload == "tail8";
  if (needs_data) (void)store.store_hidden_states(std::span<const int32_t>(ids), view);
  for (int r = -1; r < reps; ++r) {  // r == -1: untimed warm-up
    double t = 0;
    if (workload == "one_chunk") {
      const auto start = Clock::now();
      (void)store.store_hidden_states(std::span<const int32_t>(ids), view);
      auto res = store.retrieve_hidden_states(std::span<const int32_t>(ids));
      keep(res ? res->data() : nullptr);
      drop_all();
      t = seconds(start);
    } else if (workload == "store") {
      drop_all();
      const auto start = Clock::now();
      (void)store.store_hidden_states(std::span<const int32_t>(ids), view);
      t = seconds(start);
    } else if (workload == "retrieve" || workload == "tail8") {
      RetrieveOptions options;
      options.row_begin = workload == "tail8" ? tokens - 8 : 0;
      const auto start = Clock::now();
      auto res = store.retrieve_hidden_states(std::span<const int32_t>(ids), options);
      keep(res ? res->data() : nullptr);
      t = seconds(start);
    } else if (workload == "miss") {
      const auto start = Clock::now();
      auto res = store.retrieve_hidden_states(std::span<const int32_t>(ids));
      keep(res ? res->data() : nullptr);
      t = seconds(start);
    } else if (workload == "keys") {
      const auto start = Clock::now();
      auto c = db.process_tokens(std::span<const int32_t>(ids));
      keep(c.data());
      t = seconds(start);
    } else {
      throw InvalidArgument("_cpp_bench: unknown workload '" + workload + "'");
    }
    if (r >= 0) out.push_back(t);
  }
  return out;
}

}  // namespace

void bind_bench(nb::module_& m) {
  m.def(
      "_cpp_bench",
      [](const std::string& workload, int64_t chunk_size, int64_t hidden_dim, int64_t tokens,
         int reps) {
        nb::gil_scoped_release release;
        return run(workload, chunk_size, hidden_dim, tokens, reps);
      },
      nb::arg("workload"), nb::arg("chunk_size"), nb::arg("hidden_dim"), nb::arg("tokens"),
      nb::arg("reps"),
      "Seconds per call of a workload (one_chunk, store, retrieve, tail8, miss, keys) timed in "
      "C++ on a store without a storage manager; for bench/py_bench.py.");
}

}  // namespace hss::python
