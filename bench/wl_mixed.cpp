// Workload `mixed`: the hidden-state calls of hss-demo's request stream (tools/demo/pipeline.cpp),
// replayed against hsstore and against the naive store. Per request: the talker restores every
// layer all-or-nothing (fresh tensors), the draft head restores the last rows of the cached
// prefix of its layer, and the thinker stores what was missing one full chunk at a time with
// token_offset at the chunk start. KV is left out (a bare store counts it as present) so the
// figure is the hidden-state store's. The thinker's values are precomputed (their cost is the
// model's, not the store's).

#include <algorithm>
#include <memory>

#include "common.hpp"
#include "naive_store.hpp"
#include "workload/workload.hpp"

namespace hss::bench {
namespace {

constexpr int64_t kDraftRows = 8;  // as hss-demo's draft head

struct Stream {
  workload::WorkloadOptions options;
  std::vector<workload::Request> requests;
  workload::StreamShape shape;
  std::vector<uint16_t> chunk_rows;  // one chunk of bfloat16 rows, stored for every chunk
  int64_t draft_layer = -1;
};

/// Bytes one replay moves: float32 rows restored plus bfloat16 rows handed to the store.
struct Moved {
  double restored = 0, stored = 0;
};

class HssReplay {
 public:
  HssReplay(const Stream& s, uint64_t pool_bytes, StorageDType storage)
      : stream_(s), bare_(s.options.chunk_size, pool_bytes, storage) {}

  Moved run() {
    Moved moved;
    const int64_t chunk = stream_.options.chunk_size;
    const int64_t cols = stream_.options.hidden_dim;
    const std::span<const int64_t> layers(stream_.options.layers);
    for (const workload::Request& request : stream_.requests) {
      const std::span<const int32_t> tokens(request.tokens);
      const auto n = static_cast<int64_t>(tokens.size());
      std::vector<HostTensor> restored = bare_.store.retrieve_layers(tokens, layers);
      const int64_t prefix = restored.empty() ? 0 : restored.front().rows();
      for (const HostTensor& t : restored) moved.restored += static_cast<double>(t.bytes());

      const auto chunks = bare_.db.process_tokens(tokens);
      const int64_t draft = stream_.draft_layer;
      const int64_t covered = bare_.store.coverage(chunks, std::span<const int64_t>(&draft, 1));
      if (covered > 0) {
        const int64_t row_begin = std::max<int64_t>(0, covered - kDraftRows);
        auto t = bare_.store.retrieve_hidden_states(tokens,
                                                    {.layer_idx = draft, .row_begin = row_begin});
        if (t) moved.restored += static_cast<double>(t->bytes());
      }

      for (int64_t start = prefix; start + chunk <= n; start += chunk) {
        const auto upto = tokens.first(static_cast<size_t>(start + chunk));
        const TensorView view = host_view(stream_.chunk_rows.data(), DType::kBFloat16, chunk, cols);
        for (int64_t layer : layers) {
          (void)bare_.store.store_hidden_states(upto, view,
                                                {.layer_idx = layer, .token_offset = start});
          moved.stored += static_cast<double>(chunk * cols * 2);
        }
      }
    }
    return moved;
  }

 private:
  const Stream& stream_;
  BareStore bare_;
};

class NaiveReplay {
 public:
  NaiveReplay(const Stream& s, size_t capacity)
      : stream_(s), db_(s.options.chunk_size, false), naive_(db_, capacity) {}

  void run() {
    const int64_t chunk = stream_.options.chunk_size;
    const int64_t cols = stream_.options.hidden_dim;
    for (const workload::Request& request : stream_.requests) {
      const std::span<const int32_t> tokens(request.tokens);
      const auto n = static_cast<int64_t>(tokens.size());
      // All-or-nothing across layers, as the talker needs: each layer, then the shortest.
      int64_t prefix = n;
      std::vector<NaiveStore::Result> restored;
      for (int64_t layer : stream_.options.layers) {
        restored.push_back(naive_.retrieve(tokens, layer));
        prefix = std::min(prefix, restored.back().rows);
      }
      do_not_optimize(restored.data());
      // The draft head's last rows (the naive store has no coverage(): it retrieves and looks).
      auto whole = naive_.retrieve(tokens, stream_.draft_layer, 0);
      if (whole.rows > 0) {
        const int64_t row_begin = std::max<int64_t>(0, whole.rows - kDraftRows);
        std::vector<float> tail(whole.values.begin() + row_begin * cols, whole.values.end());
        do_not_optimize(tail.data());
      }
      for (int64_t start = prefix; start + chunk <= n; start += chunk) {
        const auto upto = tokens.first(static_cast<size_t>(start + chunk));
        const TensorView view = host_view(stream_.chunk_rows.data(), DType::kBFloat16, chunk, cols);
        for (int64_t layer : stream_.options.layers) (void)naive_.store(upto, view, layer, start);
      }
    }
  }

