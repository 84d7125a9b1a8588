// What a tier shows in the store's stats comes from the tier (BackingTier::add_store_view, no
// cast to a concrete tier in the store), and the public names of the tier scope are neutral
// (CoverageScope::kAllTiers, the older kLocalAndRemote an alias of it).

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "hss/hss.hpp"
#include "store/backing_tiers.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using detail::BackingTier;
using detail::TierRequest;
using detail::TierValue;
using detail::TierWrite;

// A tier that holds nothing and fills the Redis tier's view of the store's stats itself.
class ViewTier final : public BackingTier {
 public:
  std::string_view name() const noexcept override { return "view"; }
  bool enqueue_write(const TierWrite&, std::span<const std::span<const std::byte>>,
                     std::shared_ptr<const void>, std::function<bool()>) override {
    return false;
  }
  void count_dropped(uint64_t) noexcept override {}
  std::vector<bool> contains(std::span<const TierRequest> requests) override {
    return std::vector<bool>(requests.size(), false);
  }
  void fetch_each(std::span<const TierRequest>,
                  const std::function<void(size_t, const TierValue&)>&) override {}
  void flush() override {}
  void close() override {}
  TierStats stats() const override {
    TierStats s;
    s.name = "view";
    s.errors = 3;
    return s;
  }
  void add_store_view(HiddenStateStats& stats, uint64_t promotions) const override {
    stats.remote.enabled = true;
    stats.remote.servers = 7;
    stats.remote.read_through_chunks = promotions + 100;
  }
};

TEST(TierViews, TheStoresStatsShowWhatATierFillsItselfBesideItsRow) {
  detail::set_extra_tiers_for_testing([](const Config&) {
    std::vector<std::unique_ptr<BackingTier>> tiers;
    tiers.push_back(std::make_unique<ViewTier>());
    return tiers;
  });
  ChunkedTokenDatabase db(16, false);
  HiddenStateStore store(test::store_config(16, 32, 8), db);
  detail::set_extra_tiers_for_testing({});
  const HiddenStateStats s = store.stats();
  ASSERT_EQ(s.tiers.size(), 1U);
  EXPECT_EQ(s.tiers[0].name, "view");
  EXPECT_EQ(s.tiers[0].errors, 3U);
  EXPECT_TRUE(s.remote.enabled);
  EXPECT_EQ(s.remote.servers, 7U);
  EXPECT_EQ(s.remote.read_through_chunks, 100U);  // no promotion yet
}

TEST(TierViews, WithoutATierThatFillsItTheRemoteViewIsAllZero) {
  ChunkedTokenDatabase db(16, false);
  HiddenStateStore store(test::store_config(16, 32, 8), db);
  const HiddenStateStats s = store.stats();
  EXPECT_TRUE(s.tiers.empty());
  EXPECT_FALSE(s.remote.enabled);
  EXPECT_EQ(s.remote.servers, 0U);
}

TEST(TierViews, TheOlderCoverageScopeNameIsTheAllTiersScope) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_EQ(CoverageScope::kLocalAndRemote, CoverageScope::kAllTiers);
#pragma GCC diagnostic pop
  EXPECT_NE(CoverageScope::kLocal, CoverageScope::kAllTiers);
}

}  // namespace
}  // namespace hss
