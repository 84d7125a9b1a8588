#include "hss_llama/llama_handles.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "hss/error.hpp"

namespace hss::llama_cpp {

Batch::Batch(int32_t capacity, int32_t embd_width)
    : batch_(llama_batch_init(capacity, embd_width, 1)), capacity_(capacity) {}

Batch::~Batch() { llama_batch_free(batch_); }

namespace {
void quiet_log(ggml_log_level level, const char* text, void* /*user_data*/) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}
}  // namespace

void init_llama_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* verbose = std::getenv("HSS_LLAMA_LOG");
    if (verbose == nullptr || std::string(verbose) != "1") llama_log_set(quiet_log, nullptr);
    llama_backend_init();
  });
}

ModelPtr load_model(const std::string& path, const char* what) {
  init_llama_backend();
  llama_model_params params = llama_model_default_params();
  params.n_gpu_layers = 999;  // every layer on the GPU when llama.cpp has one; ignored on the CPU
  ModelPtr model(llama_model_load_from_file(path.c_str(), params));
  if (!model) {
    throw InvalidArgument(std::string(what) + ": llama.cpp cannot load '" + path +
                          "' (not a GGUF model it knows, or no such file)");
  }
  return model;
}

void decode(llama_context* context, llama_batch& batch, const char* what) {
  const int32_t rc = llama_decode(context, batch);
  if (rc != 0) {
    throw Error(std::string(what) + ": llama_decode returned " + std::to_string(rc) + " for " +
                std::to_string(batch.n_tokens) + " tokens");
  }
}

}  // namespace hss::llama_cpp
