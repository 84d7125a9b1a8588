// Workloads `store` and `retrieve`: one prefix, swept over prefix length, hidden_dim, chunk size
// and layers per key, against memcpy of the same bytes and the naive store.

#include <array>
#include <memory>

#include "common.hpp"
#include "naive_store.hpp"

namespace hss::bench {
namespace {

struct Shape {
  int64_t chunk = 256, hidden = 4096, tokens = 16384;
  int layers = 1;
};

/// A case's caller-side input: float32 or bfloat16 rows in a page-aligned CopyBuffer (a 64-byte
/// aligned tensor, as torch allocates them), which the copy references of a store read too.
struct Input {
  DType dtype;
  std::shared_ptr<const CopyBuffer> buffer;

  Input(DType type, int64_t numel) : dtype(type), buffer(make(type, numel)) {}
  [[nodiscard]] const void* data() const { return buffer->data(); }

 private:
  static std::shared_ptr<const CopyBuffer> make(DType type, int64_t numel) {
    if (type == DType::kFloat32) {
      const std::vector<float> v = random_f32(numel, 7);
      return std::make_shared<const CopyBuffer>(v.data(), v.size() * sizeof(float));
    }
    const std::vector<uint16_t> v = random_bf16(numel, 7);
    return std::make_shared<const CopyBuffer>(v.data(), v.size() * sizeof(uint16_t));
  }
};

Params params_of(const Shape& s, DType in, StorageDType storage, const std::string& output) {
  Params p;
  p.chunk_size = s.chunk;
  p.hidden_dim = s.hidden;
  p.tokens = s.tokens;
  p.layers = s.layers;
  p.dtype = std::string(to_string(in));
  p.storage = std::string(to_string(storage));
  p.output = output;
  return p;
}

// ---------------------------------------------------------------------------------------------
// store

struct StoreRig {
  Shape shape;
  DType in;
  StorageDType storage;
  std::shared_ptr<Input> input;
  std::shared_ptr<BareStore> hss;
  std::vector<int32_t> tokens;
  int64_t pool_esize;

  StoreRig(const Shape& s, DType in_type, StorageDType st, std::shared_ptr<Input> shared_input,
           int copy_threads = 1)
      : shape(s), in(in_type), storage(st), input(std::move(shared_input)) {
    pool_esize = (storage == StorageDType::kNative && in != DType::kFloat32) ? 2 : 4;
    const int64_t chunks = s.tokens / s.chunk * s.layers;
    hss =
        std::make_shared<BareStore>(s.chunk, pool_bytes_for(chunks, s.chunk, s.hidden, pool_esize),
                                    storage, StoreImpl::kStaging, copy_threads);
    tokens = make_tokens(s.tokens, 11);
  }

  [[nodiscard]] double bytes_written() const {
    return static_cast<double>(shape.tokens * shape.hidden * pool_esize * shape.layers);
  }