 private:
  const Stream& stream_;
  ChunkedTokenDatabase db_;
  NaiveStore naive_;
};

}  // namespace

void run_mixed(Context& ctx) {
  auto stream = std::make_shared<Stream>();
  if (ctx.quick) {
    stream->options.requests = 16;
    stream->options.max_prompt = 2048;
    stream->options.hidden_dim = 512;
  }
  stream->requests = workload::make_requests(stream->options);
  stream->shape = workload::stream_shape(stream->requests, stream->options.chunk_size);
  const int64_t chunk = stream->options.chunk_size;
  const int64_t cols = stream->options.hidden_dim;
  stream->chunk_rows.resize(static_cast<size_t>(chunk * cols));
  workload::thinker_rows(stream->requests.front().tokens, 0, chunk, 0, cols, stream->chunk_rows);
  stream->draft_layer = stream->options.layers.front();

  const auto layers = static_cast<int64_t>(stream->options.layers.size());
  const int64_t working_set = stream->shape.distinct_chunks * layers;  // (key, layer) entries
  ctx.report.note("mixed", std::to_string(stream->requests.size()) + " requests, " +
                               std::to_string(stream->shape.prompt_tokens) + " prompt tokens, " +
                               std::to_string(stream->shape.reusable_tokens) +
                               " reusable, working set " + std::to_string(working_set) +
                               " chunk-layers, hidden_dim " + std::to_string(cols));

  // Two pool sizes: the whole working set, and half of it (so eviction is part of the stream).
  for (const int64_t divisor : {1, 2}) {
    for (const StorageDType storage : {StorageDType::kFloat32, StorageDType::kNative}) {
      const int64_t esize = storage == StorageDType::kNative ? 2 : 4;
      const uint64_t pool = static_cast<uint64_t>(working_set / divisor + 1) *
                            static_cast<uint64_t>(chunk * cols * esize);
      // The naive store keeps float32 (LMCache's behaviour) in the same byte budget as the
      // float32 pool.
      const size_t naive_capacity =
          static_cast<size_t>(working_set / divisor + 1) * static_cast<size_t>(chunk * cols * 4);
      auto hss = std::make_shared<std::unique_ptr<HssReplay>>();
      auto naive = std::make_shared<std::unique_ptr<NaiveReplay>>();
      const Moved moved = HssReplay(*stream, pool, storage).run();  // sizes the figure
      const double bytes = moved.restored + moved.stored;
      // A fresh store per rep (built untimed; its pool is prefaulted at construction).
      Timed cand{"hss",
                 [hss, stream, pool, storage] {
                   hss->reset();
                   *hss = std::make_unique<HssReplay>(*stream, pool, storage);
                 },
                 [hss] { (void)(*hss)->run(); }, bytes,
                 static_cast<double>(stream->shape.prompt_tokens)};
      Timed ref{"naive",
                [naive, stream, naive_capacity] {
                  naive->reset();
                  *naive = std::make_unique<NaiveReplay>(*stream, naive_capacity);
                },
                [naive] { (*naive)->run(); }, bytes, 0};
      Params p;
      p.chunk_size = chunk;
      p.hidden_dim = cols;
      p.tokens = stream->shape.prompt_tokens;
      p.layers = layers;
      p.dtype = "bfloat16";
      p.storage = storage == StorageDType::kNative ? "native" : "float32";
      p.output = divisor == 1 ? "pool=working set" : "pool=half working set";
      const std::string name =
          std::string("replay ") + p.storage + "-storage" + (divisor == 1 ? "" : " half pool");
      (void)ctx.report.measure("mixed", name, p, cand, std::span<const Timed>(&ref, 1),
                               ctx.quick ? 3 : 5);
      hss->reset();
      naive->reset();
    }
  }
  ctx.report.print_workload("mixed");
}

}  // namespace hss::bench
