// The workload contract hss-demo and hss-bench rely on: determinism, prefix dependence only,
// finite values, and a stream shaped like multi-turn traffic.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <map>
#include <vector>

#include "workload/workload.hpp"

namespace hss::workload {
namespace {

std::vector<uint16_t> rows(std::span<const int32_t> tokens, int64_t begin, int64_t end,
                           int64_t layer, int64_t dim) {
  std::vector<uint16_t> out(static_cast<size_t>((end - begin) * dim));
  thinker_rows(tokens, begin, end, layer, dim, out);
  return out;
}

TEST(Workload, SameOptionsGiveTheSameStream) {
  WorkloadOptions o;
  o.requests = 40;
  const auto a = make_requests(o);
  const auto b = make_requests(o);
  ASSERT_EQ(a.size(), 40u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].id, static_cast<int>(i));
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(a[i].conversation, b[i].conversation);
  }
  o.seed = 2;
  EXPECT_NE(make_requests(o)[0].tokens, a[0].tokens);
}

TEST(Workload, PromptsRespectLengthBoundsAndVocabulary) {
  WorkloadOptions o;
  o.requests = 100;
  o.min_prompt = 300;
  o.max_prompt = 4096;
  for (const Request& r : make_requests(o)) {
    EXPECT_GE(r.tokens.size(), 300u);
    EXPECT_LE(r.tokens.size(), 4096u);
    for (int32_t t : r.tokens) ASSERT_TRUE(t >= 0 && t < kVocabSize);
  }
}

TEST(Workload, LaterTurnsExtendTheirConversation) {
  WorkloadOptions o;
  o.requests = 64;
  std::map<int, std::vector<int32_t>> last;
  int extended = 0;
  for (const Request& r : make_requests(o)) {
    if (auto it = last.find(r.conversation); it != last.end() && r.turn > 0) {
      ASSERT_GT(r.tokens.size(), it->second.size());
      EXPECT_TRUE(std::equal(it->second.begin(), it->second.end(), r.tokens.begin()))
          << "request " << r.id << " does not start with its previous turn";
      ++extended;
    }
    last[r.conversation] = r.tokens;
  }
  EXPECT_GT(extended, 20);
}

TEST(Workload, StreamReusesPrefixesButNotEverything) {
  WorkloadOptions o;
  o.requests = 64;
  const auto requests = make_requests(o);
  const StreamShape shape = stream_shape(requests, 256);
  EXPECT_GT(shape.reusable_tokens, shape.prompt_tokens / 4);
  EXPECT_LT(shape.reusable_tokens, shape.prompt_tokens);
  EXPECT_LT(shape.distinct_chunks * 256, shape.prompt_tokens);
  EXPECT_LE(shape.max_prompt, o.max_prompt);
}

TEST(Workload, RowDependsOnItsPrefixOnly) {
  std::vector<int32_t> a = {5, 6, 7, 8, 9};
  std::vector<int32_t> b = {5, 6, 7, 1, 2};
  EXPECT_EQ(rows(a, 0, 3, -1, 64), rows(b, 0, 3, -1, 64));
  EXPECT_NE(rows(a, 3, 4, -1, 64), rows(b, 3, 4, -1, 64));
  std::vector<int32_t> c = {4, 6, 7, 8, 9};  // first token differs: every row differs
  EXPECT_NE(rows(a, 4, 5, -1, 64), rows(c, 4, 5, -1, 64));
}

TEST(Workload, RangesAgreeWithWholeComputation) {
  std::vector<int32_t> tokens(600);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7919 % 32000);
  const auto all = rows(tokens, 0, 600, 8, 32);
  const auto tail = rows(tokens, 256, 512, 8, 32);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), all.begin() + 256 * 32));
  EXPECT_EQ(expected_value(tokens, 300, 8, 5), bf16_to_float(all[300 * 32 + 5]));
  EXPECT_EQ(std::bit_cast<uint32_t>(expected_value(tokens, 300, 8, 5)),
            static_cast<uint32_t>(all[300 * 32 + 5]) << 16);
}

TEST(Workload, LayersAndKvDiffer) {
  std::vector<int32_t> tokens = {1, 2, 3};
  EXPECT_NE(rows(tokens, 0, 3, -1, 16), rows(tokens, 0, 3, 8, 16));
  std::vector<uint16_t> kv(3 * 16);
  kv_rows(tokens, 0, 3, 16, kv);
  EXPECT_NE(kv, rows(tokens, 0, 3, -1, 16));
}

TEST(Workload, ValuesAreFiniteNormalAndVaried) {
  std::vector<int32_t> tokens(256, 42);
  const auto values = rows(tokens, 0, 256, -1, 1024);
  int negative = 0;
  std::map<uint16_t, int> distinct;
  for (uint16_t bits : values) {
    const float v = bf16_to_float(bits);
    ASSERT_TRUE(std::isnormal(v));
    ASSERT_GE(std::fabs(v), 1.0f / 256);
    ASSERT_LT(std::fabs(v), 256.0f);
    negative += v < 0;
    ++distinct[bits];
  }
  EXPECT_NEAR(negative, static_cast<int>(values.size()) / 2, static_cast<int>(values.size()) / 20);
  EXPECT_GT(distinct.size(), 3000u);  // 2 * 16 * 128 = 4096 possible patterns
}

TEST(Workload, BadArgumentsThrow) {
  std::vector<int32_t> tokens = {1, 2, 3};
  std::vector<uint16_t> out(2);
  EXPECT_THROW(thinker_rows(tokens, 0, 4, 0, 1, out), std::invalid_argument);
  EXPECT_THROW(thinker_rows(tokens, 0, 3, 0, 1, out), std::invalid_argument);  // out too short
  EXPECT_THROW(thinker_rows(tokens, 2, 1, 0, 1, out), std::invalid_argument);
  EXPECT_THROW((void)expected_value(tokens, 3, 0, 0), std::invalid_argument);
  WorkloadOptions o;
  o.min_prompt = 10;
  o.max_prompt = 5;
  EXPECT_THROW((void)make_requests(o), std::invalid_argument);
}

}  // namespace
}  // namespace hss::workload
