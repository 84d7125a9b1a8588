#include "hss_llama/talker.hpp"

#include <algorithm>
#include <cstring>

#include "hss/error.hpp"

namespace hss::llama_cpp {

Talker::Talker(const TalkerOptions& options, int input_width) : options_(options) {
  if (options.max_input_rows < 2 || options.threads <= 0) {
    throw InvalidArgument("max_input_rows/threads: need >= 2 rows and >= 1 thread, got " +
                          std::to_string(options.max_input_rows) + " and " +
                          std::to_string(options.threads));
  }
  model_ = load_model(options.model_path, "talker model_path");
  n_embd_ = llama_model_n_embd(model_.get());
  n_vocab_ = llama_vocab_n_tokens(llama_model_get_vocab(model_.get()));
  if (n_embd_ != input_width) {
    throw InvalidArgument("talker model_path: '" + options.model_path + "' has n_embd " +
                          std::to_string(n_embd_) +
                          ", but its input (the thinker's hidden "
                          "states) has width " +
                          std::to_string(input_width));
  }
  llama_context_params params = llama_context_default_params();
  params.n_ctx = static_cast<uint32_t>(options.max_input_rows);
  params.n_batch = static_cast<uint32_t>(batch_rows_);
  params.n_ubatch = static_cast<uint32_t>(batch_rows_);
  params.n_seq_max = 1;
  params.n_threads = options.threads;
  params.n_threads_batch = options.threads;
  params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  context_.reset(llama_init_from_model(model_.get(), params));
  if (!context_) throw Error("llama_init_from_model failed for '" + options.model_path + "'");
}

TalkerOutput Talker::generate(const HostTensor& input, int new_tokens) {
  const int64_t rows = input.rows();
  if (input.cols() != n_embd_) {
    throw InvalidArgument("input: width " + std::to_string(input.cols()) +
                          ", the talker's n_embd is " + std::to_string(n_embd_));
  }
  if (new_tokens < 1 || rows < 1 || rows + new_tokens > options_.max_input_rows) {
    throw InvalidArgument("input/new_tokens: " + std::to_string(rows) + " rows and " +
                          std::to_string(new_tokens) +
                          " new tokens; need >= 1 of each and at most " +
                          std::to_string(options_.max_input_rows) + " together");
  }
  llama_memory_clear(llama_get_memory(context_.get()), true);
  TalkerOutput out;
  auto pick = [&](const float* logits) {
    out.logits.insert(out.logits.end(), logits, logits + n_vocab_);
    out.tokens.push_back(
        static_cast<int32_t>(std::max_element(logits, logits + n_vocab_) - logits));
  };
  {
    Batch batch(batch_rows_, n_embd_);
    llama_batch& b = batch.get();
    for (int64_t start = 0; start < rows; start += batch_rows_) {
      b.n_tokens = static_cast<int32_t>(std::min<int64_t>(batch_rows_, rows - start));
      std::memcpy(b.embd, input.data() + start * n_embd_,
                  static_cast<size_t>(b.n_tokens) * static_cast<size_t>(n_embd_) * sizeof(float));
      for (int32_t i = 0; i < b.n_tokens; ++i) {
        b.pos[i] = static_cast<llama_pos>(start + i);
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = start + i == rows - 1 ? 1 : 0;
      }
      decode(context_.get(), b, "talker (embeddings)");
    }
    pick(llama_get_logits_ith(context_.get(), -1));
  }
  Batch batch(1, 0);
  llama_batch& b = batch.get();
  for (int step = 1; step < new_tokens; ++step) {
    b.n_tokens = 1;
    b.token[0] = out.tokens.back();
    b.pos[0] = static_cast<llama_pos>(rows + step - 1);
    b.n_seq_id[0] = 1;
    b.seq_id[0][0] = 0;
    b.logits[0] = 1;
    decode(context_.get(), b, "talker (tokens)");
    pick(llama_get_logits_ith(context_.get(), -1));
  }
  return out;
}

}  // namespace hss::llama_cpp
