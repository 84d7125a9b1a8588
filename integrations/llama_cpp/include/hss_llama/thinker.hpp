#pragma once
// hss::llama_cpp::Thinker: a llama.cpp context whose prompts reuse a shared prefix's KV
// (llama.cpp's own sequences) AND its hidden states (hss::HiddenStateStore), so the consumer gets
// every row of the prompt: the prefix restored from the store, the tail computed, one contiguous
// tensor per captured layer.
//
// Per evaluated token it captures the final hidden state (llama_set_embeddings, pooling none,
// llama_get_embeddings_ith: the output norm's result, the row the LM head reads) and the residual
// stream after one intermediate layer (cb_eval on `l_out-<n>`), and stores both under the
// prompt's chunk keys with token_offset = the first evaluated token.
//
// KV reuse (why llama.cpp's own sequences, not state save/restore): each of n_sequences llama.cpp
// sequences is its own KV stream (kv_unified = false); a prompt is decoded into a sequence that
// starts as a copy of the one holding its longest prefix (llama_memory_seq_cp, then
// llama_memory_seq_rm past the prefix). The prefix's KV stays in llama.cpp's cache, in the cells a
// cold run would use, so the tail is computed with exactly the arithmetic of a cold run (same
// cells, same batch split: one batch per chunk) and matches it bit for bit; no per-chunk state
// blobs are copied out of the engine and back. SequenceKv answers the store's KV question from
// those sequences: a prefix llama.cpp dropped is never served.
//
// Engine thread only (one llama_context); the store may be shared with other threads.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hss/hidden_state_store.hpp"
#include "hss/tensor.hpp"
#include "hss/token_database.hpp"
#include "hss_llama/llama_handles.hpp"
#include "hss_llama/sequence_kv.hpp"

namespace hss::llama_cpp {

struct ThinkerOptions {
  std::string model_path;
  int n_sequences = 4;        ///< llama.cpp sequences (KV streams) prefixes are kept in
  int sequence_tokens = 256;  ///< KV cells per sequence: the longest prompt
  int threads = 1;            ///< llama.cpp's threads (the same for runs compared bit for bit)
  int capture_layer = -1;     ///< l_out-<n> captured besides the final state; -1: n_layer / 2
  /// false: the KV-only engine (llama.cpp's prefix reuse alone): a reused prefix yields no hidden
  /// states, so the result holds the computed tail only (the counter-example).
  bool use_hidden_state_store = true;
};

struct ThinkerResult {
  HostTensor final_states;       ///< [rows, n_embd]: prompt rows [first_row, prompt length)
  HostTensor layer_states;       ///< l_out-<capture_layer>, the same rows
  int64_t first_row = 0;         ///< 0, but in the KV-only engine (the first computed token)
  int64_t rows_restored = 0;     ///< from the hidden-state store
  int64_t rows_computed = 0;     ///< evaluated by llama.cpp now
  int64_t kv_tokens_reused = 0;  ///< prefix tokens whose KV llama.cpp already held
  int sequence = 0;              ///< the llama.cpp sequence that holds the prompt now
};

class Thinker {
 public:
  /// `store` may be null only with use_hidden_state_store = false, and must outlive the Thinker.
  /// The Thinker binds its SequenceKv to the store; its destructor rebinds the store to a manager
  /// that holds nothing (the engine's KV is gone with it, so the store serves none of its rows).
  /// The token database must give the trailing partial chunk a key (save_unfull_chunk) so that
  /// every evaluated row is stored. InvalidArgument naming the option for a bad one; for a model
  /// that cannot be loaded, the path.
  Thinker(const ThinkerOptions& options, HiddenStateStore* store,
          const TokenDatabase& token_database);
  ~Thinker();
  Thinker(const Thinker&) = delete;
  Thinker& operator=(const Thinker&) = delete;

  /// Runs a prompt (token ids in [0, n_vocab), 1..sequence_tokens of them; else InvalidArgument
  /// naming the id or the length, with nothing changed).
  [[nodiscard]] ThinkerResult run(std::span<const int32_t> prompt);

  /// llama.cpp drops sequence `seq` (what its cache does to a sequence it reuses for another
  /// request). The store no longer serves that prefix's hidden states.
  void drop_sequence(int seq);

  [[nodiscard]] int n_embd() const { return n_embd_; }
  [[nodiscard]] int n_layer() const { return n_layer_; }
  [[nodiscard]] int n_vocab() const { return n_vocab_; }
  [[nodiscard]] int capture_layer() const { return capture_layer_; }
  /// The layer_idx the final state is stored under (n_layer: after the last block and its norm).
  [[nodiscard]] int64_t final_layer_idx() const { return n_layer_; }
  [[nodiscard]] const SequenceKv& sequence_kv() const { return sequence_kv_; }
  [[nodiscard]] llama_context* context() { return context_.get(); }

 private:
  static bool on_eval(ggml_tensor* tensor, bool ask, void* user_data);
  bool capture(const ggml_tensor* tensor);
  int pick_sequence(int keep) const;
  void store_rows(std::span<const Chunk> chunks, int64_t first, const HostTensor& final_states,
                  HostTensor& layer_states);

  ThinkerOptions options_;
  HiddenStateStore* store_;
  const TokenDatabase& token_database_;
  SequenceKv sequence_kv_;
  ModelPtr model_;
  ContextPtr context_;
  int n_embd_ = 0, n_layer_ = 0, n_vocab_ = 0, capture_layer_ = 0;
  std::string capture_name_;
  std::vector<uint64_t> last_use_;
  uint64_t clock_ = 0;

  // What the evaluation callback writes during one llama_decode.
  struct CaptureTarget {
    float* rows = nullptr;  ///< host rows of the batch's first token (the host path)
    int64_t n_tokens = 0;
    bool seen = false;
    std::string error;
    // The device path: the batch's chunk, stored straight from the device tensor.
    const Chunk* chunk = nullptr;
    std::span<const Chunk> chunks_to_here;
  } target_;
  bool layer_on_device_ = false;  ///< the last capture found l_out in device memory
};

}  // namespace hss::llama_cpp
