// hss: the operator's command line around the library.
//   hss config check FILE [--hidden-dim N] [--layers N] [--dtype D]
//   hss keys --tokens FILE|- [--config FILE] [--chunk-size N] [--save-unfull-chunk] [--model NAME]
//            [--world-size N] [--worker-id N] [--fmt NAME] [--kv-dtype NAME]
//   hss info [--config FILE]
#include <stdlib.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "hss/detail/file_reader.hpp"
#include "hss/hss.hpp"

namespace {

using hss::cli::Args;
using hss::cli::UsageError;

constexpr const char* kUsage = R"(usage: hss <command> [options]

commands:
  config check FILE   load and validate a config, print the effective values and what the
                      pools hold
      --hidden-dim N  hidden size used for the pool figures (default 4096)
      --layers N      hidden-state layers cached per token (default: the allowlist size, or 1)
      --dtype D       dtype the engine stores: bfloat16 (default), float16 or float32
  keys --tokens FILE|-
                      print the chunk key of each chunk of a token list (ids separated by
                      whitespace; - reads stdin), to compare keys with another process
      --config FILE   take chunk_size and save_unfull_chunk from a config
      --chunk-size N  (default 256)   --save-unfull-chunk
      --model NAME  --fmt NAME  --world-size N  --worker-id N  --kv-dtype NAME
                      the key metadata (defaults: vllm, "", 1, 0, bfloat16)
  info                version, build options, devices, pinned memory, the disk tier and how it
                      reads (O_DIRECT or buffered), the storage dtype, the host copy strategy
      --config FILE   use its disk tier keys (local_disk, hidden_state_disk_path,
                      max_local_disk_size), storage dtype and host copy keys
                      (hidden_state_stream_threshold_bytes, hidden_state_copy_threads)
  --help              this text

exit status: 0 success, 1 bad input (the message says what), 2 usage error
)";

int config_check(Args& args) {
  if (args.done()) throw UsageError("config check needs a FILE");
  std::string file;
  int64_t hidden_dim = 4096;
  int64_t layers = 0;
  std::string dtype = "bfloat16";
  while (!args.done()) {
    if (args.take_flag("--hidden-dim")) {
      hidden_dim = hss::cli::parse_int("--hidden-dim", args.value("--hidden-dim"), 1, 1 << 20);
    } else if (args.take_flag("--layers")) {
      layers = hss::cli::parse_int("--layers", args.value("--layers"), 1, 100000);
    } else if (args.take_flag("--dtype")) {
      dtype = args.value("--dtype");
      if (dtype != "bfloat16" && dtype != "float16" && dtype != "float32") {
        throw UsageError("--dtype must be bfloat16, float16 or float32, got '" + dtype + "'");
      }
    } else if (args.peek().starts_with("-") && args.peek() != "-") {
      throw UsageError("unknown option '" + args.peek() + "' for config check");
    } else if (file.empty()) {
      file = args.next();
    } else {
      throw UsageError("config check takes one FILE, got also '" + args.peek() + "'");
    }
  }
  if (file.empty()) throw UsageError("config check needs a FILE");

  const hss::Config config = hss::Config::from_file(file);  // ConfigError -> exit 1
  std::printf("%s: OK\n\n# effective values\n%s", file.c_str(), config.to_yaml().c_str());
  for (const std::string& key : config.unknown_keys) {
    std::printf("# ignored key (not used by hsstore): %s\n", key.c_str());
  }

  if (layers == 0) {
    layers =
        config.hidden_state_layers ? static_cast<int64_t>(config.hidden_state_layers->size()) : 1;
  }
  const bool fp8 = config.hidden_state_storage_dtype == hss::StorageDType::kFp8E4M3 ||
                   config.hidden_state_storage_dtype == hss::StorageDType::kFp8E5M2;
  const bool wide = !fp8 && (dtype == "float32" ||
                             config.hidden_state_storage_dtype == hss::StorageDType::kFloat32);
  const int64_t elem = fp8 ? 1 : (wide ? 4 : 2);
  const std::string stored_as =
      fp8 ? std::string(hss::to_string(config.hidden_state_storage_dtype)) +
                " + a float32 scale per row"
          : (wide ? std::string("float32") : dtype);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  // FP8: each row's 4-byte scale beside its codes (docs/design.md, "FP8 storage").
  const double token_bytes = static_cast<double>(hidden_dim * elem + (fp8 ? 4 : 0));
  std::printf("\n# pools\n");
  std::printf("KV pool: %s\n",
              hss::cli::format_bytes(static_cast<double>(config.kv_pool_bytes())).c_str());
  if (!config.enable_hidden_state_cache) {
    std::printf("hidden-state pool: disabled (enable_hidden_state_cache: false)\n");
    return hss::cli::kExitOk;
  }
  if (layers == 0) {
    // An empty allowlist is valid: no layer is cached, so the pool stays unused.
    std::printf(
        "hidden-state pool: %s, unused: hidden_state_layers is empty (no layer cached)\n",
        hss::cli::format_bytes(static_cast<double>(config.hidden_state_pool_bytes())).c_str());
    return hss::cli::kExitOk;
  }
  const auto pool = static_cast<double>(config.hidden_state_pool_bytes());
  const double chunk_bytes = token_bytes * static_cast<double>(config.chunk_size);
  const auto chunks = static_cast<int64_t>(pool / chunk_bytes);
  std::printf("hidden-state pool: %s, rows stored as %s (%lld bytes per value)\n",
              hss::cli::format_bytes(pool).c_str(), stored_as.c_str(),
              static_cast<long long>(elem));
  std::printf("  at hidden_dim %lld: %.0f tokens per GiB per layer\n",
              static_cast<long long>(hidden_dim), gib / token_bytes);
  std::printf(
      "  the pool holds %lld chunks of %lld tokens for one layer = %lld tokens for each of "
      "%lld layers\n",
      static_cast<long long>(chunks), static_cast<long long>(config.chunk_size),
      static_cast<long long>(chunks / layers * config.chunk_size), static_cast<long long>(layers));
  return hss::cli::kExitOk;
}

