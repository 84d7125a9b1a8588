// The pool transfer primitives (hss/pool_transfer.hpp) between two stores of one process, with
// memcpy as the one-sided transport: round trips, leases against eviction and reuse, expiry,
// corrupted and forged bytes, a full consumer pool, abandon, and malformed exports.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "hss/error.hpp"
#include "hss/hss.hpp"
#include "hss/pool_transfer.hpp"
#include "hss/transfer_wire.hpp"
#include "format/value_codec.hpp"
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
const std::vector<Slot> kSlots = {
    {ActivationKind::kHidden, -1}, {ActivationKind::kHidden, 0}, {ActivationKind::kHidden, 5}};
const std::string kKey = "0123456789abcdef-test-key";

Config pool_config(int64_t pool_chunks, int64_t block_bytes = 0, std::string mac_key = {}) {
  Config c = test::store_config(kChunk, kCols, pool_chunks);
  c.hidden_state_block_bytes = block_bytes;
  c.hidden_state_mac_key = std::move(mac_key);
  return c;
}

// One side: a store, its KV, its primitives.
using Side = test::TransferSide;

void store_slots(HiddenStateStore& store, const std::vector<int32_t>& tokens) {
  for (const Slot& slot : kSlots) {
    const auto rows = make_rows(tokens, 0, slot.layer_idx, kCols);
    ASSERT_EQ(store.store_hidden_states(tokens, view_of(rows, kCols), {slot.layer_idx, 0}).cached,
              static_cast<int64_t>(tokens.size()) / kChunk);
  }
}

void expect_slots(HiddenStateStore& store, const std::vector<int32_t>& tokens, int64_t rows) {
  const auto got = store.retrieve_layers(tokens, std::span<const Slot>(kSlots));
  if (rows == 0) {
    EXPECT_TRUE(got.empty());
    return;
  }
  ASSERT_EQ(got.size(), kSlots.size());
  for (size_t s = 0; s < kSlots.size(); ++s) {
    ASSERT_EQ(got[s].rows(), rows);
    const auto expected = make_rows(tokens, 0, kSlots[s].layer_idx, kCols);
    ASSERT_EQ(std::memcmp(got[s].data(), expected.data(), got[s].bytes()), 0) << "slot " << s;
  }
}

// The transport: every piece copied from the producer's memory into the consumer's.
void copy_pieces(const ChunkExport& source, const Reservation& reservation) {
  for (const TransferPiece& p : transfer_pieces(source, reservation)) {
    std::memcpy(reinterpret_cast<void*>(p.local_addr), reinterpret_cast<const void*>(p.remote_addr),
                p.bytes);
  }
}

// The bytes an exported entry's extents hold now.
std::vector<std::byte> bytes_at(const std::vector<Extent>& extents) {
  std::vector<std::byte> bytes;
  for (const Extent& x : extents) {
    const auto* p = reinterpret_cast<const std::byte*>(x.addr);
    bytes.insert(bytes.end(), p, p + x.bytes);
  }
  return bytes;
}

// What a consumer does: reserve, READ, release the lease, publish (or abandon).
ImportResult pull(Side& producer, Side& consumer, const std::vector<Chunk>& chunks,
                  std::chrono::milliseconds lease = 5s) {
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, lease);
  Reservation reservation = consumer.transfer.reserve(chunks, source);
  copy_pieces(source, reservation);
  if (!producer.transfer.release_lease(source.lease_id)) {
    reservation.abandon();
    return {};
  }
  return reservation.publish();
}

