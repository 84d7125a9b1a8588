// hss-demo: the library end to end on a realistic workload, with nothing to prepare.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "common/cli.hpp"
#include "demo/device_stage.hpp"
#include "demo/pipeline.hpp"
#include "demo/remote.hpp"
#include "demo/report.hpp"
#include "hss/hss.hpp"
#include "workload/workload.hpp"

namespace {

using hss::cli::UsageError;

constexpr const char* kUsage = R"(usage: hss-demo [options]

Runs a thinker -> talker pipeline over one hss::Engine: multi-turn conversations sharing long
system prompts, KV and hidden states stored one chunk at a time, every restored value checked
bit for bit against the synthetic thinker. Exits 1 on any mismatch, naming request, layer, row.

  --requests N       requests in the stream (default 64)
  --hidden-dim N     hidden size of every layer (default 1024)
  --layers L,L,...   hidden-state layers: final state -1 plus taps (default -1,8,16)
  --seed N           workload seed (default 1)
  --max-prompt N     longest prompt in tokens (default 16384)
  --config FILE      YAML config instead of the built-in default (also: LMCACHE_CONFIG_FILE)
  --print-config     print the config the run would use and exit
  --json FILE        write the summary figures as JSON
  --host             use the host path even when a CUDA device is present
  --remote URL       thinker and talker as two processes sharing hidden states through a
                     Redis/Valkey server (redis://host:port); `make demo-remote` starts one
  --quiet            no progress lines
  --corrupt-restore  TEST ONLY: flip one bit of one restored row; the run must then fail
  --help             this text
)";

// Pools of the built-in config, as fractions of the stream's working set (distinct full chunks):
// the hidden-state pool holds half of it, the KV pool two fifths. Both below the working set, so
// pressure evicts hidden states on their own (HS-only) and KV first for prefixes whose hidden
// states survive (coupled, on the next restore that reaches them).
constexpr double kHsPoolFraction = 1.0 / 2.0;
constexpr double kKvPoolFraction = 2.0 / 5.0;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct DemoOptions {
  DemoOptions() { workload.max_prompt = 16384; }  // up to tens of thousands of tokens
  hss::workload::WorkloadOptions workload;
  std::string config_file;
  std::string json_file;
  bool print_config = false;
  bool force_host = false;
  bool quiet = false;
  bool corrupt_restore = false;
  std::string remote_url;
};

DemoOptions parse(int argc, char** argv, bool& help) {
  DemoOptions o;
  hss::cli::Args args(argc, argv);
  while (!args.done()) {
    if (args.take_flag("--help") || args.take_flag("-h")) {
      help = true;
    } else if (args.take_flag("--requests")) {
      o.workload.requests =
          static_cast<int>(hss::cli::parse_int("--requests", args.value("--requests"), 1, 1000000));
    } else if (args.take_flag("--hidden-dim")) {
      o.workload.hidden_dim =
          hss::cli::parse_int("--hidden-dim", args.value("--hidden-dim"), 1, 65536);
    } else if (args.take_flag("--layers")) {
      o.workload.layers =
          hss::cli::parse_int_list("--layers", args.value("--layers"), -1000000, 1000000);
    } else if (args.take_flag("--seed")) {
      o.workload.seed =
          static_cast<uint64_t>(hss::cli::parse_int("--seed", args.value("--seed"), 0, INT64_MAX));
    } else if (args.take_flag("--max-prompt")) {
      o.workload.max_prompt =
          hss::cli::parse_int("--max-prompt", args.value("--max-prompt"), 1, 1 << 22);
      o.workload.min_prompt = std::min(o.workload.min_prompt, o.workload.max_prompt);
    } else if (args.take_flag("--config")) {
      o.config_file = args.value("--config");
    } else if (args.take_flag("--json")) {
      o.json_file = args.value("--json");
    } else if (args.take_flag("--print-config")) {
      o.print_config = true;
    } else if (args.take_flag("--host")) {
      o.force_host = true;
    } else if (args.take_flag("--quiet")) {
      o.quiet = true;
    } else if (args.take_flag("--remote")) {
      o.remote_url = args.value("--remote");
    } else if (args.take_flag("--corrupt-restore")) {
      o.corrupt_restore = true;
    } else {
      throw UsageError("unknown argument '" + args.peek() + "'");
    }
  }
  return o;
}

/// The built-in config, sized from the workload so both eviction kinds happen at any scale.
std::string default_config_yaml(const DemoOptions& o, const hss::workload::StreamShape& shape) {
  const auto layers = static_cast<double>(o.workload.layers.size());
  const double working_tokens = static_cast<double>(shape.distinct_chunks * o.workload.chunk_size);
  const double hs_bytes = working_tokens * layers * static_cast<double>(o.workload.hidden_dim) * 2;
  const double kv_bytes = working_tokens * static_cast<double>(hss::demo::kKvWidth) * 2;
  // Whole chunk-sized granules, at least one of each layer's chunks.
  const double hs_granule = static_cast<double>(o.workload.chunk_size * o.workload.hidden_dim * 2);
  const double kv_granule = static_cast<double>(o.workload.chunk_size * hss::demo::kKvWidth * 2);
  const double hs_pool =
      std::max(layers, std::floor(hs_bytes * kHsPoolFraction / hs_granule)) * hs_granule;
  const double kv_pool =
      std::max(1.0, std::floor(kv_bytes * kKvPoolFraction / kv_granule)) * kv_granule;
  const std::string layer_list = hss::demo::join(o.workload.layers, ", ");
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "# hss-demo built-in config. Pools are sized from the workload: the hidden-state\n"
                "# pool holds 1/2 and the KV pool 2/5 of the %lld distinct chunks, so both kinds\n"
                "# of eviction happen. Native storage keeps bfloat16 as 16 bits (half the pool of\n"
                "# float32) and still restores bit-identical float32.\n"
                "chunk_size: %lld\n"
                "save_unfull_chunk: false\n"
                "max_local_cpu_size: %.17g\n"
                "enable_hidden_state_cache: true\n"
                "max_hidden_state_cpu_size: %.17g\n"
                "hidden_state_layers: [%s]\n"
                "hidden_state_storage_dtype: native\n",
                static_cast<long long>(shape.distinct_chunks),
                static_cast<long long>(o.workload.chunk_size), kv_pool / kGiB, hs_pool / kGiB,
                layer_list.c_str());
  return buf;
}

