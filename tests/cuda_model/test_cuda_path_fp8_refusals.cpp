// A store with the CUDA device path takes no FP8 (scaled) entry from outside, because its kernels
// move unscaled elements only (src/store/hidden_state_store_tiers.cpp, fits; src/store/
// store_transfer.cpp, reserve_import): an FP8 value a backing tier returns is counted as the
// tier's hit but not promoted (a miss for the retrieve), and an FP8 entry offered by a P/D
// export is InvalidArgument with nothing changed. Each beside the same values as float32, which
// the store takes, so the refusal is the row format's alone.
//
// The FP8 values cannot come from a store here: where a device is, a store of FP8 storage is a
// ConfigError (create_platform_device_path). They are written as a writer would: the disk tier's
// own enqueue_write, and export entries encoded with the value codec's header.

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "format/dtype_codes.hpp"
#include "format/row_format.hpp"
#include "format/value_codec.hpp"
#include "gpu/gpu_test_util.hpp"
#include "hss/error.hpp"
#include "hss/hss.hpp"
#include "hss/pool_transfer.hpp"
#include "tier_test_dir.hpp"
#include "tiers/disk/disk_tier.hpp"
#include "transfer/transfer_side.hpp"

namespace hss {
namespace {

using namespace std::chrono_literals;
using detail::RowFormat;
using test::make_rows;
using test::make_tokens;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 64;
constexpr Slot kSlot{ActivationKind::kHidden, 0};

const RowFormat kFloat32 = detail::to_row_format(DType::kFloat32);
const RowFormat kFp8Formats[] = {*detail::row_format_from_wire(detail::kWireFp8E4M3RowF32),
                                 *detail::row_format_from_wire(detail::kWireFp8E5M2RowF32)};

/// Chunk `c`'s payload in `format`: float32 rows of make_rows (those a retrieve must return), or
/// FP8 codes (0x38) and float32 row scales of 1 in their trailing block.
std::vector<std::byte> payload_of(RowFormat format, const std::vector<int32_t>& tokens, size_t c) {
  std::vector<std::byte> out(detail::remote_payload_bytes(format, kChunk, kCols));
  if (format == kFloat32) {
    const auto rows = make_rows(tokens, 0, kSlot.layer_idx, kCols);
    std::memcpy(out.data(), rows.data() + c * kChunk * kCols, out.size());
    return out;
  }
  const uint64_t scales = RowFormat::scale_offset(kChunk, kCols);
  std::memset(out.data(), 0x38, scales);
  const float one = 1.0f;
  for (int64_t r = 0; r < kChunk; ++r) std::memcpy(out.data() + scales + 4 * r, &one, 4);
  return out;
}

Config device_store_config() { return test::store_config(kChunk, kCols, 64); }

class CudaPathFp8 : public ::testing::Test {
 protected:
  void SetUp() override { HSS_REQUIRE_DEVICE(); }
};

TEST_F(CudaPathFp8, AScaledValueFromATierIsCountedNotPromotedAFloat32OneIs) {
  const test::TempDir dir;
  ChunkedTokenDatabase db(kChunk, false);
  const auto f32_tokens = make_tokens(2 * kChunk, 81);
  const std::vector<std::vector<int32_t>> fp8_tokens = {make_tokens(2 * kChunk, 82),
                                                        make_tokens(2 * kChunk, 83)};
  {
    // The store's disk tier directory, written by a disk tier of its own.
    detail::DiskTierOptions o;
    o.dir = dir.values();
    o.budget_bytes = 1ULL << 30;
    o.queue_bytes = 16ULL << 20;
    detail::DiskTier tier(std::move(o));
    const auto write = [&](RowFormat format, const std::vector<int32_t>& tokens) {
      const auto chunks = db.process_tokens(tokens);
      for (size_t c = 0; c < chunks.size(); ++c) {
        const auto payload = payload_of(format, tokens, c);
        const std::span<const std::byte> pieces[] = {payload};
        ASSERT_TRUE(tier.enqueue_write({chunks[c].key, kSlot, format, kChunk, kCols}, pieces));
      }
    };
    write(kFloat32, f32_tokens);
    for (size_t f = 0; f < 2; ++f) write(kFp8Formats[f], fp8_tokens[f]);
    tier.flush();
    ASSERT_EQ(tier.stats().writes_done, 6U);
  }
  Config config = device_store_config();
  config.local_disk = dir.root;
  HiddenStateStore store(config, db);
  ASSERT_TRUE(store.stats().device_path);
  ASSERT_EQ(store.stats().tiers.at(0).entries_held, 6U);

  // Float32: promoted, served bit-exact.
  const auto got = store.retrieve_hidden_states(f32_tokens);
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->rows(), 2 * kChunk);
  const auto expected = make_rows(f32_tokens, 0, kSlot.layer_idx, kCols);
  EXPECT_EQ(std::memcmp(got->data(), expected.data(), got->bytes()), 0);
  TierStats s = store.stats().tiers.at(0);
  EXPECT_EQ(s.hits, 2U);
  EXPECT_EQ(s.promotions, 2U);
  EXPECT_EQ(store.num_entries(), 2U);

