// The entry state machine of src/index/store_index.hpp (EntryState): every transition is a StoreIndex
// method, PENDING entries are invisible and never eviction victims, only PENDING publishes, and
// DETACHED is final. The store paths (write, batch, remote read-through, pool-transfer import)
// all reach the index through these methods; tests/store/test_store_semantics.cpp and the differential
// suites check them end to end.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "pool/block_pool.hpp"
#include "hss/hss.hpp"
#include "index/store_index.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

using detail::EntryState;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 8;

class EntryStates : public ::testing::Test {
 protected:
  EntryStates()
      : pool_(uint64_t{1} << 20, 4096, /*try_pinned=*/false, /*prefault=*/false),
        chunks_(
            ChunkedTokenDatabase(kChunk, false).process_tokens(test::make_tokens(3 * kChunk, 5))) {}

  /// A fresh entry of (chunk rows x kCols) float32 with its one granule granted.
  detail::EntryRef make(int64_t layer) {
    auto e = std::make_shared<detail::Entry>(pool_, kChunk, kCols, detail::RowFormat{kernels::ElemType::kFloat32},
                                             Slot{ActivationKind::kHidden, layer});
    e->blocks.resize(pool_.blocks_for(e->payload_bytes()));
    EXPECT_TRUE(pool_.allocate(e->blocks));
    return e;
  }
  /// add_pending for a key that may be new.
  detail::KeyRecord& add(size_t chunk, const detail::EntryRef& e, uint64_t guard) {
    const CacheEngineKey& key = chunks_[chunk].key;
    detail::KeyRecord* record = index_.find(key);
    if (record == nullptr) {
      record = &index_.insert_empty(key, 2);
    } else {
      record->slots.reserve(record->slots.size() + 1);
    }
    index_.add_pending(*record, e, guard);
    return *record;
  }
  const CacheEngineKey& key(size_t chunk) const { return chunks_[chunk].key; }

  detail::BlockPool pool_;
  detail::StoreIndex index_;
  std::vector<Chunk> chunks_;
};

TEST_F(EntryStates, PendingIsInvisibleUncountedAndNeverEvicted) {
  const auto a = make(0);
  detail::KeyRecord& record = add(0, a, 7);
  EXPECT_EQ(a->state, EntryState::kPending);
  EXPECT_FALSE(a->ready());
  EXPECT_EQ(record.guard, 7u);
  EXPECT_EQ(index_.keys(), 1u);
  EXPECT_EQ(index_.ready_keys(), 0u);
  EXPECT_EQ(index_.ready_entries(), 0u);
  EXPECT_EQ(index_.bytes_held(), 0u);
  EXPECT_TRUE(record.busy());
  EXPECT_EQ(index_.eviction_candidate(0, false), nullptr);

  EXPECT_TRUE(index_.publish(key(0), *a));
  EXPECT_EQ(a->state, EntryState::kReady);
  EXPECT_EQ(index_.ready_keys(), 1u);
  EXPECT_EQ(index_.ready_entries(), 1u);
  EXPECT_EQ(index_.bytes_held(), static_cast<uint64_t>(kChunk * kCols * 4));
  EXPECT_EQ(index_.blocks_held(), 1u);
  EXPECT_EQ(index_.kind_totals(ActivationKind::kHidden).entries, 1u);
  // Only PENDING publishes: a second publish changes nothing.
  EXPECT_FALSE(index_.publish(key(0), *a));
  EXPECT_EQ(index_.ready_entries(), 1u);
  ASSERT_NE(index_.eviction_candidate(0, false), nullptr);
  EXPECT_EQ(*index_.eviction_candidate(0, false), key(0));
  // A guarded key is skipped by its own call's evictions.
  EXPECT_EQ(index_.eviction_candidate(7, false), nullptr);
}

TEST_F(EntryStates, AnEraseDetachesForGoodAndAPendingEntryThenNeverPublishes) {
  const auto ready = make(0), pending = make(1);
  add(0, ready, 1);
  ASSERT_TRUE(index_.publish(key(0), *ready));
  add(0, pending, 2);
  EXPECT_EQ(index_.erase(key(0)), 1u);  // READY entries removed
  EXPECT_EQ(ready->state, EntryState::kDetached);
  EXPECT_EQ(pending->state, EntryState::kDetached);
  EXPECT_FALSE(index_.publish(key(0), *pending));
  EXPECT_EQ(pending->state, EntryState::kDetached);
  EXPECT_EQ(index_.keys(), 0u);
  EXPECT_EQ(index_.ready_entries(), 0u);
  EXPECT_EQ(index_.bytes_held(), 0u);
  EXPECT_EQ(index_.blocks_held(), 0u);
}

