// hss::llama_cpp against real llama.cpp and the tiny GGUF models (make_tiny_models.py): prefix
// hidden states restored + tail computed equal a cold run bit for bit, the talker's output
// equals a cold run's, a prefix llama.cpp dropped is recomputed, bad inputs are clear errors.
// Bit for bit holds because a warm run evaluates the tail with a cold run's arithmetic: the same
// threads, one batch per chunk in both, and the prefix's KV in the cells a cold run fills
// (thinker.hpp: one KV stream per sequence).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hss/config.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"
#include "hss_llama/talker.hpp"
#include "hss_llama/thinker.hpp"

namespace hss::llama_cpp {
namespace {

constexpr int kChunk = 16;
constexpr int kPrompt = 128;
const std::string kModels = HSS_LLAMA_MODELS;

std::vector<int32_t> make_tokens(uint64_t seed, int n) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (int32_t& t : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t = static_cast<int32_t>(x % 256);  // the thinker's vocabulary
  }
  return out;
}

std::vector<int32_t> sharing(const std::vector<int32_t>& base, int shared, uint64_t seed) {
  std::vector<int32_t> out(base.begin(), base.begin() + shared);
  const std::vector<int32_t> tail = make_tokens(seed, static_cast<int>(base.size()) - shared);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

Config make_config() {
  Config config;
  config.chunk_size = kChunk;
  config.save_unfull_chunk = true;
  config.max_hidden_state_cpu_size = 0.0625;
  return config;
}

struct TestEngine {
  Config config = make_config();
  ChunkedTokenDatabase token_database{kChunk, true, Metadata{"llama.cpp", "thinker", 1, 0, "f32"}};
  std::unique_ptr<HiddenStateStore> store;
  std::unique_ptr<Thinker> thinker;

  explicit TestEngine(bool use_store = true, int n_sequences = 4) {
    if (use_store) store = std::make_unique<HiddenStateStore>(config, token_database);
    ThinkerOptions options;
    options.model_path = kModels + "/thinker.gguf";
    options.n_sequences = n_sequences;
    options.use_hidden_state_store = use_store;
    thinker = std::make_unique<Thinker>(options, store.get(), token_database);
  }
};

ThinkerResult cold_run(const std::vector<int32_t>& prompt) {
  TestEngine cold;
  return cold.thinker->run(prompt);
}

TEST(LlamaThinker, ColdRunComputesEveryRowAndStoresThemUnderThePromptsChunkKeys) {
  TestEngine engine;
  const std::vector<int32_t> prompt = make_tokens(1, kPrompt);
  const ThinkerResult r = engine.thinker->run(prompt);
  EXPECT_EQ(r.rows_restored, 0);
  EXPECT_EQ(r.rows_computed, kPrompt);
  EXPECT_EQ(r.final_states.rows(), kPrompt);
  EXPECT_EQ(r.final_states.cols(), 64);
  for (const Chunk& chunk : engine.token_database.process_tokens(prompt)) {
    EXPECT_TRUE(engine.store->has_chunk(chunk.key, engine.thinker->final_layer_idx()));
    EXPECT_TRUE(engine.store->has_chunk(chunk.key, engine.thinker->capture_layer()));
  }
}

TEST(LlamaThinker, SeventyFivePercentPrefixRestoredPlusTailEqualsColdRunBitForBit) {
  TestEngine engine;
  const std::vector<int32_t> base = make_tokens(1, kPrompt);
  (void)engine.thinker->run(base);
  const std::vector<int32_t> prompt = sharing(base, 96, 75);
  const ThinkerResult warm = engine.thinker->run(prompt);
  EXPECT_EQ(warm.rows_restored, 96);
  EXPECT_EQ(warm.rows_computed, 32);
  EXPECT_EQ(warm.kv_tokens_reused, 96);
  const ThinkerResult cold = cold_run(prompt);
  EXPECT_TRUE(same_bits(warm.final_states, cold.final_states));
  EXPECT_TRUE(same_bits(warm.layer_states, cold.layer_states));
}

TEST(LlamaThinker, QuarterPrefixFromACopiedSequenceEqualsColdRunBitForBit) {
  TestEngine engine;
  const std::vector<int32_t> base = make_tokens(1, kPrompt);
  (void)engine.thinker->run(base);
  (void)engine.thinker->run(sharing(base, 96, 75));  // another sequence, copied from base's
  const std::vector<int32_t> prompt = sharing(base, 32, 25);
  const ThinkerResult warm = engine.thinker->run(prompt);
  EXPECT_EQ(warm.rows_restored, 32);
  EXPECT_EQ(warm.rows_computed, 96);
  const ThinkerResult cold = cold_run(prompt);
  EXPECT_TRUE(same_bits(warm.final_states, cold.final_states));
  EXPECT_TRUE(same_bits(warm.layer_states, cold.layer_states));
}

TEST(LlamaThinker, WholePromptHitRestoresEveryRowAndEvaluatesNothing) {
  TestEngine engine;
  const std::vector<int32_t> base = make_tokens(1, kPrompt);
  const ThinkerResult first = engine.thinker->run(base);
  const ThinkerResult again = engine.thinker->run(base);
  EXPECT_EQ(again.rows_restored, kPrompt);
  EXPECT_EQ(again.rows_computed, 0);
  EXPECT_TRUE(same_bits(again.final_states, first.final_states));
  EXPECT_TRUE(same_bits(again.layer_states, first.layer_states));
}

TEST(LlamaThinker, UnevenPromptEndsInAPartialChunkThatIsRestoredToo) {
  TestEngine engine;
  const std::vector<int32_t> base = make_tokens(3, 100);  // 6 chunks + 4 tokens
  (void)engine.thinker->run(base);
  const ThinkerResult again = engine.thinker->run(base);
  EXPECT_EQ(again.rows_restored, 100);
  EXPECT_TRUE(same_bits(again.final_states, cold_run(base).final_states));
}

TEST(LlamaThinker, PrefixLlamaCppDroppedIsRecomputedNotServed) {
  TestEngine engine;
  const std::vector<int32_t> base = make_tokens(1, kPrompt);
  const ThinkerResult first = engine.thinker->run(base);
  engine.thinker->drop_sequence(first.sequence);
  const ThinkerResult again = engine.thinker->run(base);
  EXPECT_EQ(again.rows_restored, 0);
  EXPECT_EQ(again.rows_computed, kPrompt);
  EXPECT_TRUE(same_bits(again.final_states, first.final_states));
}

TEST(LlamaThinker, StoreServesNoRowOfAPrefixLlamaCppDropped) {
  TestEngine engine;
  const std::vector<int32_t> base = make_tokens(1, kPrompt);
  const ThinkerResult first = engine.thinker->run(base);
  const int64_t layers[] = {engine.thinker->final_layer_idx(), engine.thinker->capture_layer()};
  ASSERT_EQ(engine.store->retrieve_layers(base, layers).size(), 2U);  // held while KV is
  engine.thinker->drop_sequence(first.sequence);
  EXPECT_TRUE(engine.store->retrieve_layers(base, layers).empty());
  // The walk stops at chunk 0, whose KV is gone, and drops that key (lazily, as LMCache does).
  EXPECT_EQ(engine.store->stats().coupled_evictions, 1U);
}

TEST(LlamaThinker, SequenceReusedForOtherPromptsNoLongerServesItsPrefix) {
  TestEngine engine(true, 2);
  const std::vector<int32_t> base = make_tokens(1, kPrompt);
  (void)engine.thinker->run(base);
  (void)engine.thinker->run(make_tokens(2, kPrompt));  // fills the other sequence
  (void)engine.thinker->run(make_tokens(4, kPrompt));  // takes base's sequence (least recent)
  const ThinkerResult again = engine.thinker->run(base);
  EXPECT_EQ(again.rows_restored, 0);
  EXPECT_EQ(again.rows_computed, kPrompt);
}

TEST(LlamaThinker, KvOnlyEngineGivesTheTalkerOnlyTheComputedTail) {
  TestEngine engine(false);
  const std::vector<int32_t> base = make_tokens(1, kPrompt);
  (void)engine.thinker->run(base);
  const ThinkerResult r = engine.thinker->run(sharing(base, 96, 75));
  EXPECT_EQ(r.kv_tokens_reused, 96);
  EXPECT_EQ(r.first_row, 96);
  EXPECT_EQ(r.final_states.rows(), 32);
}

TEST(LlamaThinker, EmptyPromptIsInvalidArgumentAndStoresNothing) {
  TestEngine engine;
  const std::vector<int32_t> empty;
  try {
    (void)engine.thinker->run(empty);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("prompt: empty"), std::string::npos) << e.what();
  }
  EXPECT_EQ(engine.store->stats().stores, 0U);
}

TEST(LlamaThinker, TokenOutsideTheVocabularyIsInvalidArgumentNamingIt) {
  TestEngine engine;
  std::vector<int32_t> prompt = make_tokens(1, 20);
  prompt[7] = 256;
  try {
    (void)engine.thinker->run(prompt);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("prompt[7]: token id 256"), std::string::npos) << e.what();
  }
}

