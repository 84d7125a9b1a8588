#pragma once
// RAII owners of llama.cpp's handles (model, context, batch) and the loads that make them, with
// errors that name what was wrong. Engine thread only: a llama_context is not thread safe.

#include <llama.h>

#include <memory>
#include <string>

namespace hss::llama_cpp {

struct ModelDeleter {
  void operator()(llama_model* model) const noexcept { llama_model_free(model); }
};
struct ContextDeleter {
  void operator()(llama_context* context) const noexcept { llama_free(context); }
};
using ModelPtr = std::unique_ptr<llama_model, ModelDeleter>;
using ContextPtr = std::unique_ptr<llama_context, ContextDeleter>;

/// A llama_batch from llama_batch_init, freed once.
class Batch {
 public:
  /// embd_width 0: a token batch; > 0: an embeddings batch of that width.
  Batch(int32_t capacity, int32_t embd_width);
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  [[nodiscard]] llama_batch& get() { return batch_; }
  [[nodiscard]] int32_t capacity() const { return capacity_; }

 private:
  llama_batch batch_;
  int32_t capacity_;
};

/// llama_backend_init once per process, and llama.cpp's log cut down to errors (its info lines
/// would bury the program's report; HSS_LLAMA_LOG=1 keeps them all).
void init_llama_backend();

/// Loads a GGUF model on the CPU, or on every GPU llama.cpp was built for (n_gpu_layers = all).
/// InvalidArgument naming `what` and the path when llama.cpp cannot load it.
[[nodiscard]] ModelPtr load_model(const std::string& path, const char* what);

/// llama_decode, with the return code turned into hss::Error naming `what`.
void decode(llama_context* context, llama_batch& batch, const char* what);

}  // namespace hss::llama_cpp
