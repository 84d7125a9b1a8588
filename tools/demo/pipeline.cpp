#include "demo/pipeline.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <stdexcept>

#include "demo/device_stage.hpp"
#include "hss/hidden_state_store.hpp"

namespace hss::demo {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxMismatchesKept = 16;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class RequestRun {
 public:
  RequestRun(Engine& engine, const workload::Request& request, const PipelineOptions& options,
             PipelineResult& result)
      : engine_(engine),
        hs_(*engine.hidden_state_store()),
        request_(request),
        tokens_(request.tokens),
        n_(static_cast<int64_t>(request.tokens.size())),
        options_(options),
        result_(result) {}

  void run() {
    result_.requests += 1;
    result_.prompt_tokens += n_;
    const int64_t kv_prefix = restore_kv();
    const int64_t hs_prefix = restore_talker();
    restore_draft();
    prefill_and_store(kv_prefix, hs_prefix);
  }

 private:
  // The KV prefix an engine would skip prefilling; its bytes are checked like hidden states.
  int64_t restore_kv() {
    result_.kv_hit_tokens += engine_.lookup(tokens_);
    std::vector<uint16_t> kv(static_cast<size_t>(n_ * kKvWidth));
    const auto start = Clock::now();
    const int64_t got = engine_.retrieve(
        tokens_, MutableTensorView{kv.data(), DType::kBFloat16, n_, kKvWidth, 0, Device::kHost, 0});
    result_.kv_restore_s += seconds_since(start);
    result_.kv_restore_bytes += static_cast<uint64_t>(got * kKvWidth) * sizeof(uint16_t);
    if (got > 0) {
      expected_.resize(static_cast<size_t>(got * kKvWidth));
      workload::kv_rows(tokens_, 0, got, kKvWidth, expected_);
      for (int64_t r = 0; r < got; ++r) {
        for (int64_t c = 0; c < kKvWidth; ++c) {
          const size_t i = static_cast<size_t>(r * kKvWidth + c);
          if (kv[i] != expected_[i]) {
            record({request_.id, "kv", 0, r, c, kv[i], expected_[i]});
            break;
          }
        }
      }
    }
    return got;
  }

  // All-or-nothing restore of every layer: the talker needs the same rows of each.
  int64_t restore_talker() {
    const int64_t cols = options_.hidden_dim;
    std::vector<std::vector<float>> rows_by_layer;
    int64_t prefix = 0;
    const auto start = Clock::now();
    if (options_.device == nullptr) {
      std::vector<HostTensor> restored = hs_.retrieve_layers(tokens_, options_.layers);
      result_.hs_restore_s += seconds_since(start);
      for (const HostTensor& t : restored) {
        result_.hs_restore_bytes += t.bytes();
        rows_by_layer.emplace_back(t.values().begin(), t.values().end());
      }
      prefix = restored.empty() ? 0 : restored.front().rows();
    } else {
      prefix = n_;
      for (int64_t layer : options_.layers) {
        const MutableTensorView out = options_.device->output(n_, cols);
        const int64_t rows = hs_.retrieve_hidden_states_into(tokens_, out, {.layer_idx = layer});
        auto& host = rows_by_layer.emplace_back(static_cast<size_t>(rows * cols));
        options_.device->download(out, rows, host);
        result_.hs_restore_bytes += host.size() * sizeof(float);
        prefix = std::min(prefix, rows);
      }
      result_.hs_restore_s += seconds_since(start);
      for (auto& host : rows_by_layer) host.resize(static_cast<size_t>(prefix * cols));
    }
    if (prefix == 0) return 0;
    if (options_.corrupt_restore && !result_.corrupted) {
      // Mantissa LSB of a bfloat16 value (bit 16 of its float32 widening) in the middle row.
      rows_by_layer.front()[static_cast<size_t>((prefix / 2) * cols)] = std::bit_cast<float>(
          std::bit_cast<uint32_t>(rows_by_layer.front()[static_cast<size_t>((prefix / 2) * cols)]) ^
          (1u << 16));
      result_.corrupted = true;
    }
    for (size_t l = 0; l < options_.layers.size(); ++l) {
      check_rows("talker", options_.layers[l], 0, prefix, rows_by_layer[l]);
    }
    result_.talker_hit_tokens += prefix;
    return prefix;
  }

  // EAGLE/MTP-style draft head: the last kDraftRows rows of whatever prefix is cached for it.
  void restore_draft() {
    const int64_t layer = options_.draft_layer;
    const int64_t cols = options_.hidden_dim;
    result_.draft_lookups += 1;
    const auto chunks = engine_.token_database().process_tokens(tokens_);
    const int64_t covered = hs_.coverage(chunks, std::span<const int64_t>(&layer, 1));
    if (covered == 0) return;
    const int64_t row_begin = std::max<int64_t>(0, covered - kDraftRows);
    std::vector<float> host;
    const auto start = Clock::now();
    if (options_.device == nullptr) {
      std::optional<HostTensor> t =
          hs_.retrieve_hidden_states(tokens_, {.layer_idx = layer, .row_begin = row_begin});
      result_.hs_restore_s += seconds_since(start);
      if (!t) return;
      host.assign(t->values().begin(), t->values().end());
    } else {
      const MutableTensorView out = options_.device->output(n_, cols);
      const int64_t rows = hs_.retrieve_hidden_states_into(
          tokens_, out, {.layer_idx = layer, .row_begin = row_begin});
      host.resize(static_cast<size_t>(rows * cols));
      options_.device->download(out, rows, host);
      result_.hs_restore_s += seconds_since(start);
      if (rows == 0) return;
    }
    const auto rows = static_cast<int64_t>(host.size()) / cols;
    result_.hs_restore_bytes += host.size() * sizeof(float);
    result_.draft_hits += 1;
    result_.draft_rows_restored += rows;
    check_rows("draft", layer, row_begin, rows, host);
  }

