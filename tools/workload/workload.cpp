#include "workload/workload.hpp"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace hss::workload {
namespace {

// SplitMix64 finaliser: a full-avalanche 64-bit mix, cheap enough for per-token use.
constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(mix64(seed ^ 0x5851F42D4C957F2DULL)) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    return mix64(state_);
  }
  /// Uniform in [lo, hi] (hi >= lo); the modulo bias is irrelevant at these ranges.
  int64_t uniform(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }

 private:
  uint64_t state_;
};

constexpr uint64_t kRootHash = 0x6A09E667F3BCC908ULL;
constexpr uint64_t kKvSalt = 0x3C6EF372FE94F82BULL;

constexpr uint64_t step_hash(uint64_t prev, int32_t token) {
  return mix64(prev +
               (static_cast<uint64_t>(static_cast<uint32_t>(token)) + 1) * 0x9E3779B97F4A7C15ULL);
}

constexpr uint64_t layer_salt(int64_t layer) {
  return mix64(static_cast<uint64_t>(layer) ^ 0xA54FF53A5F1D36F1ULL);
}

/// The bfloat16 for one (row hash ^ salt, column). Two multiply-xorshift rounds: columns differ
/// by a constant step, so one round alone leaves visible structure in the low mantissa bits.
inline uint16_t element(uint64_t row_key, int64_t col) {
  uint64_t y = row_key + static_cast<uint64_t>(col) * 0xD1B54A32D192ED03ULL;
  y ^= y >> 32;
  y *= 0xD6E8FEB86659FD93ULL;
  y ^= y >> 32;
  // sign | exponent 119..134 (|v| in [2^-8, 2^8)) | 7 mantissa bits: always finite and normal,
  // so float32 widening and any compare is exact.
  const auto sign = static_cast<uint16_t>((y >> 63) << 15);
  const auto exponent = static_cast<uint16_t>((119 + ((y >> 40) & 15)) << 7);
  const auto mantissa = static_cast<uint16_t>((y >> 8) & 0x7F);
  return static_cast<uint16_t>(sign | exponent | mantissa);
}

void check_range(std::span<const int32_t> tokens, int64_t row_begin, int64_t row_end, int64_t width,
                 size_t out_size) {
  if (row_begin < 0 || row_end < row_begin || row_end > static_cast<int64_t>(tokens.size()) ||
      width <= 0) {
    throw std::invalid_argument("workload: bad row range [" + std::to_string(row_begin) + ", " +
                                std::to_string(row_end) + ") for " + std::to_string(tokens.size()) +
                                " tokens, width " + std::to_string(width));
  }
  if (static_cast<int64_t>(out_size) < (row_end - row_begin) * width) {
    throw std::invalid_argument("workload: output holds " + std::to_string(out_size) +
                                " values, needs " + std::to_string((row_end - row_begin) * width));
  }
}

void fill_rows(std::span<const int32_t> tokens, int64_t row_begin, int64_t row_end, uint64_t salt,
               int64_t width, std::span<uint16_t> out) {
  check_range(tokens, row_begin, row_end, width, out.size());
  uint64_t h = kRootHash;
  for (int64_t r = 0; r < row_begin; ++r) h = step_hash(h, tokens[static_cast<size_t>(r)]);
  uint16_t* dst = out.data();
  for (int64_t r = row_begin; r < row_end; ++r) {
    h = step_hash(h, tokens[static_cast<size_t>(r)]);
    const uint64_t key = h ^ salt;
    for (int64_t c = 0; c < width; ++c) dst[c] = element(key, c);
    dst += width;
  }
}

std::vector<int32_t> random_tokens(Rng& rng, int64_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = static_cast<int32_t>(rng.next() % kVocabSize);
  return tokens;
}

struct Conversation {
  int id = 0;
  int turn = 0;
  std::vector<int32_t> history;  ///< what the next turn's prompt starts with
};

}  // namespace

float bf16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

void thinker_rows(std::span<const int32_t> tokens, int64_t row_begin, int64_t row_end,
                  int64_t layer, int64_t hidden_dim, std::span<uint16_t> out) {
  fill_rows(tokens, row_begin, row_end, layer_salt(layer), hidden_dim, out);
}

void kv_rows(std::span<const int32_t> tokens, int64_t row_begin, int64_t row_end, int64_t kv_width,
             std::span<uint16_t> out) {
  fill_rows(tokens, row_begin, row_end, kKvSalt, kv_width, out);
}

