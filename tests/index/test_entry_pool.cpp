// Pooled entries (src/index/entry_pool.hpp): every entry and its control block is one node of the
// pool's slabs; nodes come back from whichever thread drops the last reference and are reused
// before a new slab is made; an entry's granules still return to the BlockPool with it.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "base/address_sanitizer.hpp"
#ifdef HSS_ADDRESS_SANITIZER
#include <sanitizer/asan_interface.h>
#endif

#include "pool/block_pool.hpp"
#include "index/entry_pool.hpp"
#include "hss/hss.hpp"

namespace hss {
namespace {

constexpr int64_t kRows = 16;
constexpr int64_t kCols = 8;

class EntryPoolTest : public ::testing::Test {
 protected:
  EntryPoolTest() : pool_(uint64_t{1} << 20, 512, /*try_pinned=*/false, /*prefault=*/false) {}

  detail::EntryRef make(int64_t layer, bool grant = false) {
    auto e = entries_.make(pool_, kRows, kCols, detail::RowFormat{kernels::ElemType::kFloat32},
                           Slot{ActivationKind::kHidden, layer});
    if (grant) {
      e->blocks.resize(pool_.blocks_for(e->payload_bytes()));
      EXPECT_TRUE(pool_.allocate(e->blocks));
    }
    return e;
  }

  detail::EntryPool entries_;  // before pool_: outlives the entries, as in the store
  detail::BlockPool pool_;
};

TEST_F(EntryPoolTest, EveryEntryIsANodeAndNodesAreReusedBeforeANewSlab) {
  EXPECT_EQ(entries_.nodes(), 0u);
  std::vector<detail::EntryRef> held;
  std::set<const void*> addresses;
  for (int i = 0; i < 64; ++i) {
    held.push_back(make(i));
    addresses.insert(held.back().get());
  }
  EXPECT_EQ(addresses.size(), 64u);
  const size_t first_slab = entries_.nodes();
  ASSERT_GE(first_slab, 64u);
  EXPECT_EQ(entries_.nodes_in_use(), 64u);
  // The fields are the constructor's; the node holds the object aligned to a cache line.
  EXPECT_EQ(held[5]->slot.layer_idx, 5);
  EXPECT_EQ(held[5]->rows, kRows);
  EXPECT_EQ(held[5]->cols, kCols);
  EXPECT_EQ(held[5]->state, detail::EntryState::kPending);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(held[5].get()) % alignof(detail::Entry), 0u);

  held.clear();
  EXPECT_EQ(entries_.nodes_in_use(), 0u);
  for (int i = 0; i < 64; ++i) held.push_back(make(i));
  EXPECT_EQ(entries_.nodes(), first_slab) << "freed nodes must be reused before a new slab";
  size_t reused = 0;
  for (const auto& e : held) reused += addresses.count(e.get());
  EXPECT_EQ(reused, 64u);
  held.push_back(make(64));
  EXPECT_GT(entries_.nodes(), first_slab) << "a full pool grows by a slab";
  EXPECT_EQ(entries_.nodes_in_use(), 65u);
}

TEST_F(EntryPoolTest, GranulesReturnWithTheEntryAndWeakReferencesKeepTheNode) {
  const uint64_t free_before = pool_.free_blocks();
  auto e = make(0, /*grant=*/true);
  EXPECT_LT(pool_.free_blocks(), free_before);
  std::weak_ptr<detail::Entry> weak = e;
  e.reset();
  EXPECT_EQ(pool_.free_blocks(), free_before) << "the entry's granules go back when it dies";
  // The control block (and so the node) lives until the last weak reference goes.
  EXPECT_EQ(entries_.nodes_in_use(), 1u);
  EXPECT_TRUE(weak.expired());
  weak.reset();
  EXPECT_EQ(entries_.nodes_in_use(), 0u);
}

TEST_F(EntryPoolTest, NodesComeBackFromOtherThreads) {
  // Entries made on this thread and dropped on four others (as retrieves and the write-behind
  // queue do), interleaved with more makes here: every node comes back, none twice.
  constexpr int kRounds = 200;
  constexpr int kPerRound = 16;
  std::atomic<int> made{0};
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::thread> droppers;
    for (int t = 0; t < 4; ++t) {
      std::vector<detail::EntryRef> batch;
      for (int i = 0; i < kPerRound / 4; ++i) batch.push_back(make(i, /*grant=*/true));
      made += static_cast<int>(batch.size());
      droppers.emplace_back([b = std::move(batch)]() mutable { b.clear(); });
    }
    auto kept = make(99);  // a make while the others drop
    for (auto& d : droppers) d.join();
    kept.reset();
  }
  EXPECT_EQ(made.load(), kRounds * kPerRound);
  EXPECT_EQ(entries_.nodes_in_use(), 0u);
  EXPECT_EQ(pool_.free_blocks(), pool_.num_blocks());
  // At most one round's entries were alive at once: the pool never grew past a few slabs.
  EXPECT_LE(entries_.nodes(), 64u * 2);
}

TEST_F(EntryPoolTest, AFreeNodeIsPoisonedUnderAddressSanitizer) {
  // A use after the last reference dropped must stay an ASan report with pooled nodes: a free
  // node is poisoned past its link and unpoisoned when it is handed out again.
  auto e = make(0);
  auto* node = reinterpret_cast<std::byte*>(e.get());
  e.reset();
#ifdef HSS_ADDRESS_SANITIZER
  EXPECT_EQ(__asan_address_is_poisoned(node + 64), 1);
  std::vector<detail::EntryRef> again;
  while (reinterpret_cast<std::byte*>(again.emplace_back(make(1)).get()) != node) {
    ASSERT_LT(again.size(), 1000u) << "the freed node is never reused";
  }
  EXPECT_EQ(__asan_address_is_poisoned(node + 64), 0);
  EXPECT_EQ(again.back()->slot.layer_idx, 1);
#else
  GTEST_SKIP() << "an AddressSanitizer build checks the poisoning (make asan); node " << node;
#endif
}

TEST(EntryPoolStore, EveryIndexedEntryIsPooledAndInvariantsHold) {
  // The store's own pool: check_invariants compares the index's entries with the nodes in use.
  ChunkedTokenDatabase db(16, false);
  Config c;
  c.chunk_size = 16;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = 1.0 / 1024;
  HiddenStateStore store(c, db);
  std::vector<float> rows(64 * 8, 1.5f);
  std::vector<int32_t> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 7 + 1);
  for (int layer = 0; layer < 3; ++layer) {
    StoreOptions o;
    o.layer_idx = layer;
    const auto r = store.store_hidden_states(
        tokens, {rows.data(), DType::kFloat32, 64, 8, 0, Device::kHost, 0}, o);
    EXPECT_EQ(r.written, 4);
  }
  EXPECT_NO_THROW(store.check_invariants());
  EXPECT_EQ(store.stats().entries_held, 12u);
}

}  // namespace
}  // namespace hss