  // The thinker prefills what the talker could not restore and stores it the way an engine does:
  // one full chunk at a time, token_offset at the last stored boundary.
  void prefill_and_store(int64_t kv_prefix, int64_t hs_prefix) {
    const int64_t chunk = engine_.config().chunk_size;
    const int64_t cols = options_.hidden_dim;
    result_.talker_recomputed += n_ - hs_prefix;
    std::vector<uint16_t> kv(static_cast<size_t>(chunk * kKvWidth));
    std::vector<uint16_t> hidden(static_cast<size_t>(chunk * cols));
    bool kv_full = false;
    int64_t start = std::min(kv_prefix, hs_prefix);
    for (; start + chunk <= n_; start += chunk) {
      const int64_t end = start + chunk;
      const auto prefix = tokens_.first(static_cast<size_t>(end));
      if (start >= kv_prefix && !kv_full) {
        workload::kv_rows(tokens_, start, end, kKvWidth, kv);
        const auto t0 = Clock::now();
        const int64_t held = engine_.store(
            prefix, TensorView{kv.data(), DType::kBFloat16, chunk, kKvWidth, 0, Device::kHost, 0},
            start);
        result_.kv_store_s += seconds_since(t0);
        result_.kv_store_bytes += kv.size() * sizeof(uint16_t);
        kv_full = held == 0;  // the KV pool refused: later chunks would break the prefix
      }
      if (start < hs_prefix) continue;
      for (int64_t layer : options_.layers) {
        workload::thinker_rows(tokens_, start, end, layer, cols, hidden);
        const auto t0 = Clock::now();
        TensorView view{hidden.data(), DType::kBFloat16, chunk, cols, 0, Device::kHost, 0};
        if (options_.device != nullptr) view = options_.device->upload_bf16(hidden, chunk, cols);
        (void)hs_.store_hidden_states(prefix, view, {.layer_idx = layer, .token_offset = start});
        result_.hs_store_s += seconds_since(t0);
        result_.hs_store_bytes += hidden.size() * sizeof(uint16_t);
        result_.chunks_stored += 1;
      }
    }
    // The tail past the last full chunk is computed but, as in LMCache, not stored.
    if (start < n_) {
      for (int64_t layer : options_.layers) {
        hidden.resize(static_cast<size_t>((n_ - start) * cols));
        workload::thinker_rows(tokens_, start, n_, layer, cols, hidden);
      }
    }
  }

  void check_rows(const char* consumer, int64_t layer, int64_t row_begin, int64_t rows,
                  std::span<const float> got) {
    const int64_t cols = options_.hidden_dim;
    expected_.resize(static_cast<size_t>(rows * cols));
    workload::thinker_rows(tokens_, row_begin, row_begin + rows, layer, cols, expected_);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        const uint32_t want = static_cast<uint32_t>(expected_[i]) << 16;
        const auto have = std::bit_cast<uint32_t>(got[i]);
        if (have != want) {
          record({request_.id, consumer, layer, row_begin + r, c, have, want});
          break;  // one per row: the count is of rows
        }
      }
    }
  }

  void record(Mismatch m) {
    result_.mismatched_rows += 1;
    if (result_.mismatches.size() < kMaxMismatchesKept) result_.mismatches.push_back(std::move(m));
  }

  Engine& engine_;
  HiddenStateStore& hs_;
  const workload::Request& request_;
  std::span<const int32_t> tokens_;
  int64_t n_;
  const PipelineOptions& options_;
  PipelineResult& result_;
  std::vector<uint16_t> expected_;
};

}  // namespace

std::string Mismatch::describe() const {
  char bits[64];
  std::snprintf(bits, sizeof bits, "got 0x%08x, expected 0x%08x", got_bits, expected_bits);
  return "request " + std::to_string(request) + " " + consumer + " layer " + std::to_string(layer) +
         " row " + std::to_string(row) + " col " + std::to_string(col) + ": " + bits;
}

PipelineResult run_pipeline(Engine& engine, std::span<const workload::Request> requests,
                            const PipelineOptions& options, const ProgressFn& progress) {
  if (engine.hidden_state_store() == nullptr) {
    throw std::invalid_argument("enable_hidden_state_cache is false: nothing to demonstrate");
  }
  if (options.layers.empty() || options.hidden_dim <= 0) {
    throw std::invalid_argument("the demo needs at least one layer and hidden_dim > 0");
  }
  PipelineResult result;
  for (const workload::Request& request : requests) {
    RequestRun(engine, request, options, result).run();
    if (progress) progress(result, static_cast<int>(requests.size()));
  }
  engine.hidden_state_store()->flush();
  return result;
}

}  // namespace hss::demo
