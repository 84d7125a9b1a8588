// Workload `gpu_tier`: the device-resident hot tier (hidden_state_device_cache_size).
//
// resident restore: bfloat16 device rows stored (native storage) into a store whose device tier
// holds them all, restored into a device bfloat16 buffer (the gather reads device memory only),
// against cudaMemcpyAsync device-to-device of the same bytes and against the same restore from
// the pool (tier off: the gather reads the pinned pool over PCIe). mixed restore: the first half
// of the prefix resident (stored from the device), the second half in the pool only (stored from
// the host), restored in one call, against the same references. Each run ends with a stream
// synchronisation. Target on a GPU (issue 55): resident restore >= 0.8x the D2D cudaMemcpyAsync.
// write-through store: the same rows stored from the device and flushed with the tier on (the
// pool's copy plus the device copy's kernel) against the tier off: what write-through costs.
// The first restore of each case checks that the tier served it (stats().tiers' `device` hits):
// a figure of a tier that did not serve would be a pool figure under another name.

#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"

#if HSS_BENCH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace hss::bench {

#if HSS_BENCH_WITH_CUDA
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

struct DeviceFree {
  void operator()(void* p) const noexcept { (void)cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

DeviceBuffer device_alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return DeviceBuffer(p);
}

struct StreamHandle {
  StreamHandle() {
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~StreamHandle() { (void)cudaStreamDestroy(s); }
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  void sync() const { check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }
  cudaStream_t s = nullptr;
};

struct TierShape {
  int64_t chunk = 256, hidden = 4096, tokens = 16384;
};

/// A store of bfloat16 entries with a device tier of `device_bytes` (0: off).
struct TierStore {
  TierStore(const TierShape& s, uint64_t device_bytes)
      : db(s.chunk, false), store(config(s, device_bytes), db) {}
  static Config config(const TierShape& s, uint64_t device_bytes) {
    Config c;
    c.chunk_size = s.chunk;
    c.enable_hidden_state_cache = true;
    const auto pool = static_cast<uint64_t>((s.tokens / s.chunk + 1) * s.chunk * s.hidden * 2);
    c.max_hidden_state_cpu_size = static_cast<double>((pool >> 20) + 1) / 1024.0;
    c.hidden_state_storage_dtype = StorageDType::kNative;
    c.hidden_state_device_cache_size = static_cast<double>(device_bytes) / (1ULL << 30);
    return c;
  }
  [[nodiscard]] uint64_t device_hits() const {
    for (const TierStats& t : store.stats().tiers) {
      if (t.name == "device") return t.hits;
    }
    return 0;
  }
  ChunkedTokenDatabase db;
  HiddenStateStore store;
};

/// `resident_tokens` of the prefix stored from the device (resident when the tier is on), the
/// rest from the host (pool only).
std::shared_ptr<TierStore> filled_store(const TierShape& s, bool tier_on, int64_t resident_tokens,
                                        const std::vector<int32_t>& tokens,
                                        const std::vector<uint16_t>& rows, const void* device_rows,
                                        cudaStream_t stream) {
  const auto bytes = static_cast<uint64_t>(s.tokens * s.hidden * 2);
  auto hss = std::make_shared<TierStore>(s, tier_on ? bytes + (uint64_t{4} << 20) : 0);
  if (resident_tokens > 0) {
    const std::vector<int32_t> head(tokens.begin(), tokens.begin() + resident_tokens);
    (void)hss->store.store_hidden_states(
        head, {device_rows, DType::kBFloat16, resident_tokens, s.hidden, 0, Device::kCuda, 0},
        {.stream = stream});
  }
  (void)hss->store.store_hidden_states(
      tokens, host_view(rows.data(), DType::kBFloat16, s.tokens, s.hidden));
  hss->store.flush();
  return hss;
}

void tier_case(Context& ctx, const TierShape& s, const std::string& name, int64_t resident_tokens) {
  const auto bytes = static_cast<size_t>(s.tokens * s.hidden * 2);
  const auto tokens_d = static_cast<double>(s.tokens);
  auto stream = std::make_shared<StreamHandle>();
  const auto rows = random_bf16(s.tokens * s.hidden, 61);
  auto input = std::make_shared<DeviceBuffer>(device_alloc(bytes));
  check(cudaMemcpy(input->get(), rows.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  auto tokens = std::make_shared<std::vector<int32_t>>(make_tokens(s.tokens, 67));
  auto out = std::make_shared<DeviceBuffer>(device_alloc(bytes));
  const MutableTensorView out_view{out->get(), DType::kBFloat16, s.tokens, s.hidden,
                                   0,          Device::kCuda,    0};
  const auto restore_of = [&](const std::string& label, bool tier_on) {
    auto hss = filled_store(s, tier_on, resident_tokens, *tokens, rows, input->get(), stream->s);
    if (tier_on) {
      (void)hss->store.retrieve_hidden_states_into(*tokens, out_view, {.stream = stream->s});
      stream->sync();
      if (hss->device_hits() == 0)
        throw std::runtime_error("gpu_tier: the device tier served nothing");
    }
    return Timed{label, nullptr,
                 [hss, tokens, out_view, stream, out] {
                   (void)hss->store.retrieve_hidden_states_into(*tokens, out_view,
                                                                {.stream = stream->s});
                   stream->sync();
                 },
                 static_cast<double>(bytes), tokens_d};
  };
  const Timed cand = restore_of("retrieve into device bf16", true);
  auto src = std::make_shared<DeviceBuffer>(device_alloc(bytes));
  const Timed refs[] = {Timed{"cudaMemcpyAsync D2D of the same bytes", nullptr,
                              [src, out, stream, bytes] {
                                check(cudaMemcpyAsync(out->get(), src->get(), bytes,
                                                      cudaMemcpyDeviceToDevice, stream->s),
                                      "cudaMemcpyAsync");
                                stream->sync();
                              },
                              static_cast<double>(bytes), tokens_d},
                        restore_of("the same restore from the pool (tier off)", false)};
  Params p;
  p.chunk_size = s.chunk;
  p.hidden_dim = s.hidden;
  p.tokens = s.tokens;
  p.layers = 1;
  p.dtype = "bfloat16";
  p.storage = "native";
  p.output = "device";
  (void)ctx.report.measure("gpu_tier", name, p, cand, refs);
}

void store_case(Context& ctx, const TierShape& s) {
  const auto bytes = static_cast<size_t>(s.tokens * s.hidden * 2);
  const auto tokens_d = static_cast<double>(s.tokens);
  auto stream = std::make_shared<StreamHandle>();
  const auto rows = random_bf16(s.tokens * s.hidden, 71);
  auto input = std::make_shared<DeviceBuffer>(device_alloc(bytes));
  check(cudaMemcpy(input->get(), rows.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  auto tokens = std::make_shared<std::vector<int32_t>>(make_tokens(s.tokens, 73));
  const TensorView view{input->get(), DType::kBFloat16, s.tokens, s.hidden, 0, Device::kCuda, 0};
  const auto store_of = [&](const std::string& label, bool tier_on) {
    auto hss = std::make_shared<TierStore>(s, tier_on ? bytes + (uint64_t{4} << 20) : 0);
    const auto drop = [hss, tokens] {
      for (const Chunk& chunk : hss->db.process_tokens(std::span<const int32_t>(*tokens))) {
        (void)hss->store.drop_key(chunk.key);
      }
      hss->store.flush();
    };
    return Timed{label, drop,
                 [hss, tokens, view, stream, input] {
                   (void)hss->store.store_hidden_states(*tokens, view, {.stream = stream->s});
                   hss->store.flush();
                 },
                 static_cast<double>(bytes), tokens_d};
  };
  const Timed cand = store_of("store + flush, tier on", true);
  const Timed ref = store_of("the same store, tier off", false);
  Params p;
  p.chunk_size = s.chunk;
  p.hidden_dim = s.hidden;
  p.tokens = s.tokens;
  p.layers = 1;
  p.dtype = "bfloat16";
  p.storage = "native";
  p.output = "pool";
  (void)ctx.report.measure("gpu_tier", "write-through store", p, cand,
                           std::span<const Timed>(&ref, 1));
}

}  // namespace
#endif  // HSS_BENCH_WITH_CUDA

void run_gpu_tier(Context& ctx) {
#if HSS_BENCH_WITH_CUDA
  const RuntimeInfo& info = runtime_info();
  if (!build_info().cuda || !info.device_available) {
    ctx.report.skip("gpu_tier", "all cases",
                    build_info().cuda ? "no CUDA device (" + info.reason + ")"
                                      : "hsstore was built without its CUDA data path");
    return;
  }
  const TierShape s = ctx.quick ? TierShape{256, 1024, 2048} : TierShape{};
  tier_case(ctx, s, "resident restore", s.tokens);
  tier_case(ctx, s, "mixed restore (half resident, half pool)", s.tokens / 2);
  store_case(ctx, s);
  ctx.report.print_workload("gpu_tier");
#else
  ctx.report.skip("gpu_tier", "all cases",
                  "no CUDA device (hss-bench built with HSS_WITH_CUDA=OFF)");
#endif
}

}  // namespace hss::bench