TEST(PoolTransfer, RoundTripThreeLayersBitForBitAcrossDifferentGranules) {
  ChunkedTokenDatabase db(kChunk, false);
  // The producer's granule is 256 bytes, the consumer's 1536: pieces split on both sides.
  Side producer(pool_config(64, 256), db), consumer(pool_config(64, 1536), db);
  const auto tokens = make_tokens(8 * kChunk, 1);
  store_slots(producer.store, tokens);
  const auto chunks = db.process_tokens(tokens);
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, 5s);
  EXPECT_NE(source.lease_id, 0U);
  EXPECT_EQ(source.chunks, 8U);
  EXPECT_EQ(source.prefix_tokens, 8 * kChunk);
  ASSERT_EQ(source.entries.size(), 8 * kSlots.size());
  EXPECT_EQ(producer.store.stats().transfer.leases_held, 1U);
  Reservation reservation = consumer.transfer.reserve(chunks, source);
  EXPECT_EQ(reservation.entries().size(), source.entries.size());
  EXPECT_EQ(reservation.chunks_covered(), 8U);
  EXPECT_EQ(reservation.bytes(), static_cast<uint64_t>(8 * 3 * kChunk * kCols * 4));
  expect_slots(consumer.store, tokens, 0);  // PENDING: invisible
  copy_pieces(source, reservation);
  EXPECT_TRUE(producer.transfer.release_lease(source.lease_id));
  EXPECT_FALSE(producer.transfer.release_lease(source.lease_id));  // once
  const ImportResult r = reservation.publish();
  EXPECT_EQ(r.published, source.entries.size());
  EXPECT_EQ(r.rejected, 0U);
  expect_slots(consumer.store, tokens, 8 * kChunk);
  consumer.store.check_invariants();
  const auto t = producer.store.stats().transfer;
  EXPECT_EQ(t.leases_held, 0U);
  EXPECT_EQ(t.leases_released, 1U);
  EXPECT_EQ(consumer.store.stats().transfer.imported_entries, source.entries.size());
}

TEST(PoolTransfer, ExportStartsAtFirstChunkAndImportSkipsWhatIsHeld) {
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(pool_config(64), db), consumer(pool_config(64), db);
  const auto tokens = make_tokens(6 * kChunk, 2);
  store_slots(producer.store, tokens);
  const std::vector<int32_t> head(tokens.begin(), tokens.begin() + 2 * kChunk);
  store_slots(consumer.store, head);
  const auto chunks = db.process_tokens(tokens);
  EXPECT_EQ(consumer.transfer.missing_range(chunks, kSlots), std::make_pair(size_t{2}, size_t{6}));
  consumer.kv.evict(chunks[5].key);  // KV decides on the consumer: pull [2, 5) only
  EXPECT_EQ(consumer.transfer.missing_range(chunks, kSlots), std::make_pair(size_t{2}, size_t{5}));
  const std::vector<Chunk> wanted(chunks.begin(), chunks.begin() + 5);
  const ChunkExport source = producer.transfer.export_chunks(wanted, kSlots, 2, 5s);
  EXPECT_EQ(source.first_chunk, 2U);
  EXPECT_EQ(source.chunks, 3U);
  EXPECT_EQ(source.entries.front().chunk, 2U);
  Reservation reservation = consumer.transfer.reserve(wanted, source);
  copy_pieces(source, reservation);
  ASSERT_TRUE(producer.transfer.release_lease(source.lease_id));
  EXPECT_EQ(reservation.publish().published, 9U);
  expect_slots(consumer.store, tokens, 5 * kChunk);
  // Everything held: nothing to pull, and an export of nothing holds no lease.
  EXPECT_EQ(consumer.transfer.missing_range(wanted, kSlots), std::make_pair(size_t{5}, size_t{5}));
  const ChunkExport none = producer.transfer.export_chunks(wanted, kSlots, 5, 5s);
  EXPECT_EQ(none.lease_id, 0U);
  EXPECT_TRUE(none.entries.empty());
}

// Stores every slot of a prompt of `chunks` chunks for each seed (pool pressure on the producer).
void press(HiddenStateStore& store, uint64_t first_seed, uint64_t seeds, int64_t chunks,
           std::span<const Slot> slots) {
  for (uint64_t seed = first_seed; seed < first_seed + seeds; ++seed) {
    const auto other = make_tokens(chunks * kChunk, seed);
    for (const Slot& slot : slots) {
      const auto rows = make_rows(other, 0, slot.layer_idx, kCols);
      (void)store.store_hidden_states(other, view_of(rows, kCols), {slot.layer_idx, 0});
    }
  }
}

