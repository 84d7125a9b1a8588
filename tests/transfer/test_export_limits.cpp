// What one pull request may cost a producer (hss/pool_transfer.hpp, "What one request may cost";
// docs/design.md, "Threat model"): a key or slot named twice, more chunks than
// hidden_state_transfer_max_chunks, an export over _max_lease_bytes, or past the lease table's
// bounds is refused, counted, with nothing leased.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "hss/error.hpp"
#include "hss/hss.hpp"
#include "hss/pool_transfer.hpp"
#include "test_util.hpp"
#include "transfer_side.hpp"

namespace hss {
namespace {

using test::make_rows;
using test::make_tokens;
using test::view_of;
using namespace std::chrono_literals;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;
constexpr uint64_t kEntryBytes = kChunk * kCols * 4;
const std::vector<Slot> kSlots = {{ActivationKind::kHidden, 0}, {ActivationKind::kHidden, 3}};

// A producer holding `chunks` chunks of two layers, under `config`'s transfer limits.
struct Producer {
  explicit Producer(Config config, int64_t chunks = 4)
      : db(kChunk, false), side(config, db), tokens(make_tokens(chunks * kChunk, 7)) {
    for (const Slot& slot : kSlots) {
      const auto rows = make_rows(tokens, 0, slot.layer_idx, kCols);
      EXPECT_EQ(side.store.store_hidden_states(tokens, view_of(rows, kCols), {slot.layer_idx, 0})
                    .cached,
                chunks);
    }
    list = db.process_tokens(tokens);
  }
  [[nodiscard]] TransferStats stats() const { return side.store.stats().transfer; }
  ChunkedTokenDatabase db;
  test::TransferSide side;
  std::vector<int32_t> tokens;
  std::vector<Chunk> list;
};

Config limits_config() { return test::store_config(kChunk, kCols, 64); }

TEST(ExportLimits, ARequestNamingOneKeyManyTimesIsRefusedWithNothingLeased) {
  Producer p(limits_config());
  // One held key named for 64 contiguous chunks: without the check, 64 x 2 pins and an export
  // of that size.
  std::vector<Chunk> repeated;
  for (int64_t i = 0; i < 64; ++i) repeated.push_back({i * kChunk, (i + 1) * kChunk, p.list[0].key});
  EXPECT_THROW((void)p.side.transfer.export_chunks(repeated, kSlots, 0, 5s), InvalidArgument);
  EXPECT_EQ(p.stats().refused_exports, 1U);
  EXPECT_EQ(p.stats().leases_held, 0U);
  EXPECT_EQ(p.stats().exports, 0U);
}

TEST(ExportLimits, ARequestNamingOneSlotTwiceIsRefused) {
  Producer p(limits_config());
  const std::vector<Slot> slots = {kSlots[0], kSlots[1], kSlots[0]};
  EXPECT_THROW((void)p.side.transfer.export_chunks(p.list, slots, 0, 5s), InvalidArgument);
  EXPECT_EQ(p.stats().refused_exports, 1U);
  EXPECT_EQ(p.stats().leases_held, 0U);
}

TEST(ExportLimits, MoreChunksThanMaxChunksIsRefused) {
  Config c = limits_config();
  c.hidden_state_transfer_max_chunks = 3;
  Producer p(c, 4);
  EXPECT_THROW((void)p.side.transfer.export_chunks(p.list, kSlots, 0, 5s), InvalidArgument);
  EXPECT_EQ(p.stats().refused_exports, 1U);
  const std::vector<Chunk> three(p.list.begin(), p.list.begin() + 3);
  const ChunkExport e = p.side.transfer.export_chunks(three, kSlots, 0, 5s);
  EXPECT_EQ(e.entries.size(), 3 * kSlots.size());
  EXPECT_NE(e.lease_id, 0U);
}

TEST(ExportLimits, AnExportOverMaxLeaseBytesIsRefusedWithNothingLeased) {
  Config c = limits_config();
  c.hidden_state_transfer_max_lease_bytes = static_cast<int64_t>(3 * kEntryBytes);
  Producer p(c, 4);
  EXPECT_THROW((void)p.side.transfer.export_chunks(p.list, kSlots, 0, 5s), Error);  // 8 entries
  EXPECT_EQ(p.stats().refused_exports, 1U);
  EXPECT_EQ(p.stats().leases_held, 0U);
  EXPECT_EQ(p.stats().leased_bytes, 0U);
  const std::vector<Chunk> one(p.list.begin(), p.list.begin() + 1);
  EXPECT_EQ(p.side.transfer.export_chunks(one, kSlots, 0, 5s).entries.size(), 2U);  // 2 entries fit
}

TEST(ExportLimits, LeasesPastMaxLeasesAreRefusedUntilOneIsReleased) {
  Config c = limits_config();
  c.hidden_state_transfer_max_leases = 2;
  Producer p(c);
  const ChunkExport a = p.side.transfer.export_chunks(p.list, kSlots, 0, 5s);
  const ChunkExport b = p.side.transfer.export_chunks(p.list, kSlots, 0, 5s);
  EXPECT_THROW((void)p.side.transfer.export_chunks(p.list, kSlots, 0, 5s), Error);
  EXPECT_EQ(p.stats().refused_exports, 1U);
  EXPECT_EQ(p.stats().leases_held, 2U);
  EXPECT_TRUE(p.side.transfer.release_lease(a.lease_id));
  EXPECT_NE(p.side.transfer.export_chunks(p.list, kSlots, 0, 5s).lease_id, 0U);
  EXPECT_NE(b.lease_id, 0U);
}

TEST(ExportLimits, LeasesPastMaxLeasedBytesAreRefused) {
  Config c = limits_config();
  c.hidden_state_transfer_max_leased_bytes = static_cast<int64_t>(12 * kEntryBytes);
  Producer p(c, 4);  // one export: 8 entries
  (void)p.side.transfer.export_chunks(p.list, kSlots, 0, 5s);
  EXPECT_THROW((void)p.side.transfer.export_chunks(p.list, kSlots, 0, 5s), Error);
  EXPECT_EQ(p.stats().leased_bytes, 8 * kEntryBytes);
  const std::vector<Chunk> two(p.list.begin(), p.list.begin() + 2);
  EXPECT_NE(p.side.transfer.export_chunks(two, kSlots, 0, 5s).lease_id, 0U);  // 4 more fit
  EXPECT_EQ(p.stats().leased_bytes, 12 * kEntryBytes);
}

TEST(HandshakeTag, IsTheStoresMacUnderItsLabelAndNoneWithoutAKey) {
  Config keyed = limits_config();
  keyed.hidden_state_mac_key = "0123456789abcdef-handshake";
  Producer a(keyed), b(keyed), unkeyed(limits_config());
  const std::vector<std::byte> transcript(64, std::byte{0x5a});
  const auto tag = a.side.transfer.handshake_tag("consumer", transcript);
  ASSERT_TRUE(tag.has_value());
  EXPECT_EQ(tag, b.side.transfer.handshake_tag("consumer", transcript));  // the same key
  EXPECT_NE(tag, a.side.transfer.handshake_tag("producer", transcript));  // the label counts
  EXPECT_FALSE(unkeyed.side.transfer.handshake_tag("consumer", transcript).has_value());
}

}  // namespace
}  // namespace hss
