// The tier seam (tiers/backing_tier.hpp, tiers/tier_chain.hpp) through the store's pipelines,
// with a tier that is not Redis: an in-memory BackingTier whose shelf two stores may share (as
// two processes share a server). What a disk tier will rely on: every store written behind to
// every tier, the entry's granules lent within the pin budget, read-through asking the tiers in
// order, coverage counting any tier, KV-gone values never read and discarded, a tier's wrong
// value a miss and never an exception.

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "hss/error.hpp"
#include "hss/hss.hpp"
#include "store/backing_tiers.hpp"
#include "test_util.hpp"
#include "tiers/tier_chain.hpp"

namespace hss {
namespace {

using detail::BackingTier;
using detail::TierRequest;
using detail::TierValue;
using detail::TierWrite;
using test::make_rows;
using test::make_tokens;
using test::view_of;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;
constexpr int64_t kChunkBytes = kChunk * kCols * 4;  // one float32 chunk

using ValueKey = std::tuple<uint64_t, ActivationKind, int64_t>;  // chunk hash, kind, layer
ValueKey value_key(const CacheEngineKey& key, Slot slot) {
  return {key.chunk_hash, slot.kind, slot.layer_idx};
}

struct StoredValue {
  detail::RowFormat format;
  int64_t rows = 0, cols = 0;
  std::vector<std::byte> bytes;
};

// What a tier holds, shareable between the tiers of two stores (a server, a directory).
struct Shelf {
  std::mutex mutex;
  std::map<ValueKey, StoredValue> values;
  [[nodiscard]] size_t size() {
    std::lock_guard lock(mutex);
    return values.size();
  }
};

// A BackingTier in memory. Writes wait in a queue (their owner held: the entry stays lent) until
// flush(); `corrupt` makes every fetched value one row short.
class MemoryTier final : public BackingTier {
 public:
  MemoryTier(std::string name, std::shared_ptr<Shelf> shelf, bool takes_writes)
      : name_(std::move(name)), shelf_(std::move(shelf)), takes_writes_(takes_writes) {}

  std::string_view name() const noexcept override { return name_; }

