#pragma once
// hss::workload: the deterministic workload shared by hss-demo and hss-bench.
//
// A request stream of multi-turn conversations that share long system prompts, and a synthetic
// "thinker" whose hidden state for row r is a pure function of (tokens[0..r], layer, column). Any
// stage can therefore recompute the exact bfloat16 value a restore must return, bit for bit,
// without a model.
//
// Thread safety: every function is pure (no shared state) and may be called from any thread.

#include <cstdint>
#include <span>
#include <vector>

namespace hss::workload {

struct WorkloadOptions {
  int requests = 64;  ///< requests in the stream
  int64_t hidden_dim = 1024;
  std::vector<int64_t> layers = {-1, 8, 16};  ///< final state + two taps
  uint64_t seed = 1;
  int64_t chunk_size = 256;
  int64_t min_prompt = 300, max_prompt = 8192;  ///< tokens
};

struct Request {
  int id;
  int conversation;
  int turn;  ///< 0 for a conversation's first request
  std::vector<int32_t> tokens;
};

/// Token ids lie in [0, kVocabSize).
inline constexpr int32_t kVocabSize = 32000;

/// Deterministic multi-turn conversations sharing long system prompts and earlier turns, in an
/// order that re-uses prefixes: turn t of a conversation is its turn t-1 prompt, the assistant's
/// reply and a new user message. Every prompt has min_prompt..max_prompt tokens. The same options
/// give the same stream on every machine. InvalidArgument-style std::invalid_argument on
/// requests < 0, chunk_size <= 0 or min_prompt > max_prompt.
[[nodiscard]] std::vector<Request> make_requests(const WorkloadOptions& options);

/// Deterministic synthetic thinker: bfloat16 bits of rows [row_begin, row_end) of the hidden
/// state of `layer` for the token sequence `tokens` (row r depends on tokens[0..r], the layer and
/// the column only), written row-major into out ((row_end-row_begin) x hidden_dim). Every value
/// is a finite, normal bfloat16 with magnitude in [2^-8, 2^8). Cost: O(row_end) for the prefix
/// hash plus one integer mix per element. std::invalid_argument on a bad range or short `out`.
void thinker_rows(std::span<const int32_t> tokens, int64_t row_begin, int64_t row_end,
                  int64_t layer, int64_t hidden_dim, std::span<uint16_t> out);

/// The float32 value a restore must return for (tokens, row, layer, col): the widening of the
/// above. O(row): use thinker_rows for whole rows.
[[nodiscard]] float expected_value(std::span<const int32_t> tokens, int64_t row, int64_t layer,
                                   int64_t col);

/// KV rows for the same prefix: kv_width bfloat16 per token, a function of tokens[0..r] only,
/// distinct from every hidden-state layer. Same contract as thinker_rows.
void kv_rows(std::span<const int32_t> tokens, int64_t row_begin, int64_t row_end, int64_t kv_width,
             std::span<uint16_t> out);

/// Widening of a bfloat16 bit pattern (exact).
[[nodiscard]] float bf16_to_float(uint16_t bits);

/// Total tokens of the stream and tokens that a perfect, unbounded prefix cache would have
/// served (the longest chunk-aligned prefix shared with any earlier request), for sizing pools
/// and judging hit rates.
struct StreamShape {
  int64_t prompt_tokens = 0;
  int64_t reusable_tokens = 0;
  int64_t distinct_chunks = 0;  ///< distinct full chunks (the working set of the cache)
  int64_t max_prompt = 0;
};
[[nodiscard]] StreamShape stream_shape(std::span<const Request> requests, int64_t chunk_size);

}  // namespace hss::workload