  /// Every layer of the prefix written again each rep; prepare drops what the last rep wrote.
  [[nodiscard]] Timed timed(const std::string& name) const {
    Timed t;
    t.name = name;
    auto store = hss;
    auto in_data = input;
    const auto toks = std::make_shared<std::vector<int32_t>>(tokens);
    const TensorView view = host_view(input->data(), in, shape.tokens, shape.hidden);
    t.prepare = [store, toks] { store->drop(*toks); };
    t.run = [store, toks, view, layers = shape.layers] {
      for (int layer = 0; layer < layers; ++layer) {
        (void)store->store.store_hidden_states(*toks, view, {.layer_idx = layer});
      }
    };
    t.bytes = bytes_written();
    t.tokens = static_cast<double>(shape.tokens * shape.layers);
    return t;
  }
};

Timed naive_store_timed(const Shape& s, const std::shared_ptr<Input>& input, DType in) {
  struct State {
    ChunkedTokenDatabase db;
    NaiveStore naive;
    std::vector<int32_t> tokens;
    State(const Shape& shape)
        : db(shape.chunk, false),
          naive(db, static_cast<size_t>(shape.tokens * shape.hidden * 4 * (shape.layers + 1))),
          tokens(make_tokens(shape.tokens, 11)) {}
  };
  auto state = std::make_shared<State>(s);
  const TensorView view = host_view(input->data(), in, s.tokens, s.hidden);
  Timed t;
  t.name = "naive";
  t.prepare = [state] { state->naive.clear(); };
  t.run = [state, view, input, layers = s.layers] {
    for (int layer = 0; layer < layers; ++layer) {
      (void)state->naive.store(state->tokens, view, layer);
    }
  };
  t.bytes = static_cast<double>(s.tokens * s.hidden * 4 * s.layers);
  return t;
}

void store_case(Context& ctx, const std::string& name, const Shape& s, DType in,
                StorageDType storage, bool with_naive) {
  auto input = std::make_shared<Input>(in, s.tokens * s.hidden);
  StoreRig rig(s, in, storage, input);
  // A copy of the bytes the pool receives: from the store's own input when the pool keeps its
  // bytes, else (widened input) from a float32 buffer of the bytes written.
  const auto written = static_cast<size_t>(rig.bytes_written() / s.layers);
  const std::shared_ptr<const CopyBuffer> ref_src =
      written == input->buffer->size() ? input->buffer
                                       : std::make_shared<const CopyBuffer>(written);
  std::vector<Timed> refs{memcpy_reference(ref_src, s.layers)};
  if (with_naive) {
    refs.push_back(naive_store_timed(s, input, in));
    refs.push_back(stream_copy_reference(ref_src, s.layers));
  }
  (void)ctx.report.measure("store", name, params_of(s, in, storage, ""), rig.timed(name), refs);
}

/// hidden_state_copy_threads 1 and 2 against a 2-thread memcpy and a 2-thread streaming copy of
/// the bytes the pool receives (and the single-thread memcpy), float32 rows.
void store_copy_threads_case(Context& ctx, const Shape& s) {
  auto input = std::make_shared<Input>(DType::kFloat32, s.tokens * s.hidden);
  std::vector<Timed> refs{memcpy_threads_reference(input->buffer, 2),
                          stream_copy_threads_reference(input->buffer, 2),
                          memcpy_reference(input->buffer)};
  for (int threads : {1, 2}) {
    StoreRig rig(s, DType::kFloat32, StorageDType::kFloat32, input, threads);
    Params p = params_of(s, DType::kFloat32, StorageDType::kFloat32, "");
    p.threads = threads;
    (void)ctx.report.measure("store", "f32 copy threads", p, rig.timed("f32 copy threads"), refs);
  }
}

/// bfloat16 input kept native against the same input widened to float32: tokens/s of each.
void store_native_vs_float32(Context& ctx, const Shape& s) {
  auto input = std::make_shared<Input>(DType::kBFloat16, s.tokens * s.hidden);
  StoreRig native(s, DType::kBFloat16, StorageDType::kNative, input);
  StoreRig widened(s, DType::kBFloat16, StorageDType::kFloat32, input);
  Timed cand = native.timed("bf16 native");
  Timed peer = widened.timed("store bf16 float32-storage");
  cand.work = peer.work = static_cast<double>(s.tokens * s.layers);
  std::vector<Timed> refs{peer, memcpy_reference(input->buffer)};  // native: the input's bytes
  refs.back().work = 0;
  // The memcpy ratio must stay in bytes: give the candidate's bytes-based ratio its own figure.
  (void)ctx.report.measure("store", "bf16 native vs float32 storage",
                           params_of(s, DType::kBFloat16, StorageDType::kNative, ""), cand,
                           std::span<const Timed>(refs.data(), 1));
  (void)ctx.report.measure("store", "bf16 native",
                           params_of(s, DType::kBFloat16, StorageDType::kNative, ""),
                           native.timed("bf16 native"), std::span<const Timed>(&refs[1], 1));
}

// ---------------------------------------------------------------------------------------------
// retrieve

struct RetrieveRig {
  Shape shape;
  std::shared_ptr<BareStore> hss;
  std::shared_ptr<std::vector<int32_t>> tokens;
  std::shared_ptr<Input> input;