float expected_value(std::span<const int32_t> tokens, int64_t row, int64_t layer, int64_t col) {
  if (row < 0 || row >= static_cast<int64_t>(tokens.size()) || col < 0) {
    throw std::invalid_argument("workload: bad element (row " + std::to_string(row) + ", col " +
                                std::to_string(col) + ") for " + std::to_string(tokens.size()) +
                                " tokens");
  }
  uint64_t h = kRootHash;
  for (int64_t r = 0; r <= row; ++r) h = step_hash(h, tokens[static_cast<size_t>(r)]);
  return bf16_to_float(element(h ^ layer_salt(layer), col));
}

std::vector<Request> make_requests(const WorkloadOptions& options) {
  if (options.requests < 0 || options.chunk_size <= 0 || options.min_prompt < 1 ||
      options.min_prompt > options.max_prompt) {
    throw std::invalid_argument(
        "workload: need requests >= 0, chunk_size > 0 and 1 <= min_prompt <= max_prompt");
  }
  Rng rng(options.seed);
  const int64_t lo = options.min_prompt, hi = options.max_prompt;

  // Shared system prompts: an eighth to a third of the longest prompt, so that later turns still
  // have room. A few of them serve most conversations, as in a deployment with a handful of
  // assistants.
  const int num_system = std::clamp(options.requests / 12 + 2, 2, 8);
  std::vector<std::vector<int32_t>> system_prompts;
  for (int i = 0; i < num_system; ++i) {
    const int64_t len = rng.uniform(std::max<int64_t>(1, hi / 8), std::max<int64_t>(1, hi / 3));
    system_prompts.push_back(random_tokens(rng, len));
  }

  int next_conversation = 0;
  auto start_conversation = [&]() {
    Conversation c;
    c.id = next_conversation++;
    // One conversation in eight carries a one-off preamble: traffic that no cache can serve.
    if (rng.next() % 8 == 0) {
      c.history = random_tokens(rng, rng.uniform(std::max<int64_t>(1, hi / 16), hi / 4 + 1));
    } else {
      c.history = system_prompts[rng.next() % system_prompts.size()];
    }
    return c;
  };

  // A few conversations run at once and their turns interleave, so a prefix is re-used after a
  // variable number of other requests: the pools see LRU pressure, not a replay.
  const int active = std::clamp(options.requests / 8, 2, 12);
  std::vector<Conversation> conversations;
  for (int i = 0; i < active; ++i) conversations.push_back(start_conversation());

  std::vector<Request> requests;
  requests.reserve(static_cast<size_t>(options.requests));
  for (int id = 0; id < options.requests; ++id) {
    Conversation& c = conversations[rng.next() % conversations.size()];
    int64_t user = rng.uniform(16, 512);
    if (static_cast<int64_t>(c.history.size()) + user > hi && c.turn > 0) {
      c = start_conversation();  // context window full: the user starts over
    }
    const auto base = static_cast<int64_t>(c.history.size());
    user = std::max(user, lo - base);
    std::vector<int32_t> prompt = c.history;
    const auto message = random_tokens(rng, user);
    prompt.insert(prompt.end(), message.begin(), message.end());
    if (static_cast<int64_t>(prompt.size()) > hi) prompt.resize(static_cast<size_t>(hi));
    requests.push_back({id, c.id, c.turn, prompt});

    // The assistant's reply becomes part of the next turn's prompt.
    const auto reply = random_tokens(rng, rng.uniform(32, 768));
    c.history = std::move(prompt);
    c.history.insert(c.history.end(), reply.begin(), reply.end());
    ++c.turn;
  }
  return requests;
}

StreamShape stream_shape(std::span<const Request> requests, int64_t chunk_size) {
  if (chunk_size <= 0) throw std::invalid_argument("workload: chunk_size must be > 0");
  StreamShape shape;
  std::unordered_set<uint64_t> seen;  // prefix hashes at chunk boundaries
  for (const auto& request : requests) {
    const auto n = static_cast<int64_t>(request.tokens.size());
    shape.prompt_tokens += n;
    shape.max_prompt = std::max(shape.max_prompt, n);
    uint64_t h = kRootHash;
    bool still_shared = true;
    for (int64_t end = chunk_size; end <= n; end += chunk_size) {
      for (int64_t r = end - chunk_size; r < end; ++r) {
        h = step_hash(h, request.tokens[static_cast<size_t>(r)]);
      }
      const bool fresh = seen.insert(h).second;
      if (fresh) ++shape.distinct_chunks;
      still_shared = still_shared && !fresh;
      if (still_shared) shape.reusable_tokens += chunk_size;
    }
  }
  return shape;
}

}  // namespace hss::workload
