#include "store/backing_tiers.hpp"

#include "tiers/disk/disk_tier.hpp"
#include "tiers/remote/remote_tier.hpp"

namespace hss::detail {

namespace {
ExtraTiersForTesting& extra_tiers() {
  static ExtraTiersForTesting make;
  return make;
}
}  // namespace

void set_extra_tiers_for_testing(ExtraTiersForTesting make) { extra_tiers() = std::move(make); }

namespace {

/// Builds a tier from the config, or nullptr when the config names none of it.
using TierMaker = std::unique_ptr<BackingTier> (*)(const Config& config);

template <class Tier>
std::unique_ptr<BackingTier> make(const Config& config) {
  return Tier::create(config);
}

/// Every tier this build knows, in the order a retrieve asks them: the nearest (cheapest) first.
/// A new tier is one row here (and its folder: tiers/backing_tier.hpp).
constexpr TierMaker kTierMakers[] = {
    &make<DiskTier>,
    &make<RemoteTier>,
};

}  // namespace

std::vector<std::unique_ptr<BackingTier>> make_backing_tiers(const Config& config) {
  std::vector<std::unique_ptr<BackingTier>> tiers;
  for (const TierMaker make_tier : kTierMakers) {
    if (auto tier = make_tier(config)) tiers.push_back(std::move(tier));
  }
  if (extra_tiers()) {
    for (auto& tier : extra_tiers()(config)) tiers.push_back(std::move(tier));
  }
  return tiers;
}

void add_tier_views(const TierChain& chain, HiddenStateStats& stats) {
  for (size_t t = 0; t < chain.size(); ++t) chain.tier(t).add_store_view(stats, chain.promotions(t));
}

}  // namespace hss::detail
