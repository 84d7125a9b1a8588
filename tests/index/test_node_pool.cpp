// The index's node memory (src/index/node_pool.hpp): small blocks come from per-size-class free lists
// and are reused before a slab grows; large ones go to the heap; a store's keys, inserted and
// erased again, leave the pool as they found it.
#include <gtest/gtest.h>

#include <cstring>
#include <memory_resource>
#include <vector>

#include "base/address_sanitizer.hpp"
#include "hss/hss.hpp"
#include "index/node_pool.hpp"
#include "index/store_index.hpp"
#include "test_util.hpp"

namespace hss {
namespace {

#ifdef HSS_ADDRESS_SANITIZER
constexpr bool kPooling = false;  // under ASan every block is the heap's (use after free reports)
#else
constexpr bool kPooling = true;
#endif

TEST(NodePool, ASmallBlockIsReusedBeforeASlabGrowsAndALargeOneIsTheHeaps) {
  detail::NodePool pool;
  std::pmr::memory_resource& memory = pool;
  void* a = memory.allocate(200, 8);
  std::memset(a, 0xab, 200);
  const size_t slab_blocks = pool.slab_blocks();
  EXPECT_EQ(slab_blocks, kPooling ? 16u : 0u);  // the first slab of its class
  EXPECT_EQ(pool.live_blocks(), 1u);
  memory.deallocate(a, 200, 8);
  EXPECT_EQ(pool.live_blocks(), 0u);
  void* b = memory.allocate(193, 8);  // the same 16-byte class as 200: the freed block
  if (kPooling) {
    EXPECT_EQ(b, a);
  }
  void* large = memory.allocate(detail::NodePool::kMaxPooledBytes + 1, 8);
  void* aligned = memory.allocate(64, 64);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(aligned) % 64, 0u);
  EXPECT_EQ(pool.slab_blocks(), slab_blocks);  // neither came from a slab
  EXPECT_EQ(pool.live_blocks(), 3u);
  memory.deallocate(aligned, 64, 64);
  memory.deallocate(large, detail::NodePool::kMaxPooledBytes + 1, 8);
  memory.deallocate(b, 193, 8);
  EXPECT_EQ(pool.live_blocks(), 0u);
}

TEST(NodePool, ASlabOfAClassIsCarvedIntoDistinctAlignedBlocks) {
  detail::NodePool pool;
  std::pmr::memory_resource& memory = pool;
  std::vector<void*> blocks;
  for (int i = 0; i < 40; ++i) {  // past the first slab (16) and the second (32)
    void* p = memory.allocate(48, 16);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
    std::memset(p, i, 48);
    blocks.push_back(p);
  }
  for (int i = 0; i < 40; ++i) {  // no block overlaps another: each kept its own bytes
    const auto* bytes = static_cast<const unsigned char*>(blocks[static_cast<size_t>(i)]);
    for (int j = 0; j < 48; ++j) ASSERT_EQ(bytes[j], static_cast<unsigned char>(i)) << i;
  }
  if (kPooling) {
    EXPECT_EQ(pool.slab_blocks(), 16u + 32u);
  }
  for (void* p : blocks) memory.deallocate(p, 48, 16);
  EXPECT_EQ(pool.live_blocks(), 0u);
}

TEST(NodePool, KeysInsertedAndErasedTwiceLeaveTheIndexPoolAsTheyFoundIt) {
  constexpr int64_t kChunk = 16;
  ChunkedTokenDatabase db(kChunk, false);
  const auto chunks = db.process_tokens(test::make_tokens(40 * kChunk, 7));
  detail::StoreIndex index;
  index.reserve_keys(chunks.size());  // the bucket array: one heap block, before counting
  const size_t live_before = index.node_memory().live_blocks();
  size_t slabs_after_first = 0;
  for (int round = 0; round < 2; ++round) {
    for (const Chunk& c : chunks) {
      detail::KeyRecord& record = index.insert_empty(c.key, 3);
      EXPECT_EQ(record.slots.capacity(), 3u);
      EXPECT_EQ(index.find(c.key), &record);
    }
    // A node and a slot vector per key, from the pool.
    EXPECT_EQ(index.node_memory().live_blocks(), live_before + 2 * chunks.size());
    EXPECT_EQ(index.keys(), chunks.size());
    for (const Chunk& c : chunks) (void)index.erase(c.key);
    EXPECT_EQ(index.keys(), 0u);
    EXPECT_EQ(index.node_memory().live_blocks(), live_before) << "round " << round;
    if (round == 0) slabs_after_first = index.node_memory().slab_blocks();
  }
  // The second round reused the first round's blocks.
  EXPECT_EQ(index.node_memory().slab_blocks(), slabs_after_first);
}

}  // namespace
}  // namespace hss