TEST(PoolTransfer, LeasedGranulesAreNotReusedUnderPressureUntilReleased) {
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(pool_config(12), db);  // 12 chunks of one slot: 4 prompts of 1 chunk x 3 slots
  const auto leased = make_tokens(2 * kChunk, 3);
  store_slots(producer.store, leased);  // 6 chunk-slots
  const auto chunks = db.process_tokens(leased);
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, 60s);
  ASSERT_EQ(source.entries.size(), 6U);
  std::vector<std::vector<std::byte>> before;
  for (const ExportedEntry& e : source.entries) before.push_back(bytes_at(e.extents));
  // Pool pressure: many other prompts, each needing room. The leased key is LRU, yet stays.
  press(producer.store, 100, 20, 2, kSlots);
  EXPECT_GT(producer.store.stats().hs_evictions, 0U);
  for (const Chunk& c : chunks) EXPECT_TRUE(producer.store.has_chunk(c.key, 0));
  // drop_key takes the key out of the index, but its granules stay with the lease.
  EXPECT_TRUE(producer.store.drop_key(chunks[0].key));
  press(producer.store, 200, 10, 2, std::span(kSlots).first(1));
  for (size_t i = 0; i < source.entries.size(); ++i) {
    ASSERT_EQ(bytes_at(source.entries[i].extents), before[i])
        << "leased entry " << i << " was overwritten";
  }
  EXPECT_EQ(producer.store.stats().transfer.leased_bytes, 6U * kChunk * kCols * 4);
  producer.store.check_invariants();
  // Released: the same pressure now evicts the key and reuses its granules.
  ASSERT_TRUE(producer.transfer.release_lease(source.lease_id));
  press(producer.store, 300, 20, 2, kSlots);
  EXPECT_FALSE(producer.store.has_chunk(chunks[1].key, 0));
  bool reused = false;
  for (size_t i = 0; i < source.entries.size(); ++i) {
    reused = reused || bytes_at(source.entries[i].extents) != before[i];
  }
  EXPECT_TRUE(reused) << "the released granules were never reused";
  producer.store.check_invariants();
}

TEST(PoolTransfer, ExpiredLeaseIsRefusedAndEndsAtTheNextStore) {
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(pool_config(64), db), consumer(pool_config(64), db);
  const auto tokens = make_tokens(2 * kChunk, 4);
  store_slots(producer.store, tokens);
  const auto chunks = db.process_tokens(tokens);
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, 1ms);
  Reservation reservation = consumer.transfer.reserve(chunks, source);
  copy_pieces(source, reservation);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(producer.transfer.release_lease(source.lease_id));  // expired: a miss
  reservation.abandon();
  expect_slots(consumer.store, tokens, 0);
  EXPECT_EQ(consumer.store.stats().transfer.abandoned_entries, 6U);
  EXPECT_EQ(producer.store.stats().transfer.leases_expired, 1U);
  // A lease nobody releases ends by itself at the next store after its deadline.
  const ChunkExport again = producer.transfer.export_chunks(chunks, kSlots, 0, 1ms);
  EXPECT_EQ(producer.store.stats().transfer.leases_held, 1U);
  std::this_thread::sleep_for(20ms);
  store_slots(producer.store, make_tokens(kChunk, 5));
  EXPECT_EQ(producer.store.stats().transfer.leases_held, 0U);
  EXPECT_FALSE(producer.transfer.release_lease(again.lease_id));
  consumer.store.check_invariants();
}

TEST(PoolTransfer, CorruptedGranuleIsACountedMissAndThePrefixStopsThere) {
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(pool_config(64), db), consumer(pool_config(64), db);
  const auto tokens = make_tokens(4 * kChunk, 6);
  store_slots(producer.store, tokens);
  const auto chunks = db.process_tokens(tokens);
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, 5s);
  Reservation reservation = consumer.transfer.reserve(chunks, source);
  copy_pieces(source, reservation);
  // One byte of chunk 2, slot 1 flipped in flight.
  const Reservation::Reserved& hit = reservation.entries()[2 * kSlots.size() + 1];
  *reinterpret_cast<std::byte*>(hit.extents.front().addr + 7) ^= std::byte{0x40};
  ASSERT_TRUE(producer.transfer.release_lease(source.lease_id));
  const ImportResult r = reservation.publish();
  EXPECT_EQ(r.rejected, 1U);
  EXPECT_EQ(r.published, source.entries.size() - 1);
  expect_slots(consumer.store, tokens, 2 * kChunk);
  EXPECT_EQ(consumer.store.stats().transfer.rejected_entries, 1U);
  consumer.store.check_invariants();
}

