#pragma once
// The measuring harness of hss-bench.
//
// Every figure is a candidate timed together with one or more references in the same process,
// interleaved rep by rep (the order rotates each rep), so a noisy neighbour slows both sides of a
// pair alike. A figure's ratio is the median over reps of the per-rep throughput ratio
// (candidate work per second / reference work per second), never a ratio of two medians taken
// minutes apart. A figure timed against both "memcpy" and "stream copy" of the same bytes also
// gets "faster copy": per rep, the faster of the two.
//
// Not thread-safe: one Report per process, used from the main thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hss::bench {

/// Keeps a computed value or a written buffer alive in the optimiser's eyes.
inline void do_not_optimize(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

struct Stats {
  double median = 0, min = 0, max = 0, p25 = 0, p75 = 0;
};
[[nodiscard]] Stats summarize(std::vector<double> values);

/// One timed operation: prepare() runs untimed before every run() (resets state, e.g. drops the
/// keys a store wrote), run() is timed. `bytes` is the work of one run, used for GB/s and for
/// throughput ratios; `tokens` feeds tokens/s (0 = not meaningful).
struct Timed {
  std::string name;
  std::function<void()> prepare;
  std::function<void()> run;
  double bytes = 0;
  double tokens = 0;
  /// Unit of the throughput ratio; 0 = bytes. Peers that do the same job with different bytes
  /// (native vs float32 storage) set it to tokens on both sides.
  double work = 0;

  [[nodiscard]] double ratio_work() const { return work > 0 ? work : bytes; }
};

struct RefResult {
  std::string name;
  Stats seconds;
  double bytes = 0;
  Stats ratio;  ///< per-rep (candidate bytes/s) / (reference bytes/s); > 1 = candidate faster
};

/// The parameters a figure was measured at; unset fields are 0 / empty and not printed.
struct Params {
  int64_t chunk_size = 0;
  int64_t hidden_dim = 0;
  int64_t tokens = 0;  ///< prefix length (per thread / per request as the case says)
  int64_t layers = 0;
  int64_t threads = 0;
  std::string dtype;    ///< caller's dtype: float32, bfloat16
  std::string storage;  ///< pool storage: float32, native
  std::string output;   ///< fresh, into, device, ...
};

struct Figure {
  std::string workload;
  std::string name;
  Params params;
  int reps = 0;
  Stats seconds;
  double bytes = 0;
  double tokens = 0;
  std::vector<RefResult> refs;

  [[nodiscard]] double gbps() const {
    return seconds.median > 0 ? bytes / seconds.median / 1e9 : 0;
  }
  [[nodiscard]] double tokens_per_s() const {
    return seconds.median > 0 ? tokens / seconds.median : 0;
  }
  [[nodiscard]] const RefResult* ref(std::string_view ref_name) const;
};

/// One issue target, evaluated from the figures at the end of a run.
struct Target {
  std::string text;       ///< the issue's wording
  std::string figure;     ///< "workload/name" of the figure it reads
  Params at;              ///< the figure's params must match the non-zero fields of this
  std::string reference;  ///< which reference of that figure
  double threshold = 0;   ///< ratio must be >= threshold (or <= when `at_most`)
  bool at_most = false;
  bool invert = false;  ///< compare 1/ratio (e.g. keys time as a fraction of retrieve time)
};

class Report {
 public:
  explicit Report(int default_reps) : default_reps_(default_reps) {}

  /// Times `candidate` and every reference `reps` times (default_reps when 0), interleaved, after
  /// one untimed warm-up of each, and records the figure.
  const Figure& measure(const std::string& workload, const std::string& name, const Params& params,
                        const Timed& candidate, std::span<const Timed> references, int reps = 0);
  /// Records a figure measured elsewhere (e.g. by a multi-threaded driver).
  const Figure& add(Figure figure);
  void skip(const std::string& workload, const std::string& what, const std::string& reason);
  void note(const std::string& workload, const std::string& text);

  /// Prints the figures of one workload as a table (call after the workload ran).
  void print_workload(const std::string& workload) const;
  void print_targets(std::span<const Target> targets) const;
  [[nodiscard]] bool write_json(const std::string& path, const std::string& command,
                                std::span<const Target> targets) const;
  /// Names every figure with a NaN or non-positive time, rate or ratio; empty when all are sound.
  [[nodiscard]] std::vector<std::string> unsound_figures() const;
  [[nodiscard]] const std::vector<Figure>& figures() const { return figures_; }
  [[nodiscard]] int default_reps() const { return default_reps_; }

 private:
  struct Skip {
    std::string workload, what, reason;
  };
  struct Note {
    std::string workload, text;
  };
  [[nodiscard]] const Figure* find(const std::string& key, const Params& at) const;
  struct TargetResult {
    double value = 0;
    bool found = false;
    bool pass = false;
  };
  [[nodiscard]] TargetResult evaluate(const Target& target) const;

  int default_reps_;
  std::vector<Figure> figures_;
  std::vector<Skip> skips_;
  std::vector<Note> notes_;
};

[[nodiscard]] double seconds_since(const std::chrono::steady_clock::time_point& start);

/// Human-readable sizes for tables.
[[nodiscard]] std::string format_bytes(double bytes);
[[nodiscard]] std::string format_seconds(double seconds);

}  // namespace hss::bench