TEST(LlamaThinker, MissingModelFileIsInvalidArgumentNamingThePath) {
  Config config = make_config();
  ChunkedTokenDatabase token_database(kChunk, true);
  HiddenStateStore store(config, token_database);
  ThinkerOptions options;
  options.model_path = kModels + "/no-such.gguf";
  try {
    Thinker thinker(options, &store, token_database);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no-such.gguf"), std::string::npos) << e.what();
  }
}

TEST(LlamaTalker, TokensAndLogitsFromRestoredStatesEqualAColdRuns) {
  TestEngine engine;
  const std::vector<int32_t> base = make_tokens(1, kPrompt);
  (void)engine.thinker->run(base);
  const std::vector<int32_t> prompt = sharing(base, 96, 75);
  const ThinkerResult warm = engine.thinker->run(prompt);
  Talker talker({kModels + "/talker.gguf", 256, 1}, engine.thinker->n_embd());
  const TalkerOutput said = talker.generate(warm.final_states, 4);
  const TalkerOutput cold = talker.generate(cold_run(prompt).final_states, 4);
  ASSERT_EQ(said.tokens.size(), 4U);
  EXPECT_EQ(said.tokens, cold.tokens);
  ASSERT_EQ(said.logits.size(), cold.logits.size());
  EXPECT_EQ(std::memcmp(said.logits.data(), cold.logits.data(), said.logits.size() * sizeof(float)),
            0);
}

TEST(LlamaTalker, ModelOfAnotherWidthIsInvalidArgumentNamingBothWidths) {
  try {
    Talker talker({kModels + "/talker-w32.gguf", 256, 1}, 64);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("n_embd 32"), std::string::npos) << what;
    EXPECT_NE(what.find("width 64"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace hss::llama_cpp