  bool enqueue_write(const TierWrite& write, std::span<const std::span<const std::byte>> pieces,
                     std::shared_ptr<const void> owner, std::function<bool()> ready) override {
    size_t given = 0;
    for (const auto piece : pieces) given += piece.size();
    if (given != write.format.payload_bytes(write.rows, write.cols)) {
      throw InvalidArgument("pieces of " + std::to_string(given) + " bytes");
    }
    std::lock_guard lock(mutex_);
    if (!takes_writes_ || closed_) {
      ++dropped_;
      return false;
    }
    Pending p{write, {}, std::move(owner), std::move(ready), {}};
    if (p.owner) {
      p.pieces.assign(pieces.begin(), pieces.end());
      ++borrowed_;
    } else {  // copied now: the caller's bytes may go as soon as this returns
      p.copy.resize(given);
      size_t at = 0;
      for (const auto piece : pieces) {
        std::memcpy(p.copy.data() + at, piece.data(), piece.size());
        at += piece.size();
      }
      ++copied_;
    }
    queue_.push_back(std::move(p));
    ++enqueued_;
    return true;
  }
  void count_dropped(uint64_t writes) noexcept override {
    std::lock_guard lock(mutex_);
    dropped_ += writes;
  }
  std::vector<bool> contains(std::span<const TierRequest> requests) override {
    std::vector<bool> out;
    std::lock_guard lock(shelf_->mutex);
    for (const TierRequest& r : requests) {
      out.push_back(shelf_->values.count(value_key(r.key, r.slot)) != 0);
    }
    contains_asked_ += requests.size();
    return out;
  }
  void fetch_each(std::span<const TierRequest> requests,
                  const std::function<void(size_t, const TierValue&)>& on_value) override {
    fetch_asked_ += requests.size();
    for (size_t i = 0; i < requests.size(); ++i) {
      fetch_cols.push_back(requests[i].cols);
      std::lock_guard lock(shelf_->mutex);
      const auto it = shelf_->values.find(value_key(requests[i].key, requests[i].slot));
      if (it == shelf_->values.end()) {
        ++misses_;
        continue;
      }
      ++hits_;
      const StoredValue& v = it->second;
      on_value(i, TierValue{v.format, corrupt ? v.rows - 1 : v.rows, v.cols, v.bytes, nullptr});
    }
  }
  void discard(std::span<const CacheEngineKey> keys) noexcept override {
    std::lock_guard lock(shelf_->mutex);
    for (const CacheEngineKey& key : keys) {
      discarded.push_back(key.chunk_hash);
      std::erase_if(shelf_->values,
                    [&](const auto& kv) { return std::get<0>(kv.first) == key.chunk_hash; });
    }
  }
  void flush() override {
    std::vector<Pending> queue;
    {
      std::lock_guard lock(mutex_);
      queue.swap(queue_);
    }
    for (Pending& p : queue) {
      if (p.ready && !p.ready()) {
        std::lock_guard lock(mutex_);
        ++dropped_;
        continue;
      }
      StoredValue v{p.write.format, p.write.rows, p.write.cols, std::move(p.copy)};
      if (v.bytes.empty()) {
        for (const auto piece : p.pieces) v.bytes.insert(v.bytes.end(), piece.begin(), piece.end());
      }
      const size_t bytes = v.bytes.size();
      {
        std::lock_guard lock(shelf_->mutex);
        shelf_->values[value_key(p.write.key, p.write.slot)] = std::move(v);
      }
      std::lock_guard lock(mutex_);
      ++done_;
      bytes_written_ += bytes;
    }  // owners released here: the entries stop being lent
  }
  void close() override {
    flush();
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  TierStats stats() const override {
    std::lock_guard lock(mutex_);
    TierStats s;
    s.name = name_;
    s.hits = hits_;
    s.misses = misses_;
    s.writes_enqueued = enqueued_;
    s.writes_done = done_;
    s.bytes_written = bytes_written_;
    s.dropped_writes = dropped_;
    s.entries_held = shelf_->size();
    return s;
  }

  [[nodiscard]] size_t queued() const {
    std::lock_guard lock(mutex_);
    return queue_.size();
  }

  bool corrupt = false;
  uint64_t fetch_asked_ = 0, contains_asked_ = 0, hits_ = 0, misses_ = 0;
  uint64_t borrowed_ = 0, copied_ = 0;
  std::vector<uint64_t> discarded;
  std::vector<int64_t> fetch_cols;  ///< the width each fetched request asked for (0: any)

 private:
  struct Pending {
    TierWrite write;
    std::vector<std::span<const std::byte>> pieces;
    std::shared_ptr<const void> owner;
    std::function<bool()> ready;
    std::vector<std::byte> copy;
  };
  const std::string name_;
  std::shared_ptr<Shelf> shelf_;
  const bool takes_writes_;
  mutable std::mutex mutex_;
  std::vector<Pending> queue_;
  bool closed_ = false;
  uint64_t enqueued_ = 0, done_ = 0, dropped_ = 0, bytes_written_ = 0;
};

// Every store built while it lives gets two MemoryTiers over `near` and `far` (in that order);
// `made` collects them, two per store, in construction order.
class TwoTiers {
 public:
  TwoTiers(bool near_takes_writes, bool far_takes_writes) {
    detail::set_extra_tiers_for_testing([this, near_takes_writes, far_takes_writes](const Config&) {
      std::vector<std::unique_ptr<BackingTier>> tiers;
      auto a = std::make_unique<MemoryTier>("near", near, near_takes_writes);
      auto b = std::make_unique<MemoryTier>("far", far, far_takes_writes);
      made.push_back(a.get());
      made.push_back(b.get());
      tiers.push_back(std::move(a));
      tiers.push_back(std::move(b));
      return tiers;
    });
  }
  ~TwoTiers() { detail::set_extra_tiers_for_testing({}); }
  TwoTiers(const TwoTiers&) = delete;
  TwoTiers& operator=(const TwoTiers&) = delete;

