#include "hss/engine.hpp"

#include <cstring>
#include <string>

#include "hss/detail/checked.hpp"
#include "hss/error.hpp"

namespace hss {

std::unique_ptr<Engine> Engine::create(const Config& config, const Metadata& metadata) {
  config.validate();
  return std::make_unique<Engine>(ConstructionKey{}, config, metadata);
}

Engine::Engine(ConstructionKey, const Config& config, const Metadata& metadata)
    // As its store does: the HSS_* debugging variables applied, so config() is what runs.
    : config_(config.with_env_overrides()),
      token_database_(ChunkedTokenDatabase::from_config(config_, metadata)),
      kv_backend_(config.kv_pool_bytes()) {
  if (config.enable_hidden_state_cache) {
    hidden_state_store_ = std::make_unique<HiddenStateStore>(config_, token_database_);
    hidden_state_store_->bind_storage_manager(&kv_backend_);
  }
}

Engine::~Engine() {
  if (hidden_state_store_) hidden_state_store_->close();
}

namespace {

// Limits of hss/detail/checked.hpp: cols <= 2^24 and stride <= 2^32 elements of <= 4 bytes, so
// one row, one stride and one chunk (<= 2^20 rows) stay far below 2^63 bytes.
size_t row_bytes(int64_t cols, DType dtype) {
  return static_cast<size_t>(
      detail::mul_or_throw(cols, static_cast<int64_t>(element_size(dtype)), "KV row bytes"));
}

void check_host_view(const TensorView& view, const char* name) {
  detail::check_view_shape(view.dtype, view.device, view.rows, view.cols, view.row_stride, name);
  if (view.device != Device::kHost) {
    throw InvalidArgument(std::string(name) + ".device = cuda: the KV backend takes host tensors");
  }
  if (view.rows > 0 && view.data == nullptr) {
    throw InvalidArgument(std::string(name) + ".data is null");
  }
  (void)detail::view_span_bytes(view.dtype, view.rows, view.cols, view.row_stride, name);
}

/// The chunks of `tokens`, hashed at their own width.
std::vector<Chunk> chunks_of(const ChunkedTokenDatabase& db, TokenIds tokens) {
  return tokens.visit([&](auto ids) { return db.process_tokens(ids); });
}

}  // namespace

int64_t Engine::store(TokenIds tokens, const TensorView& kv, int64_t token_offset) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (token_offset < 0 || token_offset > n) {
    throw InvalidArgument("token_offset = " + std::to_string(token_offset) + " is outside [0, " +
                          std::to_string(n) + "]");
  }
  check_host_view(kv, "kv");
  if (kv.rows != n - token_offset) {
    throw InvalidArgument(
        "kv.rows = " + std::to_string(kv.rows) +
        " must equal len(tokens) - token_offset = " + std::to_string(n - token_offset));
  }
  const std::vector<Chunk> chunks = chunks_of(token_database_, tokens);
  const size_t rb = row_bytes(kv.cols, kv.dtype);
  const size_t stride_bytes = static_cast<size_t>(kv.stride()) * element_size(kv.dtype);
  std::vector<std::byte> staging;
  int64_t held = 0;
  for (const Chunk& chunk : chunks) {
    if (chunk.start < token_offset) continue;
    if (kv_backend_.contains(chunk.key)) {
      ++held;
      continue;
    }
    const auto* first = static_cast<const std::byte*>(kv.data) +
                        static_cast<size_t>(chunk.start - token_offset) * stride_bytes;
    std::span<const std::byte> bytes;
    if (stride_bytes == rb) {
      bytes = {first, static_cast<size_t>(detail::mul_or_throw(static_cast<int64_t>(rb),
                                                               chunk.size(), "KV chunk bytes"))};
    } else {
      staging.resize(static_cast<size_t>(
          detail::mul_or_throw(static_cast<int64_t>(rb), chunk.size(), "KV chunk bytes")));
      for (int64_t r = 0; r < chunk.size(); ++r) {
        std::memcpy(staging.data() + static_cast<size_t>(r) * rb,
                    first + static_cast<size_t>(r) * stride_bytes, rb);
      }
      bytes = staging;
    }
    if (!kv_backend_.put(chunk.key, bytes)) break;  // keep the KV prefix contiguous
    ++held;
  }
  return held;
}

int64_t Engine::retrieve(TokenIds tokens, const MutableTensorView& kv_out) {
  check_host_view(kv_out.as_const(), "kv_out");
  const std::vector<Chunk> chunks = chunks_of(token_database_, tokens);
  const size_t rb = row_bytes(kv_out.cols, kv_out.dtype);
  const size_t stride_bytes = static_cast<size_t>(kv_out.stride()) * element_size(kv_out.dtype);
  // First the cached prefix and its checks, so a bad kv_out is rejected before anything is written
  // and a kv_out of exactly the prefix's rows is enough (chunks past the prefix are not looked at).
  size_t cached = 0;
  for (const Chunk& chunk : chunks) {
    const std::optional<size_t> size = kv_backend_.size_of(chunk.key);
    if (!size) break;
    if (chunk.end > kv_out.rows) {
      throw InvalidArgument("kv_out.rows = " + std::to_string(kv_out.rows) +
                            " is too small for the cached prefix (needs " +
                            std::to_string(chunk.end) + ")");
    }
    if (*size != rb * static_cast<size_t>(chunk.size())) {
      throw InvalidArgument("kv_out rows are " + std::to_string(rb) +
                            " bytes but the cached chunk was stored with another width");
    }
    ++cached;
  }
  std::vector<std::byte> staging;
  int64_t done = 0;
  for (size_t i = 0; i < cached; ++i) {
    const Chunk& chunk = chunks[i];
    const size_t size = rb * static_cast<size_t>(chunk.size());
    auto* first =
        static_cast<std::byte*>(kv_out.data) + static_cast<size_t>(chunk.start) * stride_bytes;
    if (stride_bytes == rb) {
      if (!kv_backend_.get(chunk.key, {first, size})) break;  // evicted meanwhile
    } else {
      staging.resize(size);
      if (!kv_backend_.get(chunk.key, staging)) break;
      for (int64_t r = 0; r < chunk.size(); ++r) {
        std::memcpy(first + static_cast<size_t>(r) * stride_bytes,
                    staging.data() + static_cast<size_t>(r) * rb, rb);
      }
    }
    done = chunk.end;
  }
  return done;
}

int64_t Engine::lookup(TokenIds tokens) const {
  int64_t hit = 0;
  for (const Chunk& chunk : chunks_of(token_database_, tokens)) {
    if (!kv_backend_.contains(chunk.key)) break;
    hit = chunk.end;
  }
  return hit;
}

}  // namespace hss