TEST(PoolTransfer, CheckedBatchesArePublishedWithTheirVerdictAndTheRestCheckedThen) {
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(pool_config(64), db), consumer(pool_config(64), db);
  const auto tokens = make_tokens(4 * kChunk, 14);
  store_slots(producer.store, tokens);
  const auto chunks = db.process_tokens(tokens);
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, 5s);
  Reservation reservation = consumer.transfer.reserve(chunks, source);
  // Batch 1 (chunks 0-1) lands and is checked while batch 2 (chunks 2-3) is "in flight".
  for (const TransferPiece& p : transfer_pieces(source, reservation, 0, 6)) {
    std::memcpy(reinterpret_cast<void*>(p.local_addr), reinterpret_cast<const void*>(p.remote_addr),
                p.bytes);
  }
  EXPECT_EQ(reservation.check(0, 6), 0U);
  EXPECT_EQ(reservation.check(6, 3), 3U);  // not landed yet: garbage fails, as it should
  EXPECT_THROW((void)reservation.check(10, 3), InvalidArgument);
  EXPECT_THROW((void)transfer_pieces(source, reservation, 11, 2), InvalidArgument);
  for (const TransferPiece& p : transfer_pieces(source, reservation, 6, 6)) {
    std::memcpy(reinterpret_cast<void*>(p.local_addr), reinterpret_cast<const void*>(p.remote_addr),
                p.bytes);
  }
  ASSERT_TRUE(producer.transfer.release_lease(source.lease_id));
  // A verdict stands: entries 6-8 were checked before their bytes landed and stay rejected;
  // 9-11 were never checked, so publish checks them now.
  const ImportResult r = reservation.publish();
  EXPECT_EQ(r.rejected, 3U);
  EXPECT_EQ(r.published, 9U);
  expect_slots(consumer.store, tokens, 2 * kChunk);
  consumer.store.check_invariants();
}

TEST(PoolTransfer, MacRequiredByAKeyedConsumer) {
  if (!detail::value_mac_available()) GTEST_SKIP() << "built without OpenSSL";
  ChunkedTokenDatabase db(kChunk, false);
  const auto tokens = make_tokens(2 * kChunk, 7);
  const auto chunks = db.process_tokens(tokens);
  {  // Same key on both sides: served.
    Side producer(pool_config(64, 0, kKey), db), consumer(pool_config(64, 0, kKey), db);
    store_slots(producer.store, tokens);
    const ImportResult r = pull(producer, consumer, chunks);
    EXPECT_EQ(r.published, 6U);
    expect_slots(consumer.store, tokens, 2 * kChunk);
  }
  {  // A producer without the key (or anyone on the control socket) cannot feed a keyed consumer.
    Side producer(pool_config(64), db), consumer(pool_config(64, 0, kKey), db);
    store_slots(producer.store, tokens);
    const ImportResult r = pull(producer, consumer, chunks);
    EXPECT_EQ(r.rejected, 6U);
    EXPECT_EQ(r.unauthenticated, 6U);
    expect_slots(consumer.store, tokens, 0);
    EXPECT_EQ(consumer.store.stats().transfer.unauthenticated_entries, 6U);
  }
  {  // Another key: rejected.
    Side producer(pool_config(64, 0, kKey + "-other"), db), consumer(pool_config(64, 0, kKey), db);
    store_slots(producer.store, tokens);
    EXPECT_EQ(pull(producer, consumer, chunks).unauthenticated, 6U);
    expect_slots(consumer.store, tokens, 0);
  }
}

TEST(PoolTransfer, ForgedBytesWithAValidChecksumButNoValidMacAreRejected) {
  if (!detail::value_mac_available()) GTEST_SKIP() << "built without OpenSSL";
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(pool_config(64, 0, kKey), db), consumer(pool_config(64, 0, kKey), db);
  const auto tokens = make_tokens(kChunk, 8);
  store_slots(producer.store, tokens);
  const auto chunks = db.process_tokens(tokens);
  ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, 5s);
  // The attacker replaces slot 0's bytes with its own and fixes the header's xxHash3 to match.
  std::vector<float> forged(static_cast<size_t>(kChunk * kCols), 42.0F);
  const std::span<const std::byte> forged_bytes = std::as_bytes(std::span(forged));
  ExportedEntry& e = source.entries[0];
  e.extents = {{reinterpret_cast<uint64_t>(forged.data()), forged_bytes.size()}};
  auto header = *detail::decode_remote_header(e.header);
  header.payload_hash = detail::hash_pieces(std::span(&forged_bytes, 1));
  detail::encode_remote_header(header, e.header);
  Reservation reservation = consumer.transfer.reserve(chunks, source);
  copy_pieces(source, reservation);
  ASSERT_TRUE(producer.transfer.release_lease(source.lease_id));
  const ImportResult r = reservation.publish();
  EXPECT_EQ(r.unauthenticated, 1U);
  EXPECT_EQ(r.published, 2U);
  EXPECT_FALSE(consumer.store.has_chunk(chunks[0].key, kSlots[0].layer_idx));
  EXPECT_TRUE(consumer.store.retrieve_layers(tokens, std::span<const Slot>(kSlots)).empty());
}

