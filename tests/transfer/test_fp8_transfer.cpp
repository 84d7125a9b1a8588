// FP8 entries over the pool transfer (hss/pool_transfer.hpp): an export names their row format
// in its header (wire code 3 or 4), the consumer reserves codes plus scales, and the published
// entries read bit-identically to the producer's own host-pool hit, whatever the consumer's
// storage dtype; the header survives the control message's encoding; a header whose format code
// no build writes is InvalidArgument with nothing changed; a corrupted scale is a counted miss.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "format/dtype_codes.hpp"
#include "format/value_codec.hpp"
#include "hss/error.hpp"
#include "hss/hss.hpp"
#include "hss/pool_transfer.hpp"
#include "hss/transfer_wire.hpp"
#include "test_util.hpp"
#include "transfer_side.hpp"

namespace hss {
namespace {

using test::make_tokens;
using namespace std::chrono_literals;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 32;
constexpr uint64_t kFp8Payload = kChunk * kCols + 4 * kChunk;  // codes + float32 row scales
const std::vector<Slot> kSlots = {{ActivationKind::kHidden, -1}, {ActivationKind::kHidden, 0}};

Config config_of(StorageDType storage, int64_t block_bytes) {
  Config c = test::store_config(kChunk, kCols, 64);
  c.hidden_state_storage_dtype = storage;
  c.hidden_state_block_bytes = block_bytes;
  return c;
}

using Side = test::TransferSide;

/// Rows of magnitudes 1e-2 .. 1e2 (test::scaled_rows), one seed per slot.
void store_slots(HiddenStateStore& store, const std::vector<int32_t>& tokens, uint32_t seed) {
  for (const Slot& slot : kSlots) {
    const auto x = test::scaled_rows(static_cast<int64_t>(tokens.size()), kCols,
                                     seed + static_cast<uint32_t>(slot.layer_idx + 7), 2);
    ASSERT_EQ(
        store.store_hidden_states(tokens, test::view_of(x, kCols), {slot.layer_idx, 0}).cached,
        static_cast<int64_t>(tokens.size()) / kChunk);
  }
}

/// Every slot's rows as a retrieve writes them into an output of `dtype` (empty on a miss).
std::vector<std::vector<std::byte>> read_as(HiddenStateStore& store,
                                            const std::vector<int32_t>& tokens, DType dtype) {
  const auto rows = static_cast<int64_t>(tokens.size());
  std::vector<std::vector<std::byte>> out(kSlots.size());
  std::vector<MutableTensorView> views;
  for (auto& o : out) {
    o.resize(static_cast<size_t>(rows * kCols) * element_size(dtype));
    views.push_back({o.data(), dtype, rows, kCols, 0, Device::kHost, 0});
  }
  if (store.retrieve_layers_into(tokens, kSlots, views) != rows) return {};
  return out;
}

void copy_pieces(const ChunkExport& source, const Reservation& reservation) {
  for (const TransferPiece& p : transfer_pieces(source, reservation)) {
    std::memcpy(reinterpret_cast<void*>(p.local_addr), reinterpret_cast<const void*>(p.remote_addr),
                p.bytes);
  }
}

struct Case {
  StorageDType producer;
  StorageDType consumer;
};

class Fp8Transfer : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8Transfer, ImportedEntriesReadAsTheProducersHostPoolHit) {
  const Case c = GetParam();
  ChunkedTokenDatabase db(kChunk, false);
  // Granules of 192 bytes on the producer, 1024 on the consumer: codes and scales split apart.
  Side producer(config_of(c.producer, 192), db), consumer(config_of(c.consumer, 1024), db);
  const auto tokens = make_tokens(4 * kChunk, 3);
  store_slots(producer.store, tokens, 3);
  const auto chunks = db.process_tokens(tokens);
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, 5s);
  ASSERT_EQ(source.entries.size(), 4 * kSlots.size());
  const uint8_t code = c.producer == StorageDType::kFp8E5M2 ? 4 : 3;
  for (const ExportedEntry& e : source.entries) {
    EXPECT_EQ(static_cast<uint8_t>(e.header[6]), code);
    const auto header = detail::decode_remote_header(e.header);
    ASSERT_TRUE(header.has_value());
    EXPECT_EQ(header->format.scales, detail::ScaleLayout::kRowF32Trailing);
    uint64_t bytes = 0;
    for (const Extent& x : e.extents) bytes += x.bytes;
    EXPECT_EQ(bytes, kFp8Payload);
  }
  // The control message carries the header bytes as they are.
  const std::string wire = encode_export(source);
  const ChunkExport sent = decode_export(std::as_bytes(std::span(wire)));
  ASSERT_EQ(sent.entries.size(), source.entries.size());
  for (size_t i = 0; i < sent.entries.size(); ++i) {
    EXPECT_EQ(sent.entries[i].header, source.entries[i].header);
  }

  Reservation reservation = consumer.transfer.reserve(chunks, sent);
  EXPECT_EQ(reservation.bytes(), 4 * kSlots.size() * kFp8Payload);
  copy_pieces(sent, reservation);
  EXPECT_TRUE(producer.transfer.release_lease(source.lease_id));
  const ImportResult result = reservation.publish();
  EXPECT_EQ(result.published, 4 * kSlots.size());
  EXPECT_EQ(result.rejected, 0U);
  EXPECT_EQ(result.bytes, 4 * kSlots.size() * kFp8Payload);
  EXPECT_EQ(consumer.store.stats().bytes_held, 4 * kSlots.size() * kFp8Payload);

