#include "batch_step.hpp"

#include <string>

#include "common.hpp"

namespace hss::bench {

std::shared_ptr<Step> make_step(const void* rows, Device device, const std::vector<void*>& outs,
                                int64_t chunks) {
  if (chunks < 1 || chunks > kStepMaxChunks || outs.size() < static_cast<size_t>(kStepItems)) {
    throw InvalidArgument("make_step: chunks must be 1.." + std::to_string(kStepMaxChunks) +
                          " and outs hold " + std::to_string(kStepItems) + " buffers, got " +
                          std::to_string(chunks) + " and " + std::to_string(outs.size()));
  }
  auto step = std::make_shared<Step>();
  step->tokens = chunks * kStepChunk;
  for (int r = 0; r < kStepRequests; ++r) {
    step->prompts32.push_back(make_tokens(step->tokens, 1000 + static_cast<uint64_t>(r)));
    step->prompts.emplace_back(step->prompts32.back().begin(), step->prompts32.back().end());
  }
  for (int layer = 0; layer < kStepLayers; ++layer) {
    for (int r = 0; r < kStepRequests; ++r) {
      StoreOptions so;
      so.layer_idx = layer;
      step->stores.push_back({step->prompts[static_cast<size_t>(r)],
                              {rows, DType::kFloat32, step->tokens, kStepHidden, 0, device, 0},
                              so});
      RetrieveOptions ro;
      ro.layer_idx = layer;
      step->retrieves.push_back(
          {step->prompts[static_cast<size_t>(r)],
           {outs[step->retrieves.size()], DType::kFloat32, step->tokens, kStepHidden, 0, device, 0},
           ro});
    }
  }
  return step;
}

StepStore::StepStore() : db(kStepChunk, false), store(config(), db) {}

Config StepStore::config() {
  Config c;
  c.chunk_size = kStepChunk;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = 8.0 / 1024;  // 8 MiB: 4x the two-chunk step's 1536 chunks
  c.hidden_state_block_bytes = kStepChunk * kStepHidden * 4;
  return c;
}

void StepStore::drop(std::span<const int32_t> tokens) {
  for (const Chunk& chunk : db.process_tokens(tokens)) (void)store.drop_key(chunk.key);
}

void StepStore::drop_all(const Step& step) {
  for (const auto& p : step.prompts32) drop(p);
}

void StepStore::bind_kv(const Step& step) {
  const std::byte one{1};
  for (const auto& p : step.prompts32) {
    for (const Chunk& chunk : db.process_tokens(p)) (void)kv.put(chunk.key, {&one, 1});
  }
  store.bind_storage_manager(&kv);
}

}  // namespace hss::bench