int run(const DemoOptions& o) {
  const auto wall_start = std::chrono::steady_clock::now();
  // The config decides the chunk size and the built-in config depends on the stream: load the
  // user's config first, build the stream second, size the built-in config last.
  std::optional<hss::Config> config;
  std::string source = "built-in";
  if (!o.config_file.empty()) {
    config = hss::Config::from_file(o.config_file);
    source = o.config_file;
  } else if (const char* env = std::getenv("LMCACHE_CONFIG_FILE"); env != nullptr && *env) {
    config = hss::Config::from_env();
    source = std::string("LMCACHE_CONFIG_FILE=") + env;
  }
  hss::workload::WorkloadOptions wo = o.workload;
  if (config) wo.chunk_size = config->chunk_size;
  const std::vector<hss::workload::Request> requests = hss::workload::make_requests(wo);
  const hss::workload::StreamShape shape = hss::workload::stream_shape(requests, wo.chunk_size);
  if (!config) {
    DemoOptions sized = o;
    sized.workload = wo;
    const std::string yaml = default_config_yaml(sized, shape);
    if (o.print_config) {
      std::printf("%s", yaml.c_str());
      return hss::cli::kExitOk;
    }
    config = hss::Config::from_yaml(yaml);
  } else if (o.print_config) {
    std::printf("# from %s\n%s", source.c_str(), config->to_yaml().c_str());
    return hss::cli::kExitOk;
  }
  if (!config->enable_hidden_state_cache) {
    std::fprintf(stderr,
                 "hss-demo: the config from %s has enable_hidden_state_cache: false; the "
                 "demo needs the hidden-state cache\n",
                 source.c_str());
    return hss::cli::kExitFailure;
  }
  for (int64_t layer : wo.layers) {
    if (!config->layer_allowed(layer)) {
      std::fprintf(stderr,
                   "hss-demo: warning: layer %lld is not in hidden_state_layers; the "
                   "talker will never hit\n",
                   static_cast<long long>(layer));
    }
  }

  if (!o.remote_url.empty()) {
    hss::demo::RemoteDemoOptions ro;
    ro.url = o.remote_url;
    ro.config = *config;
    if (source == "built-in") {
      // Each process keeps its own KV; here the KV pool holds the whole stream (twice over), so
      // the talker's restores show the remote tier rather than KV evictions (coupled eviction
      // works as in the one-process demo when a config says otherwise).
      const double kv_stream =
          static_cast<double>(shape.distinct_chunks * wo.chunk_size * hss::demo::kKvWidth * 2);
      ro.config.max_local_cpu_size = std::max(ro.config.max_local_cpu_size, 2 * kv_stream / kGiB);
    }
    ro.workload = wo;
    ro.requests = requests;
    ro.quiet = o.quiet;
    return hss::demo::run_remote_demo(ro);
  }

  hss::Metadata metadata;
  metadata.model_name = "hss-demo";
  const std::unique_ptr<hss::Engine> engine = hss::Engine::create(*config, metadata);
  std::string why_host = "--host";
  std::unique_ptr<hss::demo::DeviceStage> device;
  if (!o.force_host) device = hss::demo::DeviceStage::create(why_host);
  if (device && !engine->hidden_state_store()->stats().device_path) {
    why_host = "the store found no usable CUDA data path";
    device.reset();
  }

  hss::demo::Summary summary;
  summary.path = device ? "cuda" : "host";
  summary.path_detail = device ? device->name() : why_host;
  summary.chunk_size = config->chunk_size;
  summary.hidden_dim = wo.hidden_dim;
  summary.layers = wo.layers;
  summary.seed = wo.seed;
  std::fprintf(stderr,
               "hss-demo: %zu requests, %lld prompt tokens (%lld distinct chunks of %lld), "
               "hidden_dim %lld, %zu layers; config: %s; %s path (%s)\n",
               requests.size(), static_cast<long long>(shape.prompt_tokens),
               static_cast<long long>(shape.distinct_chunks),
               static_cast<long long>(config->chunk_size), static_cast<long long>(wo.hidden_dim),
               wo.layers.size(), source.c_str(), summary.path.c_str(), summary.path_detail.c_str());

  hss::demo::PipelineOptions po;
  po.layers = wo.layers;
  po.hidden_dim = wo.hidden_dim;
  po.draft_layer = wo.layers.front();
  po.corrupt_restore = o.corrupt_restore;
  po.device = device.get();
  hss::demo::Progress progress(o.quiet);
  summary.pipeline = hss::demo::run_pipeline(
      *engine, requests, po,
      [&](const hss::demo::PipelineResult& r, int total) { progress.update(r, total); });
  progress.finish();
  summary.hs = engine->hidden_state_store()->stats();
  summary.kv = engine->kv_backend().stats();
  summary.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  hss::demo::print_summary(stdout, summary);
  if (!o.json_file.empty()) {
    std::ofstream json(o.json_file);
    json << hss::demo::to_json(summary);
    if (!json) {
      std::fprintf(stderr, "hss-demo: cannot write %s\n", o.json_file.c_str());
      return hss::cli::kExitFailure;
    }
  }
  if (summary.pipeline.mismatched_rows > 0) {
    for (const auto& m : summary.pipeline.mismatches) {
      std::fprintf(stderr, "hss-demo: MISMATCH %s\n", m.describe().c_str());
    }
    std::fprintf(stderr, "hss-demo: FAILED: %lld restored rows differ from the thinker\n",
                 static_cast<long long>(summary.pipeline.mismatched_rows));
    return hss::cli::kExitFailure;
  }
  return hss::cli::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    bool help = false;
    const DemoOptions options = parse(argc, argv, help);
    if (help) {
      std::printf("%s", kUsage);
      return hss::cli::kExitOk;
    }
    return run(options);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "hss-demo: %s\n%s", e.what(), kUsage);
    return hss::cli::kExitUsage;
  } catch (const hss::ConfigError& e) {
    std::fprintf(stderr, "hss-demo: config error: %s\n", e.what());
    return hss::cli::kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hss-demo: error: %s\n", e.what());
    return hss::cli::kExitFailure;
  }
}