std::vector<int64_t> read_tokens(const std::string& source) {
  // Regular files (or stdin) only, at most 64 MiB: a FIFO, a device or a directory is an error.
  const std::string text = source == "-"
                               ? hss::detail::read_stream_fd(STDIN_FILENO, "token input (stdin)")
                               : hss::detail::read_regular_file(source, "token file");
  std::istringstream stream(text);
  std::istream* in = &stream;
  std::vector<int64_t> tokens;
  std::string word;
  while (*in >> word) {
    int64_t value = 0;
    try {
      value = hss::cli::parse_int("token", word, 0, 0xFFFFFFFFLL);
    } catch (const UsageError&) {
      throw std::runtime_error("bad token '" + word + "' at position " +
                               std::to_string(tokens.size()) + " of " + source +
                               ": ids are integers in [0, 4294967295]");
    }
    tokens.push_back(value);
  }
  return tokens;
}

int keys(Args& args) {
  std::string tokens_source, config_file;
  std::optional<int64_t> chunk_size;
  bool save_unfull = false;
  hss::Metadata metadata;
  while (!args.done()) {
    if (args.take_flag("--tokens")) {
      tokens_source = args.value("--tokens");
    } else if (args.take_flag("--config")) {
      config_file = args.value("--config");
    } else if (args.take_flag("--chunk-size")) {
      chunk_size = hss::cli::parse_int("--chunk-size", args.value("--chunk-size"), 1, 1 << 24);
    } else if (args.take_flag("--save-unfull-chunk")) {
      save_unfull = true;
    } else if (args.take_flag("--model")) {
      metadata.model_name = args.value("--model");
    } else if (args.take_flag("--fmt")) {
      metadata.fmt = args.value("--fmt");
    } else if (args.take_flag("--kv-dtype")) {
      metadata.kv_dtype = args.value("--kv-dtype");
    } else if (args.take_flag("--world-size")) {
      metadata.world_size =
          hss::cli::parse_int("--world-size", args.value("--world-size"), 1, 1 << 20);
    } else if (args.take_flag("--worker-id")) {
      metadata.worker_id =
          hss::cli::parse_int("--worker-id", args.value("--worker-id"), 0, 1 << 20);
    } else {
      throw UsageError("unknown argument '" + args.peek() + "' for keys");
    }
  }
  if (tokens_source.empty()) throw UsageError("keys needs --tokens FILE (or - for stdin)");
  int64_t size = 256;
  if (!config_file.empty()) {
    const hss::Config config = hss::Config::from_file(config_file);
    size = config.chunk_size;
    save_unfull = save_unfull || config.save_unfull_chunk;
  }
  if (chunk_size) size = *chunk_size;
  const std::vector<int64_t> tokens = read_tokens(tokens_source);
  const hss::ChunkedTokenDatabase db(size, save_unfull, metadata);
  const std::vector<hss::Chunk> chunks = db.process_tokens(tokens);
  for (const hss::Chunk& chunk : chunks) {
    std::printf("%lld %lld %s\n", static_cast<long long>(chunk.start),
                static_cast<long long>(chunk.end), chunk.key.to_string().c_str());
  }
  std::fprintf(stderr, "%zu tokens, %zu chunks of %lld%s\n", tokens.size(), chunks.size(),
               static_cast<long long>(size),
               save_unfull ? " (partial last chunk kept)" : " (partial last chunk not keyed)");
  return hss::cli::kExitOk;
}

