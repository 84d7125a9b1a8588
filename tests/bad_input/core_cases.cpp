// Bad-input cases of Config, ChunkedTokenDatabase, LocalCpuBackend, HostTensor and Engine.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <utility>

#include "cases.hpp"

namespace hss::bad_input {
namespace {

constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();

std::vector<int32_t> test_tokens() {
  std::vector<int32_t> tokens(2 * kChunk);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 31 + 5);
  return tokens;
}

void yaml_case(std::vector<Case>& cases, const std::string& yaml) {
  cases.push_back({"Config::from_yaml(" + yaml + ")", Expect::kConfigError,
                   [yaml](World&) { (void)Config::from_yaml(yaml); }});
}

void validate_case(std::vector<Case>& cases, const std::string& name,
                   std::function<void(Config&)> edit) {
  cases.push_back({"Config::validate(" + name + ")", Expect::kConfigError, [edit](World&) {
                     Config c;
                     edit(c);
                     c.validate();
                   }});
  cases.push_back({"Engine::create(" + name + ")", Expect::kConfigError, [edit](World&) {
                     Config c;
                     c.enable_hidden_state_cache = true;
                     c.max_hidden_state_cpu_size = 0.001;
                     edit(c);
                     (void)Engine::create(c);
                   }});
}

std::string scratch_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          ("hss_bad_input_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void engine_store_case(std::vector<Case>& cases, const std::string& what,
                       std::function<void(TensorView&)> edit) {
  cases.push_back({"Engine::store(kv: " + what + ")", Expect::kInvalidArgument, [edit](World& w) {
                     const auto tokens = test_tokens();
                     std::vector<uint16_t> kv(tokens.size() * kKvCols, 3);
                     TensorView view{kv.data(),
                                     DType::kBFloat16,
                                     static_cast<int64_t>(tokens.size()),
                                     kKvCols,
                                     0,
                                     Device::kHost,
                                     0};
                     edit(view);
                     (void)w.engine->store(tokens, view);
                   }});
}

void engine_retrieve_case(std::vector<Case>& cases, const std::string& what,
                          std::function<void(MutableTensorView&)> edit) {
  cases.push_back(
      {"Engine::retrieve(kv_out: " + what + ")", Expect::kInvalidArgument, [edit](World& w) {
         std::vector<uint16_t> out(w.tokens.size() * kKvCols, 0);
         MutableTensorView view{out.data(),
                                DType::kBFloat16,
                                static_cast<int64_t>(w.tokens.size()),
                                kKvCols,
                                0,
                                Device::kHost,
                                0};
         edit(view);
         (void)w.engine->retrieve(w.tokens, view);
       }});
}

}  // namespace