TEST(PoolTransfer, FullConsumerPoolGivesACleanPartialPrefix) {
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(pool_config(64), db), consumer(pool_config(7), db);  // room for 2 chunks x 3 slots
  const auto tokens = make_tokens(5 * kChunk, 9);
  store_slots(producer.store, tokens);
  const auto chunks = db.process_tokens(tokens);
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, 5s);
  Reservation reservation = consumer.transfer.reserve(chunks, source);
  EXPECT_EQ(reservation.chunks_covered(), 2U);
  EXPECT_EQ(reservation.entries().size(), 7U);  // chunk 2's first slot fits, its second does not
  copy_pieces(source, reservation);
  ASSERT_TRUE(producer.transfer.release_lease(source.lease_id));
  EXPECT_EQ(reservation.publish().published, 7U);
  expect_slots(consumer.store, tokens, 2 * kChunk);
  EXPECT_GT(consumer.store.stats().allocation_failures, 0U);
  consumer.store.check_invariants();
}

TEST(PoolTransfer, AbandonedOrDestroyedReservationLeavesNothingBehind) {
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(pool_config(64), db), consumer(pool_config(64), db);
  const auto tokens = make_tokens(3 * kChunk, 10);
  store_slots(producer.store, tokens);
  const auto chunks = db.process_tokens(tokens);
  const auto free_before = consumer.store.stats().pool_free_bytes;
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, 5s);
  {
    Reservation reservation = consumer.transfer.reserve(chunks, source);
    EXPECT_LT(consumer.store.stats().pool_free_bytes, free_before);
    copy_pieces(source, reservation);  // a transport that dies before publishing
  }
  EXPECT_EQ(consumer.store.stats().pool_free_bytes, free_before);
  EXPECT_EQ(consumer.store.num_entries(), 0U);
  EXPECT_EQ(consumer.store.stats().transfer.abandoned_entries, 9U);
  consumer.store.check_invariants();
  EXPECT_TRUE(producer.transfer.release_lease(source.lease_id));
}

TEST(PoolTransfer, MalformedExportIsInvalidArgumentWithNothingChanged) {
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(pool_config(64), db), consumer(pool_config(64), db);
  const auto tokens = make_tokens(2 * kChunk, 11);
  store_slots(producer.store, tokens);
  const auto chunks = db.process_tokens(tokens);
  const ChunkExport good = producer.transfer.export_chunks(chunks, kSlots, 0, 5s);
  const auto before = consumer.store.stats();
  const auto expect_rejected = [&](ChunkExport bad, const char* what) {
    EXPECT_THROW((void)consumer.transfer.reserve(chunks, bad), InvalidArgument) << what;
    const auto after = consumer.store.stats();
    EXPECT_EQ(after.pool_free_bytes, before.pool_free_bytes) << what;
    EXPECT_EQ(after.transfer.reserved_entries, before.transfer.reserved_entries) << what;
    EXPECT_EQ(consumer.store.num_entries(), 0U) << what;
  };
  ChunkExport bad = good;
  bad.entries[1].chunk = 9;
  expect_rejected(bad, "chunk past the list");
  bad = good;
  bad.entries[4].chunk = 0;
  expect_rejected(bad, "chunks out of order");
  bad = good;
  bad.entries[0].extents.back().bytes -= 4;
  expect_rejected(bad, "extents short of the payload");
  bad = good;
  bad.entries[0].extents.push_back({0, 64});
  expect_rejected(bad, "extents past the payload");
  bad = good;
  bad.entries[2].header[0] = std::byte{'X'};
  expect_rejected(bad, "foreign header");
  bad = good;
  auto header = *detail::decode_remote_header(bad.entries[3].header);
  header.rows = kChunk / 2;
  detail::encode_remote_header(header, bad.entries[3].header);
  expect_rejected(bad, "rows of another chunk size");
  // Export arguments.
  EXPECT_THROW((void)producer.transfer.export_chunks(chunks, kSlots, 3, 5s), InvalidArgument);
  EXPECT_THROW((void)producer.transfer.export_chunks(chunks, kSlots, 0, 0ms), InvalidArgument);
  EXPECT_THROW((void)producer.transfer.export_chunks(chunks, {}, 0, 5s), InvalidArgument);
  EXPECT_EQ(producer.store.stats().transfer.leases_held, 1U);
}