  for (const DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const auto expected = read_as(producer.store, tokens, dtype);
    const auto got = read_as(consumer.store, tokens, dtype);
    ASSERT_EQ(expected.size(), kSlots.size()) << to_string(dtype);
    ASSERT_EQ(got.size(), kSlots.size()) << to_string(dtype);
    for (size_t s = 0; s < kSlots.size(); ++s) {
      ASSERT_EQ(got[s].size(), expected[s].size());
      EXPECT_EQ(std::memcmp(got[s].data(), expected[s].data(), got[s].size()), 0)
          << to_string(dtype) << " slot " << s;
    }
  }
  consumer.store.check_invariants();
}

INSTANTIATE_TEST_SUITE_P(Storage, Fp8Transfer,
                         ::testing::Values(Case{StorageDType::kFp8E4M3, StorageDType::kFp8E4M3},
                                           Case{StorageDType::kFp8E5M2, StorageDType::kFp8E5M2},
                                           Case{StorageDType::kFp8E4M3, StorageDType::kFloat32},
                                           Case{StorageDType::kFp8E5M2, StorageDType::kNative}),
                         [](const auto& param_info) {
                           return std::string(to_string(param_info.param.producer)) + "_to_" +
                                  std::string(to_string(param_info.param.consumer));
                         });

TEST(Fp8TransferChecks, AnUnknownFormatCodeIsInvalidArgumentWithNothingChanged) {
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(config_of(StorageDType::kFp8E4M3, 0), db),
      consumer(config_of(StorageDType::kFp8E4M3, 0), db);
  const auto tokens = make_tokens(2 * kChunk, 4);
  store_slots(producer.store, tokens, 4);
  const auto chunks = db.process_tokens(tokens);
  const ChunkExport good = producer.transfer.export_chunks(chunks, kSlots, 0, 5s);
  const auto before = consumer.store.stats();
  for (const int code : {5, 9, 200}) {
    ChunkExport bad = good;
    bad.entries[1].header[6] = static_cast<std::byte>(code);
    EXPECT_THROW((void)consumer.transfer.reserve(chunks, bad), InvalidArgument) << code;
    const auto after = consumer.store.stats();
    EXPECT_EQ(after.pool_free_bytes, before.pool_free_bytes) << code;
    EXPECT_EQ(after.transfer.reserved_entries, before.transfer.reserved_entries) << code;
    EXPECT_EQ(consumer.store.num_entries(), 0U) << code;
  }
  // Relabelled as float32: the extents hold the FP8 payload, not the float32 one it would need.
  ChunkExport relabelled = good;
  relabelled.entries[0].header[6] = std::byte{0};
  EXPECT_THROW((void)consumer.transfer.reserve(chunks, relabelled), InvalidArgument);
  EXPECT_EQ(consumer.store.num_entries(), 0U);
}

TEST(Fp8TransferChecks, ACorruptedScaleIsACountedMissAndThePrefixStopsThere) {
  ChunkedTokenDatabase db(kChunk, false);
  Side producer(config_of(StorageDType::kFp8E5M2, 0), db),
      consumer(config_of(StorageDType::kFp8E5M2, 0), db);
  const auto tokens = make_tokens(3 * kChunk, 5);
  store_slots(producer.store, tokens, 5);
  const auto chunks = db.process_tokens(tokens);
  const ChunkExport source = producer.transfer.export_chunks(chunks, kSlots, 0, 5s);
  Reservation reservation = consumer.transfer.reserve(chunks, source);
  copy_pieces(source, reservation);
  // Chunk 1, slot 0: flip a byte of its last row's scale in the consumer's copy.
  const Reservation::Reserved& target = reservation.entries()[1 * kSlots.size()];
  uint64_t left = kFp8Payload - 1;
  for (const Extent& x : target.extents) {
    if (left < x.bytes) {
      auto* p = reinterpret_cast<unsigned char*>(x.addr + left);
      *p = static_cast<unsigned char>(*p ^ 0x10);
      break;
    }
    left -= x.bytes;
  }
  EXPECT_TRUE(producer.transfer.release_lease(source.lease_id));
  const ImportResult result = reservation.publish();
  EXPECT_EQ(result.rejected, 1U);
  EXPECT_EQ(result.published, 3 * kSlots.size() - 1);
  EXPECT_EQ(consumer.store.stats().transfer.rejected_entries, 1U);
  // Three chunks asked: not served (chunk 1 misses a slot); chunk 0 alone: as the producer's.
  EXPECT_TRUE(read_as(consumer.store, tokens, DType::kFloat32).empty());
  const std::vector<int32_t> first(tokens.begin(), tokens.begin() + kChunk);
  const auto expected = read_as(producer.store, first, DType::kFloat32);
  const auto got = read_as(consumer.store, first, DType::kFloat32);
  ASSERT_EQ(got.size(), kSlots.size());
  ASSERT_EQ(expected.size(), kSlots.size());
  for (size_t s = 0; s < kSlots.size(); ++s) EXPECT_EQ(got[s], expected[s]) << "slot " << s;
  consumer.store.check_invariants();
}

}  // namespace
}  // namespace hss