  RetrieveRig(const Shape& s, DType in, StorageDType storage, int copy_threads = 1) : shape(s) {
    const int64_t esize = (storage == StorageDType::kNative && in != DType::kFloat32) ? 2 : 4;
    hss = std::make_shared<BareStore>(
        s.chunk, pool_bytes_for(s.tokens / s.chunk * s.layers, s.chunk, s.hidden, esize), storage,
        StoreImpl::kStaging, copy_threads);
    tokens = std::make_shared<std::vector<int32_t>>(make_tokens(s.tokens, 13));
    input = std::make_shared<Input>(in, s.tokens * s.hidden);
    const TensorView view = host_view(input->data(), in, s.tokens, s.hidden);
    for (int layer = 0; layer < s.layers; ++layer) {
      (void)hss->store.store_hidden_states(*tokens, view, {.layer_idx = layer});
    }
  }
  [[nodiscard]] double out_bytes() const {
    return static_cast<double>(shape.tokens * shape.hidden * 4 * shape.layers);
  }

  /// A new HostTensor per call (per layer), as an engine asks for it.
  [[nodiscard]] Timed fresh() const {
    Timed t;
    t.name = "fresh";
    t.run = [store = hss, toks = tokens, layers = shape.layers] {
      if (layers == 1) {
        auto out = store->store.retrieve_hidden_states(*toks);
        do_not_optimize(out ? out->data() : nullptr);
      } else {
        std::vector<int64_t> idx;
        for (int64_t l = 0; l < layers; ++l) idx.push_back(l);
        auto outs = store->store.retrieve_layers(*toks, idx);
        do_not_optimize(outs.empty() ? nullptr : outs.front().data());
      }
    };
    t.bytes = out_bytes();
    t.tokens = static_cast<double>(shape.tokens * shape.layers);
    return t;
  }