TEST_F(EntryStates, WithdrawAndEraseSlotDetachOneSlotAndDropTheLastKey) {
  const auto a = make(0), b = make(1);
  add(1, a, 1);
  add(1, b, 1);
  ASSERT_TRUE(index_.publish(key(1), *a));
  index_.withdraw(key(1), *b);  // PENDING -> DETACHED (a failed copy, a rejected import)
  EXPECT_EQ(b->state, EntryState::kDetached);
  EXPECT_EQ(a->state, EntryState::kReady);
  EXPECT_EQ(index_.keys(), 1u);
  EXPECT_EQ(index_.ready_entries(), 1u);
  // Withdrawing what is not the key's any more changes nothing.
  index_.withdraw(key(1), *b);
  EXPECT_EQ(index_.ready_entries(), 1u);
  index_.erase_slot(key(1), a.get());  // READY -> DETACHED (a replacement)
  EXPECT_EQ(a->state, EntryState::kDetached);
  EXPECT_EQ(index_.keys(), 0u);
  EXPECT_EQ(index_.ready_keys(), 0u);
  EXPECT_EQ(index_.bytes_held(), 0u);
}

TEST_F(EntryStates, ClearDetachesEveryEntryAndGranulesReturnWithTheLastReference) {
  const uint64_t free_before = pool_.free_blocks();
  {
    const auto a = make(0), b = make(0);
    add(0, a, 1);
    add(2, b, 1);
    ASSERT_TRUE(index_.publish(key(2), *b));
    EXPECT_EQ(pool_.free_blocks(), free_before - 2);
    index_.clear();
    EXPECT_EQ(a->state, EntryState::kDetached);
    EXPECT_EQ(b->state, EntryState::kDetached);
    EXPECT_EQ(index_.ready_entries(), 0u);
    // Still pinned here (a reader's reference): the granules are held.
    EXPECT_EQ(pool_.free_blocks(), free_before - 2);
  }
  EXPECT_EQ(pool_.free_blocks(), free_before);
}

TEST_F(EntryStates, TheLruIsOrderedByLastTouchAndSurvivesErasesAnywhere) {
  // The intrusive LRU (links in each KeyRecord): insertion order, touches move a key to the MRU
  // end, erasing the front, the middle or the back relinks its neighbours, clear empties it.
  const auto lru = [this] {
    std::vector<uint64_t> order;
    index_.for_each_lru([&](const CacheEngineKey& k, const detail::KeyRecord& r) {
      EXPECT_EQ(r.key, &k);
      order.push_back(k.chunk_hash);
    });
    EXPECT_EQ(order.size(), index_.lru_size());
    return order;
  };
  std::vector<detail::EntryRef> held;
  for (size_t c = 0; c < 3; ++c) {
    held.push_back(make(0));
    add(c, held.back(), 1);
    ASSERT_TRUE(index_.publish(key(c), *held.back()));
  }
  const uint64_t h0 = key(0).chunk_hash, h1 = key(1).chunk_hash, h2 = key(2).chunk_hash;
  EXPECT_EQ(lru(), (std::vector<uint64_t>{h0, h1, h2}));
  EXPECT_EQ(*index_.eviction_candidate(0, false), key(0));
  index_.touch(*index_.find(key(0)));
  EXPECT_EQ(lru(), (std::vector<uint64_t>{h1, h2, h0}));
  index_.touch(*index_.find(key(0)));  // already the MRU: no change
  EXPECT_EQ(lru(), (std::vector<uint64_t>{h1, h2, h0}));
  EXPECT_EQ(*index_.eviction_candidate(0, false), key(1));
  // A guarded key is skipped, the next one is the candidate.
  index_.find(key(1))->guard = 9;
  EXPECT_EQ(*index_.eviction_candidate(9, false), key(2));
  EXPECT_EQ(index_.erase(key(2)), 1u);  // the middle
  EXPECT_EQ(lru(), (std::vector<uint64_t>{h1, h0}));
  EXPECT_EQ(index_.erase(key(0)), 1u);  // the back
  EXPECT_EQ(lru(), (std::vector<uint64_t>{h1}));
  held.push_back(make(1));
  add(2, held.back(), 1);
  EXPECT_EQ(lru(), (std::vector<uint64_t>{h1, h2}));
  EXPECT_EQ(index_.erase(key(1)), 1u);  // the front
  EXPECT_EQ(lru(), (std::vector<uint64_t>{h2}));
  index_.clear();
  EXPECT_TRUE(lru().empty());
  EXPECT_EQ(index_.eviction_candidate(0, false), nullptr);
}

