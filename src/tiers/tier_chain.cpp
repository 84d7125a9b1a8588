#include "tiers/tier_chain.hpp"

#include <new>
#include <utility>

#include "index/entry_bytes.hpp"

namespace hss::detail {

namespace {

// A queued write's hold on an entry: keeps its granules and counts them against the pin budget.
struct EntryPin {
  EntryPin(EntryRef e, std::atomic<uint64_t>& counter, uint64_t n)
      : entry(std::move(e)), pinned(counter), bytes(n) {}
  ~EntryPin() { pinned.fetch_sub(bytes, std::memory_order_relaxed); }
  EntryPin(const EntryPin&) = delete;
  EntryPin& operator=(const EntryPin&) = delete;

  EntryRef entry;
  std::atomic<uint64_t>& pinned;
  uint64_t bytes;
};

}  // namespace

TierChain::TierChain(std::vector<std::unique_ptr<BackingTier>> tiers, uint64_t pin_budget_bytes)
    : pin_budget_(pin_budget_bytes),
      tiers_(std::move(tiers)),
      promotions_(std::make_unique<std::atomic<uint64_t>[]>(tiers_.size())) {}

TierChain::~TierChain() {
  for (auto& tier : tiers_) {
    try {
      tier->close();
    } catch (...) {  // a destructor must not throw; the tier's own destructor finishes the queue
    }
  }
}

void TierChain::write_behind(const CacheEngineKey& key, const EntryRef& entry,
                             const BlockPool& pool) noexcept {
  if (tiers_.empty()) return;
  TierWrite write;
  try {
    write = TierWrite{key, entry->slot, entry->format, entry->rows, entry->cols};
  } catch (const std::bad_alloc&) {  // the key's copy
    for (auto& tier : tiers_) tier->count_dropped(1);
    return;
  }
  for (auto& tier : tiers_) write_to(*tier, write, entry, pool);
}

void TierChain::write_to(BackingTier& tier, const TierWrite& write, const EntryRef& entry,
                         const BlockPool& pool) noexcept {
  const uint64_t bytes = entry->payload_bytes();
  bool pin = false, owned = false;
  try {
    uint64_t pinned = pinned_bytes_.load(std::memory_order_relaxed);
    while (pinned + bytes <= pin_budget_) {
      if (pinned_bytes_.compare_exchange_weak(pinned, pinned + bytes,
                                              std::memory_order_relaxed)) {
        pin = true;
        break;
      }
    }
    if (pin) {
      auto owner = std::make_shared<EntryPin>(entry, pinned_bytes_, bytes);
      owned = true;  // the pin's bytes go back with the owner, whatever happens below
      std::function<bool()> ready;
      if (entry->fence) ready = [fence = entry->fence] { return fence->wait(); };
      (void)tier.enqueue_write(write, entry_pieces(*entry, pool), std::move(owner),
                               std::move(ready));
    } else if (!entry->fence || (entry->fence->ready() && entry->fence->landed())) {
      (void)tier.enqueue_write(write, entry_pieces(*entry, pool));  // copied now
    } else {
      tier.count_dropped(1);
    }
  } catch (const std::bad_alloc&) {
    // Best effort, as a full queue is: the entry is stored locally; the write is dropped and
    // counted, never an exception out of a store that already published its rows.
    if (pin && !owned) pinned_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    tier.count_dropped(1);
  }
}

size_t TierChain::fetch_each(std::span<const TierRequest> requests,
                             const std::function<bool(size_t, const TierValue&)>& promote) {
  if (tiers_.empty() || requests.empty()) return 0;
  std::vector<TierRequest> rest(requests.begin(), requests.end());
  std::vector<size_t> index_of(requests.size());  // rest[j] is requests[index_of[j]]
  for (size_t i = 0; i < index_of.size(); ++i) index_of[i] = i;
  size_t promoted = 0;
  for (size_t t = 0; t < tiers_.size() && !rest.empty(); ++t) {
    std::vector<bool> answered(rest.size(), false);
    uint64_t mine = 0;
    tiers_[t]->fetch_each(rest, [&](size_t j, const TierValue& value) {
      answered[j] = true;
      if (promote(index_of[j], value)) ++mine;
    });
    promotions_[t].fetch_add(mine, std::memory_order_relaxed);
    promoted += mine;
    // What this tier did not have goes to the next one.
    size_t kept = 0;
    for (size_t j = 0; j < rest.size(); ++j) {
      if (answered[j]) continue;
      if (kept != j) {
        rest[kept] = std::move(rest[j]);
        index_of[kept] = index_of[j];
      }
      ++kept;
    }
    rest.resize(kept);
    index_of.resize(kept);
  }
  return promoted;
}

std::vector<bool> TierChain::contains(std::span<const TierRequest> requests) {
  const std::vector<int32_t> where = locate(requests);
  std::vector<bool> present(where.size(), false);
  for (size_t i = 0; i < where.size(); ++i) present[i] = where[i] != kNotHeld;
  return present;
}

std::vector<int32_t> TierChain::locate(std::span<const TierRequest> requests) {
  std::vector<int32_t> where(requests.size(), kNotHeld);
  if (tiers_.empty() || requests.empty()) return where;
  std::vector<TierRequest> ask(requests.begin(), requests.end());
  std::vector<size_t> index_of(requests.size());
  for (size_t i = 0; i < index_of.size(); ++i) index_of[i] = i;
  for (size_t t = 0; t < tiers_.size() && !ask.empty(); ++t) {
    const std::vector<bool> here = tiers_[t]->contains(ask);
    size_t kept = 0;
    for (size_t j = 0; j < ask.size(); ++j) {
      if (j < here.size() && here[j]) {
        where[index_of[j]] = static_cast<int32_t>(t);
        continue;
      }
      if (kept != j) {
        ask[kept] = std::move(ask[j]);
        index_of[kept] = index_of[j];
      }
      ++kept;
    }
    ask.resize(kept);
    index_of.resize(kept);
  }
  return where;
}

void TierChain::discard(std::span<const CacheEngineKey> keys) noexcept {
  if (keys.empty()) return;
  for (auto& tier : tiers_) tier->discard(keys);
}

void TierChain::flush() {
  for (auto& tier : tiers_) tier->flush();
}

void TierChain::close() {
  for (auto& tier : tiers_) tier->close();
}

std::vector<TierStats> TierChain::stats() const {
  std::vector<TierStats> out;
  out.reserve(tiers_.size());
  for (size_t t = 0; t < tiers_.size(); ++t) {
    out.push_back(tiers_[t]->stats());
    out.back().promotions = promotions_[t].load(std::memory_order_relaxed);
  }
  return out;
}

}  // namespace hss::detail