  /// Into one caller buffer per layer that outlives the calls.
  [[nodiscard]] Timed into() const {
    auto out = std::make_shared<CopyBuffer>(static_cast<size_t>(out_bytes()));
    Timed t;
    t.name = "into";
    t.run = [store = hss, toks = tokens, out, s = shape] {
      for (int layer = 0; layer < s.layers; ++layer) {
        float* base = reinterpret_cast<float*>(out->data()) + layer * s.tokens * s.hidden;
        const MutableTensorView view{base, DType::kFloat32, s.tokens, s.hidden,
                                     0,    Device::kHost,   0};
        (void)store->store.retrieve_hidden_states_into(*toks, view, {.layer_idx = layer});
      }
      do_not_optimize(out->data());
    };
    t.bytes = out_bytes();
    t.tokens = static_cast<double>(shape.tokens * shape.layers);
    return t;
  }
};

Timed naive_retrieve_timed(const Shape& s, const std::shared_ptr<Input>& input, DType in) {
  struct State {
    ChunkedTokenDatabase db;
    NaiveStore naive;
    std::vector<int32_t> tokens;
    explicit State(const Shape& shape)
        : db(shape.chunk, false),
          naive(db, static_cast<size_t>(shape.tokens * shape.hidden * 4 * (shape.layers + 1))),
          tokens(make_tokens(shape.tokens, 13)) {}
  };
  auto state = std::make_shared<State>(s);
  for (int layer = 0; layer < s.layers; ++layer) {
    (void)state->naive.store(state->tokens, host_view(input->data(), in, s.tokens, s.hidden),
                             layer);
  }
  Timed t;
  t.name = "naive";
  t.run = [state, layers = s.layers] {
    for (int layer = 0; layer < layers; ++layer) {
      auto result = state->naive.retrieve(state->tokens, layer);
      do_not_optimize(result.values.data());
    }
  };
  t.bytes = static_cast<double>(s.tokens * s.hidden * 4 * s.layers);
  return t;
}

void retrieve_case(Context& ctx, const std::string& name, const Shape& s, DType in,
                   StorageDType storage, bool with_into, bool with_naive) {
  RetrieveRig rig(s, in, storage);
  // memcpy of the float32 output bytes from a float32 source into a buffer that already exists.
  auto src = std::make_shared<CopyBuffer>(static_cast<size_t>(rig.out_bytes() / s.layers));
  // with_into marks the sweep's main points: they also get the streaming-copy reference.
  std::vector<Timed> copies{memcpy_reference(src->data(), src->size(), s.layers)};
  copies.back().prepare = [src] {};
  if (with_into) {
    copies.push_back(stream_copy_reference(src->data(), src->size(), s.layers));
    copies.back().prepare = [src] {};
  }
  std::vector<Timed> refs = copies;
  if (with_naive) refs.push_back(naive_retrieve_timed(s, rig.input, in));
  (void)ctx.report.measure("retrieve", name + " fresh", params_of(s, in, storage, "fresh"),
                           rig.fresh(), refs);
  if (with_into) {
    (void)ctx.report.measure("retrieve", name + " into", params_of(s, in, storage, "into"),
                             rig.into(), copies);
  }
}

/// hidden_state_copy_threads 1 and 2, fresh tensor and caller's buffer, against a 2-thread
/// memcpy and a 2-thread streaming copy of the float32 output bytes (and the single-thread
/// memcpy).
void retrieve_copy_threads_case(Context& ctx, const Shape& s) {
  auto src = std::make_shared<const CopyBuffer>(static_cast<size_t>(s.tokens * s.hidden * 4));
  std::vector<Timed> refs{memcpy_threads_reference(src, 2), stream_copy_threads_reference(src, 2),
                          memcpy_reference(src)};
  for (int threads : {1, 2}) {
    RetrieveRig rig(s, DType::kFloat32, StorageDType::kFloat32, threads);
    Params p = params_of(s, DType::kFloat32, StorageDType::kFloat32, "fresh");
    p.threads = threads;
    (void)ctx.report.measure("retrieve", "f32 fresh copy threads", p, rig.fresh(), refs);
    p.output = "into";
    (void)ctx.report.measure("retrieve", "f32 into copy threads", p, rig.into(), refs);
  }
}

/// FP8 storage (issue 32): a store quantising float32 rows and a fresh float32 retrieve
/// dequantising them, each against the same operation with float32 storage (per token: the pool
/// holds a quarter of the bytes) and memcpy of the float32 bytes the caller hands over or gets.
void fp8_case(Context& ctx, const Shape& s, StorageDType storage) {
  const std::string name(to_string(storage));
  auto input = std::make_shared<Input>(DType::kFloat32, s.tokens * s.hidden);
  StoreRig fp8(s, DType::kFloat32, storage, input);
  StoreRig f32(s, DType::kFloat32, StorageDType::kFloat32, input);
  Timed cand = fp8.timed(name);
  std::vector<Timed> refs{f32.timed("float32 storage"), memcpy_reference(input->buffer)};
  cand.bytes = refs.front().bytes;  // the float32 bytes handed over, as memcpy's
  (void)ctx.report.measure("fp8", "store " + name, params_of(s, DType::kFloat32, storage, ""), cand,
                           refs);
  RetrieveRig fp8_out(s, DType::kFloat32, storage);
  RetrieveRig f32_out(s, DType::kFloat32, StorageDType::kFloat32);
  auto src = std::make_shared<const CopyBuffer>(static_cast<size_t>(f32_out.out_bytes()));
  Timed peer = f32_out.fresh();
  peer.name = "float32 storage";
  const std::vector<Timed> out_refs{peer, memcpy_reference(src)};
  (void)ctx.report.measure("fp8", "retrieve " + name + " fresh",
                           params_of(s, DType::kFloat32, storage, "fresh"), fp8_out.fresh(),
                           out_refs);
}

}  // namespace

/// The host copy strategy every store of this process got (one calibration per process), so a
/// run's ratios can be read against it.
void note_host_copy(Context& ctx, const std::string& workload) {
  const BareStore probe(256, uint64_t{64} << 20, StorageDType::kFloat32);
  ctx.report.note(workload, "host copy: " + probe.store.stats().host_copy.summary);
}

void run_store(Context& ctx) {
  note_host_copy(ctx, "store");
  const Shape base = ctx.quick ? Shape{256, 1024, 2048, 1} : Shape{};
  store_case(ctx, "f32", base, DType::kFloat32, StorageDType::kFloat32, true);
  store_case(ctx, "bf16 float32-storage", base, DType::kBFloat16, StorageDType::kFloat32, true);
  store_native_vs_float32(ctx, base);
  store_copy_threads_case(ctx, base);
  if (ctx.quick) {
    store_case(ctx, "f32", {64, 1024, 2048, 3}, DType::kFloat32, StorageDType::kFloat32, false);
  } else {
    for (int64_t tokens : {256, 1024, 4096, 32768}) {
      store_case(ctx, "f32", {256, 4096, tokens, 1}, DType::kFloat32, StorageDType::kFloat32,
                 false);
    }
    for (int64_t hidden : {1024, 8192}) {
      store_case(ctx, "f32", {256, hidden, 16384, 1}, DType::kFloat32, StorageDType::kFloat32,
                 false);
    }
    for (int64_t chunk : {64, 1024}) {
      store_case(ctx, "f32", {chunk, 4096, 16384, 1}, DType::kFloat32, StorageDType::kFloat32,
                 false);
    }
    store_case(ctx, "f32", {256, 4096, 16384, 3}, DType::kFloat32, StorageDType::kFloat32, false);
    for (int64_t tokens : {1024, 4096, 32768}) {
      store_case(ctx, "bf16 native", {256, 4096, tokens, 1}, DType::kBFloat16,
                 StorageDType::kNative, false);
    }
  }
  run_device_store_variant(ctx);
  ctx.report.print_workload("store");
}

void run_retrieve(Context& ctx) {
  note_host_copy(ctx, "retrieve");
  const Shape base = ctx.quick ? Shape{256, 1024, 2048, 1} : Shape{};
  retrieve_case(ctx, "f32", base, DType::kFloat32, StorageDType::kFloat32, true, true);
  retrieve_case(ctx, "bf16 native", base, DType::kBFloat16, StorageDType::kNative, true, false);
  retrieve_copy_threads_case(ctx, base);
  if (ctx.quick) {
    retrieve_case(ctx, "f32", {64, 1024, 2048, 3}, DType::kFloat32, StorageDType::kFloat32, false,
                  false);
  } else {
    for (int64_t tokens : {256, 1024, 4096, 32768}) {
      retrieve_case(ctx, "f32", {256, 4096, tokens, 1}, DType::kFloat32, StorageDType::kFloat32,
                    true, tokens <= 4096);
    }
    for (int64_t hidden : {1024, 8192}) {
      retrieve_case(ctx, "f32", {256, hidden, 16384, 1}, DType::kFloat32, StorageDType::kFloat32,
                    false, false);
    }
    for (int64_t chunk : {64, 1024}) {
      retrieve_case(ctx, "f32", {chunk, 4096, 16384, 1}, DType::kFloat32, StorageDType::kFloat32,
                    false, false);
    }
    retrieve_case(ctx, "f32", {256, 4096, 16384, 3}, DType::kFloat32, StorageDType::kFloat32, false,
                  false);
  }
  run_device_retrieve_variant(ctx);
  ctx.report.print_workload("retrieve");
}

void run_fp8(Context& ctx) {
  note_host_copy(ctx, "fp8");
  const Shape base = ctx.quick ? Shape{256, 1024, 2048, 1} : Shape{};
  fp8_case(ctx, base, StorageDType::kFp8E4M3);
  fp8_case(ctx, base, StorageDType::kFp8E5M2);
  ctx.report.print_workload("fp8");
}

}  // namespace hss::bench
