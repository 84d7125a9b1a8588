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

std::vector<std::unique_ptr<BackingTier>> make_backing_tiers(const Config& config) {
  std::vector<std::unique_ptr<BackingTier>> tiers;
  // The order a retrieve asks them: the nearest (cheapest) tier first.
  if (auto disk = DiskTier::create(config)) tiers.push_back(std::move(disk));
  if (auto remote = RemoteTier::create(config)) tiers.push_back(std::move(remote));
  if (extra_tiers()) {
    for (auto& tier : extra_tiers()(config)) tiers.push_back(std::move(tier));
  }
  return tiers;
}

RemoteStats remote_stats_of(const TierChain& chain) {
  for (size_t t = 0; t < chain.size(); ++t) {
    if (const auto* remote = dynamic_cast<const RemoteTier*>(&chain.tier(t))) {
      RemoteStats s = remote->remote_stats();
      s.read_through_chunks = chain.promotions(t);
      return s;
    }
  }
  return {};
}

}  // namespace hss::detail