TEST_F(EntryStates, AnEmptyRecordIsOutsideTheLruUntilFilledAndGoesWhenErasedEmpty) {
  // insert_empty: a new key's record in the map with no slot and outside the LRU, so no
  // eviction picks it and the LRU's length leaves it out; add_pending links it at the MRU end.
  const auto a = make(0);
  add(0, a, 1);
  ASSERT_TRUE(index_.publish(key(0), *a));
  detail::KeyRecord& fresh = index_.insert_empty(key(1), 2);
  EXPECT_EQ(index_.find(key(1)), &fresh);
  EXPECT_EQ(fresh.key, &*index_.find(key(1))->key);
  EXPECT_EQ(*fresh.key, key(1));
  EXPECT_EQ(fresh.slots.capacity(), 2u);
  EXPECT_EQ(index_.keys(), 2u);
  EXPECT_EQ(index_.lru_size(), 1u);
  EXPECT_EQ(index_.ready_keys(), 1u);
  // Only key 0 can be a victim, at any guard: the empty record is never one.
  ASSERT_NE(index_.eviction_candidate(0, false), nullptr);
  EXPECT_EQ(*index_.eviction_candidate(0, false), key(0));
  index_.find(key(0))->guard = 5;
  EXPECT_EQ(index_.eviction_candidate(5, false), nullptr);
  // erase_if_empty: gone again, counted as an erasure (lookups look again).
  const uint64_t erasures = index_.erasures();
  index_.erase_if_empty(fresh);
  EXPECT_EQ(index_.find(key(1)), nullptr);
  EXPECT_EQ(index_.erasures(), erasures + 1);
  EXPECT_EQ(index_.keys(), 1u);
  EXPECT_EQ(index_.lru_size(), 1u);
  // Filled instead: linked at the MRU end and guarded by its call.
  const auto b = make(0);
  detail::KeyRecord& filled = index_.insert_empty(key(2), 1);
  index_.add_pending(filled, b, 3);
  EXPECT_EQ(filled.guard, 3u);
  EXPECT_EQ(index_.lru_size(), 2u);
  ASSERT_TRUE(index_.publish(key(2), *b));
  index_.find(key(0))->guard = 0;
  index_.touch(*index_.find(key(0)));  // key 0 to the MRU end: key 2 is now the LRU front
  EXPECT_EQ(*index_.eviction_candidate(0, false), key(2));
  // A record with a slot is not erased by erase_if_empty.
  index_.erase_if_empty(filled);
  EXPECT_EQ(index_.find(key(2)), &filled);
  EXPECT_EQ(b->state, EntryState::kReady);
}

TEST_F(EntryStates, DetachSlotKeepsTheRecordForItsReplacementOrForEraseIfEmpty) {
  // A replacement (another shape) detaches the old entry and keeps the record, even with no
  // slot left, in its LRU place; the new entry joins it, or the record goes when the grant
  // fails (erase_if_empty), as erase_slot would have dropped it.
  const auto old_entry = make(0), other = make(1);
  add(0, old_entry, 1);
  ASSERT_TRUE(index_.publish(key(0), *old_entry));
  add(1, other, 1);
  ASSERT_TRUE(index_.publish(key(1), *other));
  detail::KeyRecord& record = *index_.find(key(0));
  const uint64_t erasures = index_.erasures();
  index_.detach_slot(record, old_entry.get());
  EXPECT_EQ(old_entry->state, EntryState::kDetached);
  EXPECT_TRUE(record.slots.empty());
  EXPECT_EQ(index_.find(key(0)), &record);
  EXPECT_EQ(index_.erasures(), erasures);  // no key removed: the lookups stay valid
  EXPECT_EQ(index_.ready_entries(), 1u);
  EXPECT_EQ(index_.ready_keys(), 1u);
  EXPECT_EQ(index_.bytes_held(), static_cast<uint64_t>(kChunk * kCols * 4));
  // Detaching what is not there changes nothing.
  index_.detach_slot(record, old_entry.get());
  EXPECT_EQ(index_.ready_entries(), 1u);
  const auto replacement = make(0);
  index_.add_pending(record, replacement, 2);
  ASSERT_TRUE(index_.publish(key(0), *replacement));
  EXPECT_EQ(index_.ready_entries(), 2u);
  EXPECT_EQ(index_.lru_size(), 2u);
  // Emptied and not refilled: erase_if_empty unlinks and erases it.
  index_.detach_slot(record, replacement.get());
  index_.erase_if_empty(record);
  EXPECT_EQ(index_.find(key(0)), nullptr);
  EXPECT_EQ(index_.erasures(), erasures + 1);
  EXPECT_EQ(index_.keys(), 1u);
  EXPECT_EQ(index_.lru_size(), 1u);
  EXPECT_EQ(*index_.eviction_candidate(0, false), key(1));
  EXPECT_EQ(index_.ready_entries(), 1u);
}

}  // namespace
}  // namespace hss