  // FP8 (each format): read and checked (a hit of the tier), not promoted, not served; asked
  // again, read again.
  uint64_t hits = 2;
  for (size_t f = 0; f < 2; ++f) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      EXPECT_FALSE(store.retrieve_hidden_states(fp8_tokens[f]).has_value()) << f;
      hits += 2;
      s = store.stats().tiers.at(0);
      EXPECT_EQ(s.hits, hits) << f;
      EXPECT_EQ(s.misses, 0U) << f;
      EXPECT_EQ(s.corrupt_values, 0U) << f;
      EXPECT_EQ(s.promotions, 2U) << f;
      EXPECT_EQ(store.num_entries(), 2U) << f;
    }
    EXPECT_EQ(store.coverage(db.process_tokens(fp8_tokens[f]), std::vector<Slot>{kSlot}), 0) << f;
  }
  EXPECT_EQ(s.entries_held, 6U);  // the files stay: another store may take them
  store.check_invariants();
}

/// An export of `chunks` (one slot) whose entries name `format` and point at `payloads`.
ChunkExport export_of(RowFormat format, const std::vector<std::vector<std::byte>>& payloads) {
  ChunkExport source;
  source.lease_id = 1;
  source.chunks = static_cast<uint32_t>(payloads.size());
  source.prefix_tokens = static_cast<int64_t>(payloads.size()) * kChunk;
  source.lease_ms = 5000;
  for (size_t c = 0; c < payloads.size(); ++c) {
    ExportedEntry e;
    e.chunk = static_cast<uint32_t>(c);
    e.slot = kSlot;
    const std::span<const std::byte> pieces[] = {payloads[c]};
    detail::RemoteHeader header{format, kChunk, kCols, detail::hash_pieces(pieces), 0};
    detail::encode_remote_header(header, e.header);
    e.extents.push_back({reinterpret_cast<uint64_t>(payloads[c].data()), payloads[c].size()});
    source.entries.push_back(std::move(e));
  }
  return source;
}

TEST_F(CudaPathFp8, AnFp8ImportIsInvalidArgumentWithNothingChangedAFloat32OneIsTaken) {
  ChunkedTokenDatabase db(kChunk, false);
  test::TransferSide consumer(device_store_config(), db);
  ASSERT_TRUE(consumer.store.stats().device_path);
  const auto tokens = make_tokens(2 * kChunk, 84);
  const auto chunks = db.process_tokens(tokens);
  const auto before = consumer.store.stats();
  for (const RowFormat format : kFp8Formats) {
    const std::vector<std::vector<std::byte>> payloads = {payload_of(format, tokens, 0),
                                                          payload_of(format, tokens, 1)};
    const ChunkExport fp8 = export_of(format, payloads);
    try {
      (void)consumer.transfer.reserve(chunks, fp8);
      ADD_FAILURE() << "an FP8 import was reserved on the CUDA path";
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("source.entries[0]"), std::string::npos) << message;
      EXPECT_NE(message.find(detail::row_format_name(format)), std::string::npos) << message;
      EXPECT_NE(message.find("CUDA path"), std::string::npos) << message;
    }
    const auto after = consumer.store.stats();
    EXPECT_EQ(after.pool_free_bytes, before.pool_free_bytes);
    EXPECT_EQ(after.transfer.reserved_entries, before.transfer.reserved_entries);
    EXPECT_EQ(after.transfer.imported_entries, before.transfer.imported_entries);
    EXPECT_EQ(consumer.store.num_entries(), 0U);
  }

  // The same export as float32 rows: reserved, copied in, published, served bit-exact.
  const std::vector<std::vector<std::byte>> payloads = {payload_of(kFloat32, tokens, 0),
                                                        payload_of(kFloat32, tokens, 1)};
  const ChunkExport f32 = export_of(kFloat32, payloads);
  Reservation reservation = consumer.transfer.reserve(chunks, f32);
  ASSERT_EQ(reservation.entries().size(), 2U);
  for (const TransferPiece& p : transfer_pieces(f32, reservation)) {
    std::memcpy(reinterpret_cast<void*>(p.local_addr), reinterpret_cast<const void*>(p.remote_addr),
                p.bytes);
  }
  EXPECT_EQ(reservation.publish().published, 2U);
  const auto got = consumer.store.retrieve_hidden_states(tokens);
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->rows(), 2 * kChunk);
  const auto expected = make_rows(tokens, 0, kSlot.layer_idx, kCols);
  EXPECT_EQ(std::memcmp(got->data(), expected.data(), got->bytes()), 0);
  consumer.store.check_invariants();
}

}  // namespace
}  // namespace hss
