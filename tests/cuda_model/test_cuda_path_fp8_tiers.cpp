// A store with the CUDA device path takes FP8 (scaled) entries from outside, as the host path
// does, since its kernels dequantise them (hss/kernels/fp8_tiling.hpp): an FP8 value a backing
// tier returns is promoted and served, and an FP8 entry offered by a P/D export is reserved,
// copied in, published and served. Each beside the same values as float32.
//
// The FP8 values are written as a writer would: the disk tier's own enqueue_write, and export
// entries encoded with the value codec's header. Codes 0x38 with row scales of 1: E4M3 0x38 is
// 1.0, E5M2 0x38 is 0.5.

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

TEST_F(CudaPathFp8, AScaledValueFromATierIsPromotedAndServedAsAFloat32OneIs) {
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

  // FP8 (each format): promoted, served dequantised, from the host and into device memory.
  uint64_t promotions = 2;
  for (size_t f = 0; f < 2; ++f) {
    const float want = f == 0 ? 1.0f : 0.5f;
    const auto fp8 = store.retrieve_hidden_states(fp8_tokens[f]);
    ASSERT_TRUE(fp8.has_value()) << f;
    ASSERT_EQ(fp8->rows(), 2 * kChunk) << f;
    for (int64_t i = 0; i < 2 * kChunk * kCols; ++i) ASSERT_EQ(fp8->data()[i], want) << f << i;
    promotions += 2;
    s = store.stats().tiers.at(0);
    EXPECT_EQ(s.promotions, promotions) << f;
    EXPECT_EQ(s.corrupt_values, 0U) << f;
    EXPECT_EQ(store.num_entries(), promotions) << f;
    EXPECT_EQ(store.coverage(db.process_tokens(fp8_tokens[f]), std::vector<Slot>{kSlot}),
              2 * kChunk)
        << f;
    test::DeviceBytes out(static_cast<size_t>(2 * kChunk * kCols) * 4);
    const MutableTensorView view{out.ptr, DType::kFloat32, 2 * kChunk, kCols, kCols,
                                 Device::kCuda, 0};
    ASSERT_EQ(store.retrieve_hidden_states_into(fp8_tokens[f], view), 2 * kChunk) << f;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto bytes = test::download(out.ptr, out.bytes);
    std::vector<float> values(static_cast<size_t>(2 * kChunk * kCols));
    std::memcpy(values.data(), bytes.data(), bytes.size());
    for (const float v : values) ASSERT_EQ(v, want) << f;
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

/// Reserves `source` on `consumer`, copies its pieces in and publishes: the entries published.
size_t import_all(test::TransferSide& consumer, std::span<const Chunk> chunks,
                  const ChunkExport& source) {
  Reservation reservation = consumer.transfer.reserve(chunks, source);
  EXPECT_EQ(reservation.entries().size(), source.entries.size());
  for (const TransferPiece& p : transfer_pieces(source, reservation)) {
    std::memcpy(reinterpret_cast<void*>(p.local_addr), reinterpret_cast<const void*>(p.remote_addr),
                p.bytes);
  }
  return reservation.publish().published;
}

TEST_F(CudaPathFp8, AnFp8ImportIsTakenAndServedAsAFloat32OneIs) {
  ChunkedTokenDatabase db(kChunk, false);
  for (size_t f = 0; f < 2; ++f) {
    test::TransferSide consumer(device_store_config(), db);
    ASSERT_TRUE(consumer.store.stats().device_path);
    const auto tokens = make_tokens(2 * kChunk, 84 + f);
    const auto chunks = db.process_tokens(tokens);
    const RowFormat format = kFp8Formats[f];
    const std::vector<std::vector<std::byte>> payloads = {payload_of(format, tokens, 0),
                                                          payload_of(format, tokens, 1)};
    EXPECT_EQ(import_all(consumer, chunks, export_of(format, payloads)), 2U) << f;
    const auto got = consumer.store.retrieve_hidden_states(tokens);
    ASSERT_TRUE(got.has_value()) << f;
    ASSERT_EQ(got->rows(), 2 * kChunk);
    const float want = f == 0 ? 1.0f : 0.5f;
    for (int64_t i = 0; i < 2 * kChunk * kCols; ++i) ASSERT_EQ(got->data()[i], want) << f << i;
    consumer.store.check_invariants();
  }

  // The same export as float32 rows: reserved, copied in, published, served bit-exact.
  test::TransferSide consumer(device_store_config(), db);
  const auto tokens = make_tokens(2 * kChunk, 86);
  const auto chunks = db.process_tokens(tokens);
  const std::vector<std::vector<std::byte>> payloads = {payload_of(kFloat32, tokens, 0),
                                                        payload_of(kFloat32, tokens, 1)};
  EXPECT_EQ(import_all(consumer, chunks, export_of(kFloat32, payloads)), 2U);
  const auto got = consumer.store.retrieve_hidden_states(tokens);
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(got->rows(), 2 * kChunk);
  const auto expected = make_rows(tokens, 0, kSlot.layer_idx, kCols);
  EXPECT_EQ(std::memcmp(got->data(), expected.data(), got->bytes()), 0);
  consumer.store.check_invariants();
}

}  // namespace
}  // namespace hss