  std::shared_ptr<Shelf> near = std::make_shared<Shelf>();
  std::shared_ptr<Shelf> far = std::make_shared<Shelf>();
  std::vector<MemoryTier*> made;
};

void expect_rows(const std::optional<HostTensor>& got, const std::vector<int32_t>& tokens,
                 int64_t rows) {
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->rows(), rows);
  const auto expected = make_rows(tokens, 0, 0, kCols);
  ASSERT_EQ(std::memcmp(got->data(), expected.data(), got->bytes()), 0);
}

TEST(TierChain, EveryStoreIsWrittenBehindToEveryTierBitExact) {
  TwoTiers tiers(true, true);
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(test::store_config(kChunk, kCols, 64), db);
  const auto tokens = make_tokens(4 * kChunk, 7);
  for (const int64_t layer : {0, 3}) {
    const auto rows = make_rows(tokens, 0, layer, kCols);
    ASSERT_EQ(store.store_hidden_states(tokens, view_of(rows, kCols), {layer, 0}).written, 4);
  }
  ASSERT_EQ(tiers.made.size(), 2U);
  EXPECT_EQ(tiers.made[0]->queued(), 8U);  // write-behind: nothing written on the store's thread
  EXPECT_EQ(tiers.near->size(), 0U);
  store.flush();
  ASSERT_EQ(tiers.near->size(), 8U);
  ASSERT_EQ(tiers.far->size(), 8U);
  const auto chunks = db.process_tokens(std::span<const int32_t>(tokens));
  for (const int64_t layer : {0, 3}) {
    const auto rows = make_rows(tokens, 0, layer, kCols);
    for (size_t c = 0; c < chunks.size(); ++c) {
      for (Shelf* shelf : {tiers.near.get(), tiers.far.get()}) {
        const StoredValue& v =
            shelf->values.at(value_key(chunks[c].key, Slot{ActivationKind::kHidden, layer}));
        ASSERT_EQ(v.rows, kChunk);
        ASSERT_EQ(v.cols, kCols);
        ASSERT_EQ(v.bytes.size(), static_cast<size_t>(kChunkBytes));
        EXPECT_EQ(std::memcmp(v.bytes.data(), rows.data() + c * kChunk * kCols, v.bytes.size()), 0)
            << "chunk " << c << " layer " << layer;
      }
    }
  }
  const TierStats near = tiers.made[0]->stats();
  EXPECT_EQ(near.writes_enqueued, 8U);
  EXPECT_EQ(near.writes_done, 8U);
  EXPECT_EQ(near.bytes_written, static_cast<uint64_t>(8 * kChunkBytes));
  EXPECT_FALSE(store.stats().remote.enabled);  // the Redis tier's own stats stay its own
}

TEST(TierChain, WritesBorrowTheEntryWithinThePinBudgetAndCopyBeyondIt) {
  TwoTiers tiers(true, false);
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(test::store_config(kChunk, kCols, 16), db);
  // The pin budget is half the pool, shared by the tiers: 8 one-chunk entries lent, then copies.
  const uint64_t budget_chunks = store.stats().pool_capacity_bytes / 2 / kChunkBytes;
  ASSERT_EQ(budget_chunks, 8U);
  const auto tokens = make_tokens(12 * kChunk, 3);
  const auto rows = make_rows(tokens, 0, 0, kCols);
  ASSERT_EQ(store.store_hidden_states(tokens, view_of(rows, kCols)).written, 12);
  MemoryTier& near = *tiers.made[0];
  EXPECT_EQ(near.borrowed_, 8U);
  EXPECT_EQ(near.copied_, 4U);
  // The far tier takes no writes: it counted its drops and lent nothing.
  EXPECT_EQ(tiers.made[1]->stats().dropped_writes, 12U);
  store.flush();  // the tier finished: the lent granules come back and the budget with them
  const auto more = make_tokens(4 * kChunk, 4);
  const auto more_rows = make_rows(more, 0, 0, kCols);
  ASSERT_EQ(store.store_hidden_states(more, view_of(more_rows, kCols)).written, 4);
  EXPECT_EQ(near.borrowed_, 12U);
  store.flush();
  EXPECT_EQ(tiers.near->size(), 16U);
  store.check_invariants();
}

TEST(TierChain, ReadThroughAsksTheTiersInOrderAndPromotesFromTheFirstThatHolds) {
  TwoTiers tiers(/*near_takes_writes=*/false, /*far_takes_writes=*/true);
  ChunkedTokenDatabase db(kChunk, false);
  const auto tokens = make_tokens(4 * kChunk, 11);
  {
    HiddenStateStore writer(test::store_config(kChunk, kCols, 64), db);
    const auto rows = make_rows(tokens, 0, 0, kCols);
    ASSERT_EQ(writer.store_hidden_states(tokens, view_of(rows, kCols)).written, 4);
  }  // closed: the tiers finished their writes
  ASSERT_EQ(tiers.far->size(), 4U);
  ASSERT_EQ(tiers.near->size(), 0U);

  HiddenStateStore reader(test::store_config(kChunk, kCols, 64), db);
  MemoryTier& near = *tiers.made[2];
  MemoryTier& far = *tiers.made[3];
  const auto chunks = db.process_tokens(std::span<const int32_t>(tokens));
  const std::vector<int64_t> layer0 = {0};
  EXPECT_EQ(reader.coverage(chunks, layer0), 0);
  EXPECT_EQ(reader.coverage(chunks, layer0, CoverageScope::kAllTiers), 4 * kChunk);
  EXPECT_EQ(near.contains_asked_, 4U);
  EXPECT_EQ(far.contains_asked_, 4U);  // asked what the near tier did not hold

  expect_rows(reader.retrieve_hidden_states(tokens), tokens, 4 * kChunk);
  EXPECT_EQ(near.fetch_asked_, 4U);
  EXPECT_EQ(near.misses_, 4U);
  EXPECT_EQ(far.fetch_asked_, 4U);
  EXPECT_EQ(far.hits_, 4U);
  EXPECT_EQ(reader.num_entries(), 4U);  // promoted into the pool
  const HiddenStateStats stats = reader.stats();
  ASSERT_EQ(stats.tiers.size(), 2U);  // in the order a retrieve asks them, one shape each
  EXPECT_EQ(stats.tiers[0].name, "near");
  EXPECT_EQ(stats.tiers[0].misses, 4U);
  EXPECT_EQ(stats.tiers[0].promotions, 0U);
  EXPECT_EQ(stats.tiers[1].name, "far");
  EXPECT_EQ(stats.tiers[1].hits, 4U);
  EXPECT_EQ(stats.tiers[1].promotions, 4U);
  EXPECT_EQ(stats.tiers[1].entries_held, 4U);
  // Local now: no tier is asked again.
  expect_rows(reader.retrieve_hidden_states(tokens), tokens, 4 * kChunk);
  EXPECT_EQ(near.fetch_asked_ + far.fetch_asked_, 8U);
  reader.check_invariants();
}

TEST(TierChain, LocateNamesTheFirstTierHoldingEachValue) {
  // near holds chunk 1; far holds chunks 1 and 2; nobody holds chunk 3 (or chunk 2's layer 5).
  auto near_shelf = std::make_shared<Shelf>();
  auto far_shelf = std::make_shared<Shelf>();
  const auto key_of = [](uint64_t hash) {
    CacheEngineKey key;
    key.chunk_hash = hash;
    return key;
  };
  const Slot layer0{ActivationKind::kHidden, 0};
  const Slot layer5{ActivationKind::kHidden, 5};
  near_shelf->values[value_key(key_of(1), layer0)] = StoredValue{};
  far_shelf->values[value_key(key_of(1), layer0)] = StoredValue{};
  far_shelf->values[value_key(key_of(2), layer0)] = StoredValue{};
  std::vector<std::unique_ptr<BackingTier>> list;
  auto near_tier = std::make_unique<MemoryTier>("near", near_shelf, true);
  auto far_tier = std::make_unique<MemoryTier>("far", far_shelf, true);
  MemoryTier& near = *near_tier;
  MemoryTier& far = *far_tier;
  list.push_back(std::move(near_tier));
  list.push_back(std::move(far_tier));
  detail::TierChain chain(std::move(list), 0);
  const std::vector<TierRequest> asked = {{key_of(1), layer0, kChunk, kCols},
                                          {key_of(2), layer0, kChunk, kCols},
                                          {key_of(3), layer0, kChunk, kCols},
                                          {key_of(2), layer5, kChunk, kCols}};
  const auto kNone = detail::TierChain::kNotHeld;
  EXPECT_EQ(chain.locate(asked), (std::vector<int32_t>{0, 1, kNone, kNone}));
  EXPECT_EQ(near.contains_asked_, 4U);
  EXPECT_EQ(far.contains_asked_, 3U);  // not chunk 1: the near tier answered it
  EXPECT_EQ(chain.contains(asked), (std::vector<bool>{true, true, false, false}));
  EXPECT_TRUE(chain.locate({}).empty());
  detail::TierChain none({}, 0);
  EXPECT_EQ(none.locate(asked), (std::vector<int32_t>(4, kNone)));
}

TEST(TierChain, AValueTheNearTierHoldsIsNeverAskedOfTheFarOne) {
  TwoTiers tiers(true, true);
  ChunkedTokenDatabase db(kChunk, false);
  const auto tokens = make_tokens(3 * kChunk, 5);
  {
    HiddenStateStore writer(test::store_config(kChunk, kCols, 64), db);
    const auto rows = make_rows(tokens, 0, 0, kCols);
    ASSERT_EQ(writer.store_hidden_states(tokens, view_of(rows, kCols)).written, 3);
  }
  HiddenStateStore reader(test::store_config(kChunk, kCols, 64), db);
  expect_rows(reader.retrieve_hidden_states(tokens), tokens, 3 * kChunk);
  EXPECT_EQ(tiers.made[2]->hits_, 3U);
  EXPECT_EQ(tiers.made[3]->fetch_asked_, 0U);
}

TEST(TierChain, AChunkWhoseKvIsGoneIsNeverReadFromATierAndIsDiscarded) {
  TwoTiers tiers(false, true);
  ChunkedTokenDatabase db(kChunk, false);
  const auto tokens = make_tokens(4 * kChunk, 13);
  const auto chunks = db.process_tokens(std::span<const int32_t>(tokens));
  {
    HiddenStateStore writer(test::store_config(kChunk, kCols, 64), db);
    const auto rows = make_rows(tokens, 0, 0, kCols);
    ASSERT_EQ(writer.store_hidden_states(tokens, view_of(rows, kCols)).written, 4);
  }
  HiddenStateStore reader(test::store_config(kChunk, kCols, 64), db);
  test::ControlledKv kv;
  kv.evict(chunks[2].key);
  reader.bind_storage_manager(&kv);
  expect_rows(reader.retrieve_hidden_states(tokens), tokens, 2 * kChunk);
  MemoryTier& far = *tiers.made[3];
  EXPECT_EQ(far.fetch_asked_, 2U);  // chunks 0 and 1: the tiers are asked nothing past KV's end
  ASSERT_EQ(far.discarded.size(), 1U);
  EXPECT_EQ(far.discarded[0], chunks[2].key.chunk_hash);
  EXPECT_EQ(tiers.made[2]->discarded, far.discarded);  // every tier is told
  EXPECT_EQ(tiers.far->size(), 3U);  // this tier dropped the orphan's value
}

TEST(TierChain, ARetrieveThatReadsThroughAsksKvOncePerChunk) {
  TwoTiers tiers(false, true);
  ChunkedTokenDatabase db(kChunk, false);
  const auto tokens = make_tokens(4 * kChunk, 19);
  {
    HiddenStateStore writer(test::store_config(kChunk, kCols, 64), db);
    const auto rows = make_rows(tokens, 0, 0, kCols);
    ASSERT_EQ(writer.store_hidden_states(tokens, view_of(rows, kCols)).written, 4);
  }
  HiddenStateStore reader(test::store_config(kChunk, kCols, 64), db);
  test::ControlledKv kv;
  reader.bind_storage_manager(&kv);
  // The read-through (which chunks may extend the prefix) and the walk share one answer each.
  expect_rows(reader.retrieve_hidden_states(tokens), tokens, 4 * kChunk);
  EXPECT_EQ(kv.calls.load(), 4);
  HostTensor out(4 * kChunk, kCols);
  EXPECT_EQ(reader.retrieve_hidden_states_into(tokens, out.mutable_view()), 4 * kChunk);
  EXPECT_EQ(kv.calls.load(), 8);  // all local now: the walk alone asks
}

TEST(TierChain, AValueOfTheWrongShapeFromATierIsAMissNeverAnError) {
  TwoTiers tiers(false, true);
  ChunkedTokenDatabase db(kChunk, false);
  const auto tokens = make_tokens(2 * kChunk, 17);
  {
    HiddenStateStore writer(test::store_config(kChunk, kCols, 64), db);
    const auto rows = make_rows(tokens, 0, 0, kCols);
    ASSERT_EQ(writer.store_hidden_states(tokens, view_of(rows, kCols)).written, 2);
  }
  HiddenStateStore reader(test::store_config(kChunk, kCols, 64), db);
  tiers.made[3]->corrupt = true;  // one row short: its payload no longer matches its rows
  EXPECT_FALSE(reader.retrieve_hidden_states(tokens).has_value());
  EXPECT_EQ(reader.num_entries(), 0U);
  EXPECT_EQ(reader.stats().miss_tokens, static_cast<uint64_t>(2 * kChunk));
  reader.check_invariants();
}

// A disk tier bounds what it reads by the asked shape (0 cols: up to 16 GiB): the read-through
// asks for the width of the caller's output, or of an entry of the slot the prefix holds.
TEST(TierChain, ReadThroughAsksTheTiersForTheOutputsWidth) {
  TwoTiers tiers(false, true);
  ChunkedTokenDatabase db(kChunk, false);
  const auto tokens = make_tokens(4 * kChunk, 23);
  const auto rows = make_rows(tokens, 0, 0, kCols);
  {
    HiddenStateStore writer(test::store_config(kChunk, kCols, 64), db);
    ASSERT_EQ(writer.store_hidden_states(tokens, view_of(rows, kCols)).written, 4);
  }
  {
    HiddenStateStore reader(test::store_config(kChunk, kCols, 64), db);
    HostTensor out(4 * kChunk, kCols);
    EXPECT_EQ(reader.retrieve_hidden_states_into(tokens, out.mutable_view()), 4 * kChunk);
    EXPECT_EQ(tiers.made[3]->fetch_cols, std::vector<int64_t>(4, kCols));
  }
  // An allocating retrieve has no output yet: the width of the entry its prefix holds.
  HiddenStateStore reader(test::store_config(kChunk, kCols, 64), db);
  const std::vector<int32_t> first(tokens.begin(), tokens.begin() + kChunk);
  const auto first_rows = make_rows(first, 0, 0, kCols);
  ASSERT_EQ(reader.store_hidden_states(first, view_of(first_rows, kCols)).written, 1);
  MemoryTier& far = *tiers.made[5];
  expect_rows(reader.retrieve_hidden_states(tokens), tokens, 4 * kChunk);
  EXPECT_EQ(far.fetch_cols, std::vector<int64_t>(3, kCols));
  reader.check_invariants();
}

}  // namespace
}  // namespace hss
