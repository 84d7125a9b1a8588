#pragma once
// The two-stage pipeline hss-demo runs: a thinker that prefills and stores KV and hidden states
// one full chunk at a time, a talker that restores every layer all-or-nothing and recomputes
// only what is missing, and a draft head (EAGLE/MTP style) that restores the last rows of the
// cached prefix. Every restored value is checked bit for bit against the synthetic thinker.
//
// Thread safety: run_pipeline drives one engine from the calling thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "hss/engine.hpp"
#include "workload/workload.hpp"

namespace hss::demo {

class DeviceStage;

inline constexpr int64_t kKvWidth = 64;   ///< bfloat16 values of KV per token (opaque to hss)
inline constexpr int64_t kDraftRows = 8;  ///< rows the draft head restores

struct PipelineOptions {
  std::vector<int64_t> layers;
  int64_t hidden_dim = 1024;
  int64_t draft_layer = -1;
  /// Test only: flip one bit of one restored row before checking, so the check must fail.
  bool corrupt_restore = false;
  DeviceStage* device = nullptr;  ///< null: host path
};

struct Mismatch {
  int request = 0;
  std::string consumer;  ///< "talker", "draft" or "kv"
  int64_t layer = 0;
  int64_t row = 0;
  int64_t col = 0;
  uint32_t got_bits = 0, expected_bits = 0;

  [[nodiscard]] std::string describe() const;
};

struct PipelineResult {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int64_t kv_hit_tokens = 0;      ///< lookup() prefix, summed
  int64_t talker_hit_tokens = 0;  ///< rows restored for every layer, summed
  int64_t talker_recomputed = 0;  ///< rows the thinker had to produce for the talker
  int64_t draft_lookups = 0;
  int64_t draft_hits = 0;
  int64_t draft_rows_restored = 0;  ///< rows the draft head did not have to recompute
  int64_t chunks_stored = 0;        ///< store calls that wrote a chunk for one layer
  uint64_t hs_store_bytes = 0, hs_restore_bytes = 0, kv_store_bytes = 0, kv_restore_bytes = 0;
  double hs_store_s = 0, hs_restore_s = 0, kv_store_s = 0, kv_restore_s = 0;
  int64_t mismatched_rows = 0;
  std::vector<Mismatch> mismatches;  ///< the first few
  bool corrupted = false;            ///< --corrupt-restore has flipped its bit
};

/// Called after each request.
using ProgressFn = std::function<void(const PipelineResult&, int total_requests)>;

/// Runs the stream; the engine must have a hidden-state store.
PipelineResult run_pipeline(Engine& engine, std::span<const workload::Request> requests,
                            const PipelineOptions& options, const ProgressFn& progress);

}  // namespace hss::demo
