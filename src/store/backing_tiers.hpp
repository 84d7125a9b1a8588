#pragma once
// The one place a config becomes the store's backing tiers, and the one place that knows which
// concrete tiers exist (tiers/backing_tier.hpp says what a new tier adds and touches).

#include <functional>
#include <memory>
#include <vector>

#include "hss/config.hpp"
#include "hss/hidden_state_store.hpp"
#include "tiers/backing_tier.hpp"
#include "tiers/tier_chain.hpp"

namespace hss::detail {

/// The configured tiers in the order a retrieve asks them: the local disk tier when local_disk
/// or hidden_state_disk_path is set, then the Redis/Valkey tier when hidden_state_remote_url
/// is. ConfigError when a configured tier cannot be built (no hiredis in this build, a MAC key
/// without OpenSSL); nothing is left running then.
[[nodiscard]] std::vector<std::unique_ptr<BackingTier>> make_backing_tiers(const Config& config);

/// Tests of the seam: tiers appended after the configured ones to every store constructed
/// while it is set (an empty function: none). Not thread-safe against store construction; set
/// it before and clear it after (tests/tiers/test_tier_chain.cpp).
using ExtraTiersForTesting =
    std::function<std::vector<std::unique_ptr<BackingTier>>(const Config& config)>;
void set_extra_tiers_for_testing(ExtraTiersForTesting make);

/// What each tier shows in HiddenStateStats besides HiddenStateStats::tiers, filled by the tier
/// (BackingTier::add_store_view: HiddenStateStats::remote from the Redis tier, all zero without
/// one).
void add_tier_views(const TierChain& chain, HiddenStateStats& stats);

}  // namespace hss::detail
