#pragma once
// hss::llama_cpp::Talker: a second llama.cpp model that reads the thinker's final hidden states as
// its input embeddings (llama_batch::embd, one row per prompt token) and generates a few tokens
// greedily. Its output is a function of those rows alone, so it equals a cold run's exactly when
// the rows do: the test that the hidden states of a reused prefix were really there.
//
// Engine thread only (one llama_context).

#include <cstdint>
#include <string>
#include <vector>

#include "hss/tensor.hpp"
#include "hss_llama/llama_handles.hpp"

namespace hss::llama_cpp {

struct TalkerOptions {
  std::string model_path;
  int max_input_rows = 256;  ///< KV cells: input rows plus generated tokens
  int threads = 1;
};

struct TalkerOutput {
  std::vector<int32_t> tokens;  ///< greedy, ties to the lowest id
  std::vector<float> logits;    ///< tokens.size() x n_vocab: the logits each token was chosen from
};

class Talker {
 public:
  /// InvalidArgument when the model's width is not `input_width` (the thinker's n_embd: another
  /// width cannot read its states) or the model cannot be loaded (naming the path).
  Talker(const TalkerOptions& options, int input_width);

  /// The input rows (cols = input_width, 1..max_input_rows - new_tokens rows, else
  /// InvalidArgument) as embeddings, then `new_tokens` (>= 1) generated tokens.
  [[nodiscard]] TalkerOutput generate(const HostTensor& input, int new_tokens);

  [[nodiscard]] int n_vocab() const { return n_vocab_; }

 private:
  TalkerOptions options_;
  ModelPtr model_;
  ContextPtr context_;
  int n_embd_ = 0, n_vocab_ = 0;
  int batch_rows_ = 64;
};

}  // namespace hss::llama_cpp