/// The host copy strategy a store with `file`'s copy keys gets on this machine: a store on a
/// pool just large enough to calibrate (72 MiB, populated), nothing else from the file.
void print_host_copy(const std::string& file) {
  hss::Config config = file.empty() ? hss::Config{} : hss::Config::from_file(file);
  config.enable_hidden_state_cache = true;
  config.max_hidden_state_cpu_size = 72.0 / 1024;
  config.hidden_state_remote_url.clear();
  config.local_disk.clear();  // the probe store must not scan or write the disk tier's directory
  config.hidden_state_disk_path.clear();
  try {
    const hss::ChunkedTokenDatabase db(config.chunk_size, false);
    const hss::HiddenStateStore store(config, db);
    const hss::HostCopyStats copy = store.stats().host_copy;
    std::printf("host copies: %s\n", copy.summary.c_str());
    std::printf("  cpu: %s\n", copy.cpu.c_str());
    std::printf("  copy threads: %lld (%s); a copy splits into parts of >= %llu KiB\n",
                static_cast<long long>(copy.copy_threads), copy.copy_threads_reason.c_str(),
                static_cast<unsigned long long>(copy.min_bytes_per_copy_thread >> 10));
  } catch (const hss::Error& e) {
    std::printf("host copies: not probed (%s)\n", e.what());
  }
}

/// How the disk tier of `config` reads (TierStats::read_mode, "direct" or "buffered"), asked of
/// a store whose disk tier is on a scratch directory made in the tier's directory, or, while
/// that does not exist yet, in its nearest existing parent: the same file system, so the same
/// O_DIRECT answer. The tier's own directory is never scanned, written or removed (a running
/// store may own it). Empty with `why` set when it could not be asked.
std::string disk_read_mode(const hss::Config& config, std::string& why) {
  namespace fs = std::filesystem;
  const auto is_directory = [](const fs::path& p) {
    std::error_code absent;
    return fs::is_directory(p, absent);
  };
  std::error_code ec;
  fs::path near = fs::absolute(config.hidden_state_disk_dir(), ec);
  while (!ec && !is_directory(near) && near.has_relative_path()) near = near.parent_path();
  std::string scratch = (near / ".hss-info-XXXXXX").string();
  if (ec || ::mkdtemp(scratch.data()) == nullptr) {
    why = near.string() + ": " + (ec ? ec.message() : std::string(std::strerror(errno)));
    return {};
  }
  hss::Config probe;  // nothing else from the config: a small pool, the disk tier alone
  probe.enable_hidden_state_cache = true;
  probe.max_hidden_state_cpu_size = 1.0 / 1024;
  probe.hidden_state_disk_path = scratch;
  std::string mode;
  try {
    const hss::ChunkedTokenDatabase db(probe.chunk_size, false);
    const hss::HiddenStateStore store(probe, db);
    for (const hss::TierStats& tier : store.stats().tiers) {
      if (tier.name == "disk") mode = tier.read_mode;
    }
    if (mode.empty()) why = "no disk tier in the probe store";
  } catch (const hss::Error& e) {
    why = e.what();
  }
  fs::remove_all(scratch, ec);
  return mode;
}

