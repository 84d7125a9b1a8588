// Workloads `gpu_store` and `gpu_retrieve`, and the device variants of `store` and `retrieve`.
//
// gpu_store: device bfloat16/float32 rows stored (StoreOptions::stream, Device::kCuda views) and
// flush()ed, against cudaMemcpyAsync device-to-host of the bytes the pool receives into pinned
// memory. gpu_retrieve: retrieve_hidden_states_into a device buffer for each restore strategy
// (HSS_RESTORE_IMPL=kernel|cub|memcpy, read when a store is constructed), against
// cudaMemcpyAsync host-to-device of the same float32 bytes from pinned memory. Both sides end
// with a stream synchronisation, so each time is the wall time an engine waits.
//
// Without CUDA in the build, or without a usable device, each reports "skipped" with the reason.

#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "common.hpp"

#if HSS_BENCH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace hss::bench {
namespace {

/// Empty when the device path can run; otherwise why not.
std::string device_unavailable() {
#if HSS_BENCH_WITH_CUDA
  if (!build_info().cuda) return "hsstore was built without its CUDA data path";
  const RuntimeInfo& info = runtime_info();
  if (!info.device_available) return "no CUDA device (" + info.reason + ")";
  return {};
#else
  return "no CUDA device (hss-bench built with HSS_WITH_CUDA=OFF)";
#endif
}

}  // namespace

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
struct PinnedFree {
  void operator()(void* p) const noexcept { (void)cudaFreeHost(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;
using PinnedBuffer = std::unique_ptr<void, PinnedFree>;

DeviceBuffer device_alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return DeviceBuffer(p);
}
PinnedBuffer pinned_alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  return PinnedBuffer(p);
}

class Stream {
 public:
  Stream() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  [[nodiscard]] cudaStream_t get() const { return stream_; }
  void sync() const { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t stream_ = nullptr;
};

/// Sets HSS_RESTORE_IMPL for the stores constructed while it lives, then restores the old value.
class ScopedRestoreImpl {
 public:
  explicit ScopedRestoreImpl(const std::string& impl) {
    if (const char* old = std::getenv("HSS_RESTORE_IMPL")) old_ = old;
    (void)setenv("HSS_RESTORE_IMPL", impl.c_str(), 1);
  }
  ~ScopedRestoreImpl() {
    if (old_.empty()) {
      (void)unsetenv("HSS_RESTORE_IMPL");
    } else {
      (void)setenv("HSS_RESTORE_IMPL", old_.c_str(), 1);
    }
  }
  ScopedRestoreImpl(const ScopedRestoreImpl&) = delete;
  ScopedRestoreImpl& operator=(const ScopedRestoreImpl&) = delete;

