#pragma once
// hss::Engine: one worker's cache. Owns the config, the token database, the KV backend
// (LocalCpuBackend, the StorageManager) and, when enable_hidden_state_cache is true, the
// hidden-state store bound to that KV backend.
//
// Thread safety and blocking: docs/design.md, "What may run concurrently and what may block the
// host".

#include <cstdint>
#include <memory>
#include <span>

#include "hss/config.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/local_cpu_backend.hpp"
#include "hss/tensor.hpp"
#include "hss/token_database.hpp"
#include "hss/token_ids.hpp"

namespace hss {

class Engine {
 public:
  /// Validates the config (ConfigError) and builds every component.
  [[nodiscard]] static std::unique_ptr<Engine> create(const Config& config,
                                                      const Metadata& metadata = {});
  /// Use create(); the key keeps construction behind its validation.
  class ConstructionKey {
    friend class Engine;
    ConstructionKey() = default;
  };
  Engine(ConstructionKey, const Config& config, const Metadata& metadata);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  [[nodiscard]] const Config& config() const { return config_; }
  [[nodiscard]] const Metadata& metadata() const { return token_database_.metadata(); }
  [[nodiscard]] const TokenDatabase& token_database() const { return token_database_; }
  [[nodiscard]] StorageManager* storage_manager() { return &kv_backend_; }
  [[nodiscard]] LocalCpuBackend& kv_backend() { return kv_backend_; }
  /// nullptr when enable_hidden_state_cache is false: skip every hidden-state call then.
  [[nodiscard]] HiddenStateStore* hidden_state_store() { return hidden_state_store_.get(); }

  /// Stores KV rows for the chunks of `tokens` starting at or after token_offset; `kv` is a host
  /// tensor [len(tokens) - token_offset, kv_width] of any dtype (opaque bytes per token). Chunks
  /// already held are skipped. Returns the chunks of that range held after the call.
  int64_t store(TokenIds tokens, const TensorView& kv, int64_t token_offset = 0);

  /// Copies the longest cached KV prefix into kv_out (host, rows >= prefix, same dtype/width as
  /// stored). Returns the tokens retrieved.
  int64_t retrieve(TokenIds tokens, const MutableTensorView& kv_out);

  /// Tokens of the longest prefix whose every chunk has KV. Changes nothing.
  [[nodiscard]] int64_t lookup(TokenIds tokens) const;

 private:
  Config config_;
  ChunkedTokenDatabase token_database_;
  LocalCpuBackend kv_backend_;
  std::unique_ptr<HiddenStateStore> hidden_state_store_;
};

}  // namespace hss
