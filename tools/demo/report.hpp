#pragma once
// What hss-demo prints: live progress, the summary table and the same figures as JSON.
//
// Thread safety: none needed; the demo reports from its one thread.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "demo/pipeline.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/local_cpu_backend.hpp"

namespace hss::demo {

struct Summary {
  std::string path;         ///< "host" or "cuda"
  std::string path_detail;  ///< the device name, or why the host path was taken
  int64_t chunk_size = 0;
  int64_t hidden_dim = 0;
  std::vector<int64_t> layers;
  uint64_t seed = 0;
  PipelineResult pipeline;
  HiddenStateStats hs;
  KvStats kv;
  double wall_s = 0;
};

/// "1,2,3" for separator ",".
[[nodiscard]] std::string join(std::span<const int64_t> values, std::string_view separator);

void print_summary(std::FILE* out, const Summary& summary);
[[nodiscard]] std::string to_json(const Summary& summary);

/// Progress on stderr: one rewritten line on a terminal (at most ten a second), else a plain
/// line per tenth of the stream.
class Progress {
 public:
  explicit Progress(bool quiet);
  void update(const PipelineResult& result, int total_requests);
  void finish();

 private:
  bool quiet_;
  bool tty_;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point last_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace hss::demo