 private:
  std::string old_;
};

struct GpuShape {
  int64_t chunk = 256, hidden = 4096, tokens = 16384;
};

Params gpu_params(const GpuShape& s, DType in, StorageDType storage, const std::string& output) {
  Params p;
  p.chunk_size = s.chunk;
  p.hidden_dim = s.hidden;
  p.tokens = s.tokens;
  p.layers = 1;
  p.dtype = std::string(to_string(in));
  p.storage = storage == StorageDType::kNative ? "native" : "float32";
  p.output = output;
  return p;
}

void device_store_case(Context& ctx, const std::string& workload, const GpuShape& s, DType in,
                       StorageDType storage) {
  const int64_t in_esize = static_cast<int64_t>(element_size(in));
  const int64_t pool_esize = (storage == StorageDType::kNative && in != DType::kFloat32) ? 2 : 4;
  const auto in_bytes = static_cast<size_t>(s.tokens * s.hidden * in_esize);
  const auto pool_written = static_cast<size_t>(s.tokens * s.hidden * pool_esize);
  auto stream = std::make_shared<Stream>();
  auto input = std::make_shared<DeviceBuffer>(device_alloc(in_bytes));
  {
    std::vector<uint16_t> host16;
    std::vector<float> host32;
    const void* host = nullptr;
    if (in == DType::kFloat32) {
      host32 = random_f32(s.tokens * s.hidden, 41);
      host = host32.data();
    } else {
      host16 = random_bf16(s.tokens * s.hidden, 41);
      host = host16.data();
    }
    check(cudaMemcpy(input->get(), host, in_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  auto hss = std::make_shared<BareStore>(
      s.chunk, pool_bytes_for(s.tokens / s.chunk, s.chunk, s.hidden, pool_esize), storage);
  auto tokens = std::make_shared<std::vector<int32_t>>(make_tokens(s.tokens, 43));
  const TensorView view{input->get(), in, s.tokens, s.hidden, 0, Device::kCuda, 0};
  Timed cand{"store", [hss, tokens] { hss->drop(*tokens); },
             [hss, tokens, view, stream, input] {
               (void)hss->store.store_hidden_states(*tokens, view, {.stream = stream->get()});
               hss->store.flush();
             },
             static_cast<double>(pool_written), static_cast<double>(s.tokens)};
  auto pinned = std::make_shared<PinnedBuffer>(pinned_alloc(pool_written));
  auto scratch = std::make_shared<DeviceBuffer>(device_alloc(pool_written));
  Timed ref{"cudaMemcpyAsync D2H", nullptr,
            [pinned, scratch, stream, pool_written] {
              check(cudaMemcpyAsync(pinned->get(), scratch->get(), pool_written,
                                    cudaMemcpyDeviceToHost, stream->get()),
                    "cudaMemcpyAsync");
              stream->sync();
            },
            static_cast<double>(pool_written), 0};
  const std::string name = std::string(in == DType::kFloat32 ? "device f32" : "device bf16") +
                           (storage == StorageDType::kNative ? " native" : " float32-storage");
  (void)ctx.report.measure(workload, name, gpu_params(s, in, storage, "pool"), cand,
                           std::span<const Timed>(&ref, 1));
}

void device_retrieve_case(Context& ctx, const std::string& workload, const std::string& impl,
                          const GpuShape& s, StorageDType storage) {
  const DType in = storage == StorageDType::kNative ? DType::kBFloat16 : DType::kFloat32;
  const int64_t pool_esize = storage == StorageDType::kNative ? 2 : 4;
  const auto out_bytes = static_cast<size_t>(s.tokens * s.hidden * 4);
  std::shared_ptr<BareStore> hss;
  {
    std::unique_ptr<ScopedRestoreImpl> env;
    if (!impl.empty()) env = std::make_unique<ScopedRestoreImpl>(impl);
    hss = std::make_shared<BareStore>(
        s.chunk, pool_bytes_for(s.tokens / s.chunk, s.chunk, s.hidden, pool_esize), storage);
  }
  auto tokens = std::make_shared<std::vector<int32_t>>(make_tokens(s.tokens, 47));
  if (in == DType::kFloat32) {
    const auto rows = random_f32(s.tokens * s.hidden, 53);
    (void)hss->store.store_hidden_states(*tokens, host_view(rows.data(), in, s.tokens, s.hidden));
  } else {
    const auto rows = random_bf16(s.tokens * s.hidden, 53);
    (void)hss->store.store_hidden_states(*tokens, host_view(rows.data(), in, s.tokens, s.hidden));
  }
  auto stream = std::make_shared<Stream>();
  auto out = std::make_shared<DeviceBuffer>(device_alloc(out_bytes));
  const MutableTensorView out_view{out->get(), DType::kFloat32, s.tokens, s.hidden,
                                   0,          Device::kCuda,   0};
  Timed cand{"retrieve into device", nullptr,
             [hss, tokens, out_view, stream, out] {
               (void)hss->store.retrieve_hidden_states_into(*tokens, out_view,
                                                            {.stream = stream->get()});
               stream->sync();
             },
             static_cast<double>(out_bytes), static_cast<double>(s.tokens)};
  auto pinned = std::make_shared<PinnedBuffer>(pinned_alloc(out_bytes));
  auto dst = std::make_shared<DeviceBuffer>(device_alloc(out_bytes));
  Timed ref{"cudaMemcpyAsync H2D", nullptr,
            [pinned, dst, stream, out_bytes] {
              check(cudaMemcpyAsync(dst->get(), pinned->get(), out_bytes, cudaMemcpyHostToDevice,
                                    stream->get()),
                    "cudaMemcpyAsync");
              stream->sync();
            },
            static_cast<double>(out_bytes), 0};
  const std::string name = "into device " + (impl.empty() ? std::string("default") : impl) +
                           (storage == StorageDType::kNative ? " native" : " f32");
  (void)ctx.report.measure(workload, name, gpu_params(s, in, storage, "device"), cand,
                           std::span<const Timed>(&ref, 1));
}

}  // namespace
#endif  // HSS_BENCH_WITH_CUDA

// Sized for bench/gpu_check.sh's two-minute stage: every figure builds a pinned pool and a
// synthetic prefix of up to 512 MiB, which costs more than the timed runs.
void run_gpu_store(Context& ctx) {
  if (const std::string why = device_unavailable(); !why.empty()) {
    ctx.report.skip("gpu_store", "all cases", why);
    return;
  }
#if HSS_BENCH_WITH_CUDA
  const std::vector<GpuShape> shapes = ctx.quick ? std::vector<GpuShape>{{256, 1024, 2048}}
                                                 : std::vector<GpuShape>{{256, 4096, 4096},
                                                                         {256, 4096, 16384},
                                                                         {256, 4096, 32768},
                                                                         {256, 8192, 16384},
                                                                         {64, 4096, 16384}};
  for (const GpuShape& s : shapes) {
    device_store_case(ctx, "gpu_store", s, DType::kBFloat16, StorageDType::kNative);
    device_store_case(ctx, "gpu_store", s, DType::kBFloat16, StorageDType::kFloat32);
    device_store_case(ctx, "gpu_store", s, DType::kFloat32, StorageDType::kFloat32);
  }
  ctx.report.print_workload("gpu_store");
#endif
}

void run_gpu_retrieve(Context& ctx) {
  if (const std::string why = device_unavailable(); !why.empty()) {
    ctx.report.skip("gpu_retrieve", "all cases", why);
    return;
  }
#if HSS_BENCH_WITH_CUDA
  const GpuShape base = ctx.quick ? GpuShape{256, 1024, 2048} : GpuShape{};
  const std::vector<GpuShape> shapes =
      ctx.quick
          ? std::vector<GpuShape>{base}
          : std::vector<GpuShape>{{256, 4096, 1024}, base, {256, 4096, 32768}, {256, 8192, 16384}};
  for (const char* impl : {"kernel", "cub", "memcpy"}) {
    for (const GpuShape& s : shapes) {
      device_retrieve_case(ctx, "gpu_retrieve", impl, s, StorageDType::kFloat32);
    }
    device_retrieve_case(ctx, "gpu_retrieve", impl, base, StorageDType::kNative);
  }
  ctx.report.print_workload("gpu_retrieve");
#endif
}

void run_device_store_variant(Context& ctx) {
  if (const std::string why = device_unavailable(); !why.empty()) {
    ctx.report.skip("store", "device bf16", why);
    return;
  }
#if HSS_BENCH_WITH_CUDA
  const GpuShape s = ctx.quick ? GpuShape{256, 1024, 2048} : GpuShape{};
  device_store_case(ctx, "store", s, DType::kBFloat16, StorageDType::kNative);
  device_store_case(ctx, "store", s, DType::kBFloat16, StorageDType::kFloat32);
#endif
}

void run_device_retrieve_variant(Context& ctx) {
  if (const std::string why = device_unavailable(); !why.empty()) {
    ctx.report.skip("retrieve", "device output", why);
    return;
  }
#if HSS_BENCH_WITH_CUDA
  const GpuShape s = ctx.quick ? GpuShape{256, 1024, 2048} : GpuShape{};
  device_retrieve_case(ctx, "retrieve", "", s, StorageDType::kFloat32);
#endif
}

}  // namespace hss::bench