TEST(PoolTransfer, KvGoneOnTheProducerEndsItsExport) {
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(pool_config(64), db);
  const auto tokens = make_tokens(4 * kChunk, 12);
  store_slots(producer.store, tokens);
  const auto chunks = db.process_tokens(tokens);
  producer.kv.evict(chunks[2].key);
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, 5s);
  EXPECT_EQ(source.chunks, 2U);
  EXPECT_EQ(source.prefix_tokens, 2 * kChunk);
  EXPECT_EQ(producer.store.stats().coupled_evictions, 1U);
}

TEST(TransferWire, ExportAndPullRequestRoundTripAndEveryTruncationIsRejected) {
  ChunkedTokenDatabase db(kChunk, false, Metadata{"vllm", "model/x", 2, 1, "bfloat16"});
  Side producer(pool_config(64, 0, detail::value_mac_available() ? kKey : ""), db);
  const auto tokens = make_tokens(3 * kChunk, 13);
  store_slots(producer.store, tokens);
  const auto chunks = db.process_tokens(tokens);
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 1, 5s);
  const std::string wire = encode_export(source);
  const ChunkExport back = decode_export(std::as_bytes(std::span(wire)));
  EXPECT_EQ(back.lease_id, source.lease_id);
  EXPECT_EQ(back.first_chunk, 1U);
  EXPECT_EQ(back.chunks, 2U);
  EXPECT_EQ(back.prefix_tokens, source.prefix_tokens);
  ASSERT_EQ(back.entries.size(), source.entries.size());
  for (size_t i = 0; i < back.entries.size(); ++i) {
    EXPECT_EQ(back.entries[i].chunk, source.entries[i].chunk);
    EXPECT_EQ(back.entries[i].slot, source.entries[i].slot);
    EXPECT_EQ(back.entries[i].header, source.entries[i].header);
    EXPECT_EQ(back.entries[i].mac, source.entries[i].mac);
    EXPECT_EQ(back.entries[i].extents, source.entries[i].extents);
  }
  const PullRequest request{chunks, kSlots, 1, 2500};
  const std::string q = encode_pull_request(request);
  const PullRequest qb = decode_pull_request(std::as_bytes(std::span(q)));
  ASSERT_EQ(qb.chunks.size(), chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(qb.chunks[i].key, chunks[i].key);
    EXPECT_EQ(qb.chunks[i].start, chunks[i].start);
    EXPECT_EQ(qb.chunks[i].end, chunks[i].end);
  }
  EXPECT_EQ(qb.slots, kSlots);
  EXPECT_EQ(qb.first_chunk, 1U);
  EXPECT_EQ(qb.lease_ms, 2500U);
  for (size_t n = 0; n < wire.size(); ++n) {
    EXPECT_THROW((void)decode_export(std::as_bytes(std::span(wire.data(), n))), InvalidArgument);
  }
  for (size_t n = 0; n < q.size(); ++n) {
    EXPECT_THROW((void)decode_pull_request(std::as_bytes(std::span(q.data(), n))), InvalidArgument);
  }
  std::string longer = wire + "x";
  EXPECT_THROW((void)decode_export(std::as_bytes(std::span(longer))), InvalidArgument);
  std::string huge = wire;
  huge[36] = '\xff';  // the entry count's low byte
  huge[39] = '\x7f';
  EXPECT_THROW((void)decode_export(std::as_bytes(std::span(huge))), InvalidArgument);
}

}  // namespace
}  // namespace hss