int info(Args& args) {
  std::string config_file;
  while (!args.done()) {
    if (!args.take_flag("--config")) {
      throw UsageError("info takes no arguments but --config FILE, got '" + args.peek() + "'");
    }
    config_file = args.value("--config");
  }
  const hss::BuildInfo build = hss::build_info();
  const hss::RuntimeInfo& runtime = hss::runtime_info();
  std::printf("hsstore %s\n", build.version.c_str());
  std::printf("build: CUDA %s", build.cuda ? "on" : "off");
  if (build.cuda) std::printf(" (architectures %s)", build.cuda_architectures.c_str());
  std::printf(", NVTX %s\n", build.nvtx ? "on" : "off");
  if (runtime.device_available) {
    std::printf("devices: %zu\n", runtime.devices.size());
    for (const hss::DeviceInfo& d : runtime.devices) {
      std::printf("  [%d] %s, compute %d.%d, %s\n", d.index, d.name.c_str(), d.compute_major,
                  d.compute_minor,
                  hss::cli::format_bytes(static_cast<double>(d.total_memory)).c_str());
    }
  } else {
    std::printf("devices: none (%s)\n",
                runtime.reason.empty() ? "not built with CUDA" : runtime.reason.c_str());
  }
  std::printf("pinned memory: %s\n", runtime.pinned_memory ? "available" : "not available");
  std::printf("data path: %s\n", runtime.device_available && build.cuda ? "cuda" : "host");
  // The slot key is (chunk key, kind, layer); hidden_state_kinds / hidden_state_layers filter it.
  std::printf("activation kinds:");
  for (int k = 0; k < hss::kNumActivationKinds; ++k) {
    std::printf("%s %s", k == 0 ? "" : ",",
                std::string(hss::to_string(static_cast<hss::ActivationKind>(k))).c_str());
  }
  std::printf(" (slot = chunk key, kind, layer)\n");
  const hss::Config config =
      config_file.empty() ? hss::Config{} : hss::Config::from_file(config_file);
  if (const std::string dir = config.hidden_state_disk_dir(); !dir.empty()) {
    std::string why;
    const std::string mode = disk_read_mode(config, why);
    const std::string reads =
        mode == "direct"     ? "reads direct (O_DIRECT, no page cache)"
        : mode == "buffered" ? "reads buffered (the page cache: the file system refuses O_DIRECT)"
                             : "reads not probed (" + why + ")";
    std::printf("disk tier: %s, budget %s, %s\n", dir.c_str(),
                hss::cli::format_bytes(static_cast<double>(config.disk_tier_bytes())).c_str(),
                reads.c_str());
  } else {
    std::printf("disk tier: off (local_disk, hidden_state_disk_path unset)\n");
  }
  const bool fp8 = config.hidden_state_storage_dtype == hss::StorageDType::kFp8E4M3 ||
                   config.hidden_state_storage_dtype == hss::StorageDType::kFp8E5M2;
  std::printf("storage dtype: %s (%s)\n",
              std::string(hss::to_string(config.hidden_state_storage_dtype)).c_str(),
              fp8 ? "lossy: 8-bit codes and a float32 scale per row, host path only"
                  : "lossless");
  print_host_copy(config_file);
  return hss::cli::kExitOk;
}

int dispatch(Args& args) {
  if (args.done()) throw UsageError("missing command");
  const std::string command = args.next();
  if (command == "--help" || command == "-h" || command == "help") {
    std::printf("%s", kUsage);
    return hss::cli::kExitOk;
  }
  if (command == "config") {
    if (args.done()) throw UsageError("config needs a subcommand: check");
    const std::string sub = args.next();
    if (sub != "check") throw UsageError("unknown config subcommand '" + sub + "'");
    return config_check(args);
  }
  if (command == "keys") return keys(args);
  if (command == "info") return info(args);
  throw UsageError("unknown command '" + command + "'");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args args(argc, argv);
    return dispatch(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "hss: %s\n\n%s", e.what(), kUsage);
    return hss::cli::kExitUsage;
  } catch (const hss::ConfigError& e) {
    std::fprintf(stderr, "hss: config error: %s\n", e.what());
    return hss::cli::kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hss: error: %s\n", e.what());
    return hss::cli::kExitFailure;
  }
}
