#include "hss_llama/thinker.hpp"

#include <ggml-backend.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "hss/error.hpp"

namespace hss::llama_cpp {

namespace {

/// What the store is bound to once the Thinker is gone: its sequences, and so its KV, are.
class NothingHeld final : public StorageManager {
 public:
  [[nodiscard]] bool contains(const CacheEngineKey& /*key*/) const override { return false; }
};
const NothingHeld kNothingHeld;

void require(bool ok, const std::string& message) {
  if (!ok) throw InvalidArgument(message);
}

/// The CUDA device index of a ggml buffer ("CUDA1" -> 1); 0 when its name carries none.
int device_index_of(ggml_backend_buffer_t buffer) {
  const char* name = ggml_backend_buft_name(ggml_backend_buffer_get_type(buffer));
  const char* digits = name;
  while (*digits != '\0' && (*digits < '0' || *digits > '9')) ++digits;
  return *digits != '\0' ? std::atoi(digits) : 0;
}

}  // namespace

Thinker::Thinker(const ThinkerOptions& options, HiddenStateStore* store,
                 const TokenDatabase& token_database)
    : options_(options),
      store_(options.use_hidden_state_store ? store : nullptr),
      token_database_(token_database),
      sequence_kv_(options.n_sequences) {
  require(options.n_sequences <= 64,
          "n_sequences: at most 64, got " + std::to_string(options.n_sequences));
  require(options.threads > 0, "threads: must be > 0, got " + std::to_string(options.threads));
  require(!options.use_hidden_state_store || store != nullptr,
          "store: null, but use_hidden_state_store is true");
  const int64_t chunk_size = token_database.chunk_size();
  require(options.sequence_tokens >= chunk_size,
          "sequence_tokens: " + std::to_string(options.sequence_tokens) +
              " is shorter than one chunk (" + std::to_string(chunk_size) + " tokens)");
  const std::vector<int32_t> one_token{0};
  require(!token_database.process_tokens(one_token).empty(),
          "token_database: gives a partial chunk no key (save_unfull_chunk is false), so the "
          "prompt's last rows could not be stored");

  model_ = load_model(options.model_path, "model_path");
  n_embd_ = llama_model_n_embd(model_.get());
  n_layer_ = llama_model_n_layer(model_.get());
  n_vocab_ = llama_vocab_n_tokens(llama_model_get_vocab(model_.get()));
  capture_layer_ = options.capture_layer < 0 ? n_layer_ / 2 : options.capture_layer;
  require(capture_layer_ < n_layer_, "capture_layer: " + std::to_string(options.capture_layer) +
                                         " is not a layer of '" + options.model_path + "' (" +
                                         std::to_string(n_layer_) + " layers)");
  capture_name_ = "l_out-" + std::to_string(capture_layer_);

  llama_context_params params = llama_context_default_params();
  params.n_seq_max = static_cast<uint32_t>(options.n_sequences);
  params.n_ctx = static_cast<uint32_t>(options.sequence_tokens * options.n_sequences);
  params.n_batch = static_cast<uint32_t>(chunk_size);   // one batch per chunk: the same split
  params.n_ubatch = static_cast<uint32_t>(chunk_size);  // in a cold and a warm run
  params.n_threads = options.threads;
  params.n_threads_batch = options.threads;
  params.embeddings = true;  // the final hidden state of every output token
  params.pooling_type = LLAMA_POOLING_TYPE_NONE;
  params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  params.kv_unified = false;  // one KV stream per sequence: a prefix copy keeps a cold run's cells
  params.cb_eval = &Thinker::on_eval;
  params.cb_eval_user_data = this;
  context_.reset(llama_init_from_model(model_.get(), params));
  if (!context_) throw Error("llama_init_from_model failed for '" + options.model_path + "'");
  require(llama_n_ctx_seq(context_.get()) >= static_cast<uint32_t>(options.sequence_tokens),
          "sequence_tokens: " + std::to_string(options.sequence_tokens) +
              " is more than llama.cpp gives a sequence (" +
              std::to_string(llama_n_ctx_seq(context_.get())) + ")");
  last_use_.assign(static_cast<size_t>(options.n_sequences), 0);
  if (store_ != nullptr) store_->bind_storage_manager(&sequence_kv_);
}

Thinker::~Thinker() {
  if (store_ != nullptr) store_->bind_storage_manager(&kNothingHeld);
}

bool Thinker::on_eval(ggml_tensor* tensor, bool ask, void* user_data) {
  auto* self = static_cast<Thinker*>(user_data);
  const bool wanted = self->capture_name_ == tensor->name;
  if (ask) return wanted;
  return !wanted || self->capture(tensor);
}

bool Thinker::capture(const ggml_tensor* tensor) {
  CaptureTarget& target = target_;
  if (target.n_tokens == 0) return true;  // not one of run()'s batches
  if (tensor->type != GGML_TYPE_F32 || tensor->ne[0] != n_embd_ ||
      tensor->ne[1] != target.n_tokens || tensor->nb[0] != sizeof(float)) {
    target.error = capture_name_ + ": expected f32 [" + std::to_string(n_embd_) + ", " +
                   std::to_string(target.n_tokens) + "], got type " +
                   std::to_string(static_cast<int>(tensor->type)) + " [" +
                   std::to_string(tensor->ne[0]) + ", " + std::to_string(tensor->ne[1]) + "]";
    return false;
  }
  target.seen = true;
  const auto row_bytes = static_cast<size_t>(n_embd_) * sizeof(float);
  if (tensor->buffer == nullptr || ggml_backend_buffer_is_host(tensor->buffer)) {
    layer_on_device_ = false;
    const auto* base = static_cast<const char*>(tensor->data);
    for (int64_t r = 0; r < target.n_tokens; ++r) {
      std::memcpy(target.rows + r * n_embd_, base + r * tensor->nb[1], row_bytes);
    }
    return true;
  }
  if (store_ == nullptr) {  // KV-only engine: no store to hand a device tensor to
    layer_on_device_ = false;
    for (int64_t r = 0; r < target.n_tokens; ++r) {
      ggml_backend_tensor_get(tensor, target.rows + r * n_embd_,
                              static_cast<size_t>(r) * tensor->nb[1], row_bytes);
    }
    return true;
  }
  // The device path (unmeasured here: no GPU): the rows are stored straight from llama.cpp's
  // device tensor, no host copy of ours. The scheduler synchronised its backend before calling
  // back; flush() waits for the store's own copy, so llama.cpp may reuse the buffer on return.
  try {
    layer_on_device_ = true;
    const TensorView view{tensor->data,
                          DType::kFloat32,
                          target.n_tokens,
                          n_embd_,
                          static_cast<int64_t>(tensor->nb[1] / sizeof(float)),
                          Device::kCuda,
                          device_index_of(tensor->buffer)};
    StoreOptions store_options;
    store_options.layer_idx = capture_layer_;
    store_options.token_offset = target.chunk->start;
    (void)store_->store_chunks(target.chunks_to_here, view, store_options);
    store_->flush();
  } catch (const std::exception& e) {
    target.error = std::string("storing ") + capture_name_ + " from the device: " + e.what();
    return false;
  }
  return true;
}

int Thinker::pick_sequence(int keep) const {
  int victim = -1;
  for (int seq = 0; seq < options_.n_sequences; ++seq) {
    if (seq == keep && options_.n_sequences > 1) continue;
    if (victim < 0 ||
        last_use_[static_cast<size_t>(seq)] < last_use_[static_cast<size_t>(victim)]) {
      victim = seq;
    }
  }
  return victim;
}

void Thinker::drop_sequence(int seq) {
  require(seq >= 0 && seq < options_.n_sequences,
          "seq: " + std::to_string(seq) + " is not a sequence (0.." +
              std::to_string(options_.n_sequences - 1) + ")");
  sequence_kv_.clear(seq);  // no longer answered as held, before llama.cpp frees the cells
  (void)llama_memory_seq_rm(llama_get_memory(context_.get()), seq, -1, -1);
  last_use_[static_cast<size_t>(seq)] = 0;
}

ThinkerResult Thinker::run(std::span<const int32_t> prompt) {
  const auto n = static_cast<int64_t>(prompt.size());
  require(n > 0, "prompt: empty (0 tokens); a prompt has 1 to " +
                     std::to_string(options_.sequence_tokens) + " tokens");
  require(n <= options_.sequence_tokens, "prompt: " + std::to_string(n) +
                                             " tokens, more than sequence_tokens (" +
                                             std::to_string(options_.sequence_tokens) + ")");
  for (int64_t i = 0; i < n; ++i) {
    require(prompt[static_cast<size_t>(i)] >= 0 && prompt[static_cast<size_t>(i)] < n_vocab_,
            "prompt[" + std::to_string(i) + "]: token id " +
                std::to_string(prompt[static_cast<size_t>(i)]) +
                " outside the thinker's vocabulary [0, " + std::to_string(n_vocab_) + ")");
  }
  const std::vector<Chunk> chunks = token_database_.process_tokens(prompt);
  const std::span<const Chunk> all(chunks);

  // 1. The sequence holding the longest prefix of the prompt, in whole chunks.
  int best = -1;
  size_t best_chunks = 0;
  for (int seq = 0; seq < options_.n_sequences; ++seq) {
    const std::span<const Chunk> held = sequence_kv_.chunks(seq);
    const std::span<const int32_t> held_tokens = sequence_kv_.tokens(seq);
    size_t k = 0;
    while (k < held.size() && k < chunks.size() && held[k].end == chunks[k].end &&
           held[k].key == chunks[k].key &&
           std::equal(prompt.begin() + chunks[k].start, prompt.begin() + chunks[k].end,
                      held_tokens.begin() + chunks[k].start)) {
      ++k;
    }
    if (k > best_chunks) {
      best = seq;
      best_chunks = k;
    }
  }

  // 2. The hidden states of that prefix from the store (it stops where KV or a slot is missing).
  ThinkerResult result;
  size_t reused_chunks = best_chunks;
  if (store_ != nullptr) {
    result.final_states = HostTensor(n, n_embd_);
    result.layer_states = HostTensor(n, n_embd_);
    reused_chunks = 0;
    if (best_chunks > 0) {
      const Slot slots[] = {{ActivationKind::kHidden, final_layer_idx()},
                            {ActivationKind::kHidden, capture_layer_}};
      const MutableTensorView outs[] = {result.final_states.mutable_view(),
                                        result.layer_states.mutable_view()};
      const int64_t rows = store_->retrieve_layers_into(all.first(best_chunks), slots, outs);
      while (reused_chunks < best_chunks && chunks[reused_chunks].end <= rows) ++reused_chunks;
    }
  }
  const int64_t reused = reused_chunks > 0 ? chunks[reused_chunks - 1].end : 0;
  result.first_row = store_ != nullptr ? 0 : reused;
  if (store_ == nullptr) {
    result.final_states = HostTensor(n - reused, n_embd_);
    result.layer_states = HostTensor(n - reused, n_embd_);
  }
  result.rows_restored = store_ != nullptr ? reused : 0;
  result.rows_computed = n - reused;
  result.kv_tokens_reused = reused;
  if (reused == n) {  // everything held: nothing to evaluate
    result.sequence = best;
    last_use_[static_cast<size_t>(best)] = ++clock_;
    return result;
  }

  // 3. The KV: a sequence starting as a copy of the prefix's (llama.cpp's own cells).
  llama_memory_t memory = llama_get_memory(context_.get());
  const int seq = pick_sequence(reused_chunks > 0 ? best : -1);
  if (reused_chunks > 0) last_use_[static_cast<size_t>(best)] = ++clock_;  // the source stays
  if (reused_chunks > 0 && seq != best) {
    sequence_kv_.clear(seq);
    llama_memory_seq_cp(memory, best, seq, -1, -1);
  }
  sequence_kv_.assign(seq, all.first(reused_chunks), prompt.first(static_cast<size_t>(reused)));
  if (!llama_memory_seq_rm(memory, seq, reused > 0 ? static_cast<llama_pos>(reused) : -1, -1)) {
    sequence_kv_.clear(seq);
    throw Error("llama_memory_seq_rm refused to cut sequence " + std::to_string(seq));
  }
  result.sequence = seq;
  last_use_[static_cast<size_t>(seq)] = ++clock_;

  // 4. The tail, one batch per chunk, capturing both layers of every evaluated token.
  Batch batch(static_cast<int32_t>(token_database_.chunk_size()), 0);
  llama_batch& b = batch.get();
  const auto row_bytes = static_cast<size_t>(n_embd_) * sizeof(float);
  auto fail = [&](const std::string& message) {
    target_ = {};
    sequence_kv_.clear(seq);
    (void)llama_memory_seq_rm(memory, seq, -1, -1);
    throw Error("thinker: " + message);
  };
  for (size_t c = reused_chunks; c < chunks.size(); ++c) {
    const Chunk& chunk = chunks[c];
    b.n_tokens = static_cast<int32_t>(chunk.size());
    for (int32_t i = 0; i < b.n_tokens; ++i) {
      b.token[i] = prompt[static_cast<size_t>(chunk.start + i)];
      b.pos[i] = static_cast<llama_pos>(chunk.start + i);
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = seq;
      b.logits[i] = 1;
    }
    target_ = {};
    target_.rows = result.layer_states.data() + (chunk.start - result.first_row) * n_embd_;
    target_.n_tokens = b.n_tokens;
    target_.chunk = &chunk;
    target_.chunks_to_here = all.first(c + 1);
    try {
      decode(context_.get(), b, "thinker");
    } catch (const Error& e) {
      fail(target_.error.empty() ? e.what() : target_.error);
    }
    if (!target_.seen) fail(capture_name_ + " was not evaluated");
    for (int32_t i = 0; i < b.n_tokens; ++i) {
      const float* row = llama_get_embeddings_ith(context_.get(), i);
      if (row == nullptr) fail("no embeddings for batch row " + std::to_string(i));
      std::memcpy(result.final_states.data() + (chunk.start + i - result.first_row) * n_embd_, row,
                  row_bytes);
    }
    sequence_kv_.append(
        seq, chunk,
        prompt.subspan(static_cast<size_t>(chunk.start), static_cast<size_t>(chunk.size())));
  }
  target_ = {};

  // 5. The evaluated rows into the store, token_offset = the first evaluated token.
  if (store_ != nullptr) store_rows(all, reused, result.final_states, result.layer_states);
  return result;
}

void Thinker::store_rows(std::span<const Chunk> chunks, int64_t first,
                         const HostTensor& final_states, HostTensor& layer_states) {
  const int64_t n = chunks.back().end;
  auto rows_from = [&](const HostTensor& t) {
    return TensorView{
        t.data() + first * n_embd_, DType::kFloat32, n - first, n_embd_, 0, Device::kHost, 0};
  };
  StoreOptions options;
  options.token_offset = first;
  options.layer_idx = final_layer_idx();
  (void)store_->store_chunks(chunks, rows_from(final_states), options);
  if (layer_on_device_) {
    // The device path stored l_out per chunk already; the consumer's rows come from the store.
    RetrieveOptions retrieve;
    retrieve.layer_idx = capture_layer_;
    retrieve.row_begin = first;
    const MutableTensorView tail{layer_states.data() + first * n_embd_,
                                 DType::kFloat32,
                                 n - first,
                                 n_embd_,
                                 0,
                                 Device::kHost,
                                 0};
    (void)store_->retrieve_chunks_into(chunks, tail, retrieve);
    return;
  }
  options.layer_idx = capture_layer_;
  (void)store_->store_chunks(chunks, rows_from(layer_states), options);
}

}  // namespace hss::llama_cpp
