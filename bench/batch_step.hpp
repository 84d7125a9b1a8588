#pragma once
// The engine step of `hss-bench batch` (and `hss-store-loop batch-*`): 256 requests x 3 layers =
// 768 items, each request a 2-chunk prefix (32 tokens of chunk size 16, hidden dim 16), with a
// hidden dim small enough that the copies are negligible: what is left is per-call overhead.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "hss/hss.hpp"

namespace hss::bench {

inline constexpr int64_t kStepChunk = 16;
inline constexpr int64_t kStepHidden = 16;
inline constexpr int64_t kStepTokens = 32;  // per request
inline constexpr int kStepRequests = 256;
inline constexpr int kStepLayers = 3;
inline constexpr int kStepItems = kStepRequests * kStepLayers;

struct Step {
  std::vector<std::vector<int32_t>> prompts32;  // for StepStore::drop
  std::vector<std::vector<int64_t>> prompts;
  std::vector<StoreItem> stores;
  std::vector<RetrieveItem> retrieves;
};

/// The step's items over `rows` (kStepTokens x kStepHidden float32, host or device) and `outs`
/// (one per item, as many as kStepItems).
[[nodiscard]] std::shared_ptr<Step> make_step(const void* rows, Device device,
                                              const std::vector<void*>& outs);

/// A store whose pool holds the whole step with room to spare and whose granule is one chunk
/// (1 KiB), so no call evicts: the figures are per-call overhead alone.
struct StepStore {
  StepStore();
  [[nodiscard]] static Config config();
  /// Drops every key of `tokens` (untimed: before each timed store).
  void drop(std::span<const int32_t> tokens);
  void drop_all(const Step& step);

  ChunkedTokenDatabase db;
  HiddenStateStore store;
};

}  // namespace hss::bench
