#pragma once
// The engine step of `hss-bench batch` (and `hss-store-loop batch-*`): 256 requests x 3 layers =
// 768 items, each request a prefix of one chunk (16 tokens: issue 20's "768 one-chunk items") or
// two (32 tokens, the step measured before), chunk size 16, hidden dim 16: a hidden dim small
// enough that the copies are negligible, so what is left is per-call overhead.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "hss/hss.hpp"

namespace hss::bench {

inline constexpr int64_t kStepChunk = 16;
inline constexpr int64_t kStepHidden = 16;
inline constexpr int64_t kStepMaxChunks = 2;  // chunks per request: 1 or 2
inline constexpr int64_t kStepMaxTokens = kStepMaxChunks * kStepChunk;
inline constexpr int kStepRequests = 256;
inline constexpr int kStepLayers = 3;
inline constexpr int kStepItems = kStepRequests * kStepLayers;

struct Step {
  int64_t tokens = 0;                           // per request: chunks x kStepChunk
  std::vector<std::vector<int32_t>> prompts32;  // for StepStore::drop
  std::vector<std::vector<int64_t>> prompts;
  std::vector<StoreItem> stores;
  std::vector<RetrieveItem> retrieves;
};

/// The step's items of `chunks` chunks per request (1 or 2) over `rows` (at least chunks x
/// kStepChunk rows of kStepHidden float32, host or device) and `outs` (one per item, as many as
/// kStepItems, each as large as `rows`).
[[nodiscard]] std::shared_ptr<Step> make_step(const void* rows, Device device,
                                              const std::vector<void*>& outs, int64_t chunks);

/// A store whose pool holds the whole step with room to spare and whose granule is one chunk
/// (1 KiB), so no call evicts: the figures are per-call overhead alone.
struct StepStore {
  StepStore();
  [[nodiscard]] static Config config();
  /// Drops every key of `tokens` (untimed: before each timed store).
  void drop(std::span<const int32_t> tokens);
  void drop_all(const Step& step);
  /// Binds `kv`, a KV side holding every chunk of the step (one byte each), as an engine's
  /// LMCache binds its storage manager: every retrieve then asks it contains() per chunk.
  void bind_kv(const Step& step);

  ChunkedTokenDatabase db;
  LocalCpuBackend kv{1 << 20};  // declared before the store: it outlives the binding
  HiddenStateStore store;
};

}  // namespace hss::bench