void add_core_cases(std::vector<Case>& cases) {
  // --- Config::from_yaml: every key with a wrong type or an out-of-range value ----------------
  for (const char* yaml : {"chunk_size: 0",
                           "chunk_size: -1",
                           "chunk_size: 4611686018427387904",
                           "chunk_size: 99999999999999999999",
                           "chunk_size: abc",
                           "chunk_size: \"256\"",
                           "chunk_size: 1.5",
                           "save_unfull_chunk: maybe",
                           "max_local_cpu_size: -1",
                           "max_local_cpu_size: .nan",
                           "max_local_cpu_size: .inf",
                           "max_local_cpu_size: 1e300",
                           "max_local_cpu_size: 0",
                           "enable_hidden_state_cache: 2",
                           "enable_hidden_state_cache: true\nmax_hidden_state_cpu_size: 0",
                           "max_hidden_state_cpu_size: -0.5",
                           "hidden_state_layers: abc",
                           "hidden_state_layers: [1, x]",
                           "hidden_state_layers: {a: 1}",
                           "hidden_state_storage_dtype: int8",
                           "hidden_state_block_bytes: 17",
                           "hidden_state_block_bytes: -64",
                           "hidden_state_block_bytes: 1099511627776",
                           "chunk_size: 16\nchunk_size: 32",
                           "[1, 2]",
                           "chunk_size: [",
                           "{chunk_size: }"}) {
    yaml_case(cases, yaml);
  }
  // --- Config::validate and Engine::create on configs built in code -----------------------------
  validate_case(cases, "chunk_size = 0", [](Config& c) { c.chunk_size = 0; });
  validate_case(cases, "chunk_size = 2^62", [](Config& c) { c.chunk_size = int64_t{1} << 62; });
  validate_case(cases, "max_local_cpu_size = nan",
                [](Config& c) { c.max_local_cpu_size = std::nan(""); });
  validate_case(cases, "max_local_cpu_size = -1", [](Config& c) { c.max_local_cpu_size = -1; });
  validate_case(cases, "max_hidden_state_cpu_size = inf", [](Config& c) {
    c.max_hidden_state_cpu_size = std::numeric_limits<double>::infinity();
  });
  validate_case(cases, "hidden_state_storage_dtype = 7",
                [](Config& c) { c.hidden_state_storage_dtype = static_cast<StorageDType>(7); });
  validate_case(cases, "hidden_state_block_bytes = 24",
                [](Config& c) { c.hidden_state_block_bytes = 24; });
  validate_case(cases, "hidden_state_block_bytes = 2^40",
                [](Config& c) { c.hidden_state_block_bytes = int64_t{1} << 40; });
  // --- Config::from_file: paths that are not small regular files --------------------------------
  cases.push_back({"Config::from_file(missing)", Expect::kConfigError,
                   [](World&) { (void)Config::from_file(scratch_path("missing.yaml")); }});
  cases.push_back({"Config::from_file(directory)", Expect::kConfigError, [](World&) {
                     (void)Config::from_file(std::filesystem::temp_directory_path());
                   }});
  cases.push_back({"Config::from_file(/dev/zero)", Expect::kConfigError,
                   [](World&) { (void)Config::from_file("/dev/zero"); }});
  cases.push_back({"Config::from_file(/proc/self/mem)", Expect::kConfigError,
                   [](World&) { (void)Config::from_file("/proc/self/mem"); }});
  cases.push_back({"Config::from_file(FIFO)", Expect::kConfigError, [](World&) {
                     const std::string fifo = scratch_path("fifo");
                     ::unlink(fifo.c_str());
                     if (::mkfifo(fifo.c_str(), 0600) != 0) throw std::runtime_error("mkfifo");
                     struct Unlink {
                       std::string path;
                       ~Unlink() { ::unlink(path.c_str()); }
                     } unlink_at_exit{fifo};
                     (void)Config::from_file(fifo);
                   }});
  cases.push_back({"Config::from_env(LMCACHE_CHUNK_SIZE = -3)", Expect::kConfigError, [](World&) {
                     ::setenv("LMCACHE_CHUNK_SIZE", "-3", 1);
                     (void)Config::from_env();
                   }});
  cases.push_back(
      {"Config::from_env(LMCACHE_CONFIG_FILE = /dev/zero)", Expect::kConfigError, [](World&) {
         ::setenv("LMCACHE_CONFIG_FILE", "/dev/zero", 1);
         (void)Config::from_env();
       }});

  // --- ChunkedTokenDatabase ---------------------------------------------------------------------
  for (const int64_t size : {int64_t{0}, int64_t{-16}, kHuge}) {
    cases.push_back({"ChunkedTokenDatabase(chunk_size = " + std::to_string(size) + ")",
                     Expect::kInvalidArgument,
                     [size](World&) { (void)ChunkedTokenDatabase(size, false); }});
  }
  cases.push_back({"ChunkedTokenDatabase::process_tokens(int32 token -1)", Expect::kInvalidArgument,
                   [](World& w) {
                     std::vector<int32_t> tokens = w.tokens;
                     tokens[20] = -1;
                     (void)w.engine->token_database().process_tokens(tokens);
                   }});
  cases.push_back({"ChunkedTokenDatabase::process_tokens(int64 token 2^32)",
                   Expect::kInvalidArgument, [](World& w) {
                     std::vector<int64_t> tokens(w.tokens.begin(), w.tokens.end());
                     tokens[3] = int64_t{1} << 32;
                     (void)w.engine->token_database().process_tokens(tokens);
                   }});
  cases.push_back({"ChunkedTokenDatabase::process_hashes(sizes differ)", Expect::kInvalidArgument,
                   [](World& w) {
                     const std::vector<uint64_t> hashes{1, 2, 3};
                     const std::vector<int64_t> counts{16, 16};
                     (void)w.engine->token_database().process_hashes(hashes, counts);
                   }});
  cases.push_back(
      {"ChunkedTokenDatabase::process_hashes(negative)", Expect::kInvalidArgument, [](World& w) {
         const std::vector<uint64_t> hashes{1, 2};
         const std::vector<int64_t> counts{16, -5};
         (void)w.engine->token_database().process_hashes(hashes, counts);
       }});
  cases.push_back(
      {"ChunkedTokenDatabase::process_hashes(0 first)", Expect::kInvalidArgument, [](World& w) {
         const std::vector<uint64_t> hashes{1};
         const std::vector<int64_t> counts{0};
         (void)w.engine->token_database().process_hashes(hashes, counts);
       }});

  // --- LocalCpuBackend ---------------------------------------------------------------------------
  cases.push_back({"LocalCpuBackend(capacity_bytes = 0)", Expect::kInvalidArgument,
                   [](World&) { LocalCpuBackend backend(0); }});
  cases.push_back(
      {"LocalCpuBackend::get(out smaller than the chunk)", Expect::kInvalidArgument, [](World& w) {
         const auto chunks = w.engine->token_database().process_tokens(w.tokens);
         std::vector<std::byte> out(10);
         (void)w.engine->kv_backend().get(chunks[0].key, out);
       }});
  // --- HostTensor
  // ---------------------------------------------------------------------------------
  for (const auto& [r, c] : {std::pair<int64_t, int64_t>{-1, 4},
                             {4, -1},
                             {kHuge, kHuge},
                             {int64_t{1} << 40, 1},
                             {1, int64_t{1} << 30}}) {
    cases.push_back(
        {"HostTensor(rows = " + std::to_string(r) + ", cols = " + std::to_string(c) + ")",
         Expect::kInvalidArgument, [rows = r, cols = c](World&) { HostTensor t(rows, cols); }});
  }

  // --- Engine::store -----------------------------------------------------------------------------
  cases.push_back({"Engine::store(token_offset = -1)", Expect::kInvalidArgument,
                   [](World& w) { (void)w.engine->store(w.tokens, w.kv_view(), -1); }});
  cases.push_back({"Engine::store(token_offset > len)", Expect::kInvalidArgument, [](World& w) {
                     TensorView v = w.kv_view();
                     v.rows = 0;
                     (void)w.engine->store(w.tokens, v, 65);
                   }});
  engine_store_case(cases, "rows != len - offset", [](TensorView& v) { v.rows -= 1; });
  engine_store_case(cases, "cols = 0", [](TensorView& v) { v.cols = 0; });
  engine_store_case(cases, "cols = -8", [](TensorView& v) { v.cols = -8; });
  engine_store_case(cases, "cols = 2^62", [](TensorView& v) { v.cols = int64_t{1} << 62; });
  engine_store_case(cases, "row_stride < cols", [](TensorView& v) { v.row_stride = 4; });
  engine_store_case(cases, "row_stride = 2^62",
                    [](TensorView& v) { v.row_stride = int64_t{1} << 62; });
  engine_store_case(cases, "dtype = 9", [](TensorView& v) { v.dtype = static_cast<DType>(9); });
  engine_store_case(cases, "device = cuda", [](TensorView& v) { v.device = Device::kCuda; });
  engine_store_case(cases, "device = 7", [](TensorView& v) { v.device = static_cast<Device>(7); });
  engine_store_case(cases, "data = null", [](TensorView& v) { v.data = nullptr; });
  cases.push_back({"Engine::store(tokens with -1)", Expect::kInvalidArgument, [](World& w) {
                     auto tokens = test_tokens();
                     tokens[31] = -1;
                     std::vector<uint16_t> kv(tokens.size() * kKvCols, 3);
                     (void)w.engine->store(tokens, TensorView{kv.data(), DType::kBFloat16,
                                                              static_cast<int64_t>(tokens.size()),
                                                              kKvCols, 0, Device::kHost, 0});
                   }});

  // --- Engine::retrieve / lookup -----------------------------------------------------------------
  engine_retrieve_case(cases, "rows < cached prefix", [](MutableTensorView& v) { v.rows = 20; });
  engine_retrieve_case(cases, "cols = 0", [](MutableTensorView& v) { v.cols = 0; });
  engine_retrieve_case(cases, "cols = 4 (stored 8)", [](MutableTensorView& v) { v.cols = 4; });
  engine_retrieve_case(cases, "dtype = float32 (stored 2-byte)",
                       [](MutableTensorView& v) { v.dtype = DType::kFloat32; });
  engine_retrieve_case(cases, "dtype = 9",
                       [](MutableTensorView& v) { v.dtype = static_cast<DType>(9); });
  engine_retrieve_case(cases, "device = cuda",
                       [](MutableTensorView& v) { v.device = Device::kCuda; });
  engine_retrieve_case(cases, "device = 7",
                       [](MutableTensorView& v) { v.device = static_cast<Device>(7); });
  engine_retrieve_case(cases, "data = null", [](MutableTensorView& v) { v.data = nullptr; });
  engine_retrieve_case(cases, "row_stride < cols", [](MutableTensorView& v) { v.row_stride = 3; });
  engine_retrieve_case(cases, "rows = 2^62",
                       [](MutableTensorView& v) { v.rows = int64_t{1} << 62; });
  cases.push_back({"Engine::retrieve(tokens with -1)", Expect::kInvalidArgument, [](World& w) {
                     auto tokens = w.tokens;
                     tokens[0] = -1;
                     std::vector<uint16_t> out(tokens.size() * kKvCols);
                     (void)w.engine->retrieve(
                         tokens, MutableTensorView{out.data(), DType::kBFloat16, 64, kKvCols, 0,
                                                   Device::kHost, 0});
                   }});
  cases.push_back({"Engine::lookup(tokens with 2^32)", Expect::kInvalidArgument, [](World& w) {
                     std::vector<int64_t> tokens(w.tokens.begin(), w.tokens.end());
                     tokens[5] = int64_t{1} << 32;
                     (void)w.engine->lookup(tokens);
                   }});
}

}  // namespace hss::bad_input
