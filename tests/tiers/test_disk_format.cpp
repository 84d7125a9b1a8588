// The disk tier's files keep the value codec's format (format/value_codec.hpp) now that the tier
// writes through the shared write-behind queue and the codec's names are neutral: a file made by
// the codec under its older names (RemoteHeader, remote_key as the MAC's name) is served bit
// exact, and a file the tier writes decodes under those names (magic "HSSR", MAC over the key
// "hss:v1:..."), so directories written before read on.

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "format/dtype_codes.hpp"
#include "format/value_codec.hpp"
#include "format/value_mac.hpp"
#include "tier_test_dir.hpp"
#include "tiers/disk/disk_tier.hpp"

namespace hss {
namespace {

using detail::DiskTier;
using detail::DiskTierOptions;

constexpr int64_t kRows = 4;
constexpr int64_t kCols = 8;
constexpr size_t kBytes = kRows * kCols * 4;  // one float32 value
const char* const kMacKey = "0123456789abcdef-format";

CacheEngineKey key_of(uint64_t hash) {
  CacheEngineKey key;
  key.model_name = "model";
  key.chunk_hash = hash;
  return key;
}

std::vector<std::byte> payload() {
  std::vector<std::byte> bytes(kBytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 7 + 1);
  return bytes;
}

DiskTierOptions options(const std::string& dir) {
  DiskTierOptions o;
  o.dir = dir;
  o.budget_bytes = 1 << 20;
  o.queue_bytes = 1 << 20;
  if (detail::value_mac_available()) o.mac = std::make_shared<detail::ValueMac>(kMacKey);
  return o;
}

TEST(DiskFormat, AFileMadeByTheCodecUnderItsOlderNamesIsServedBitExact) {
  const test::TempDir dir;
  const Slot slot{ActivationKind::kHidden, 3};
  const CacheEngineKey key = key_of(11);
  const DiskTierOptions o = options(dir.root);
  const std::vector<std::byte> bytes = payload();
  const std::span<const std::byte> pieces[] = {bytes};
  const std::string value = detail::encode_remote_value(
      DType::kFloat32, kRows, kCols, pieces, o.mac.get(),
      detail::remote_key(key, to_string(slot.kind), slot.layer_idx));
  {
    std::ofstream out(dir.root + "/" + DiskTier::file_name(key, slot), std::ios::binary);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
  }
  DiskTier tier(o);  // the restart scan indexes the file
  const detail::TierRequest request{key, slot, kRows, kCols};
  std::vector<std::byte> got;
  tier.fetch_each(std::span(&request, 1), [&](size_t, const detail::TierValue& v) {
    got.assign(v.payload.begin(), v.payload.end());
  });
  EXPECT_EQ(got, bytes);
  EXPECT_EQ(tier.stats().hits, 1U);
}

TEST(DiskFormat, AFileTheTierWritesDecodesUnderTheCodecsOlderNames) {
  const test::TempDir dir;
  const Slot slot{ActivationKind::kHidden, 2};
  const CacheEngineKey key = key_of(12);
  const DiskTierOptions o = options(dir.root);
  const std::vector<std::byte> bytes = payload();
  const std::span<const std::byte> pieces[] = {bytes};
  {
    DiskTier tier(o);
    detail::TierWrite w;
    w.key = key;
    w.slot = slot;
    w.format = detail::to_row_format(DType::kFloat32);
    w.rows = kRows;
    w.cols = kCols;
    ASSERT_TRUE(tier.enqueue_write(w, pieces));
    tier.flush();
  }
  std::ifstream in(dir.root + "/" + DiskTier::file_name(key, slot), std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(file.size(), detail::kRemoteHeaderBytes);
  EXPECT_EQ(file.substr(0, 4), "HSSR");
  const detail::DecodedValue decoded = detail::decode_remote_value(
      std::as_bytes(std::span(file.data(), file.size())), kRows, kCols, o.mac.get(),
      detail::remote_key(key, to_string(slot.kind), slot.layer_idx));
  ASSERT_EQ(decoded.status, detail::DecodeStatus::kOk);
  EXPECT_TRUE(std::equal(decoded.payload.begin(), decoded.payload.end(), bytes.begin(),
                         bytes.end()));
  EXPECT_EQ(detail::remote_key(key, "hidden", 2).substr(0, 7), "hss:v1:");
}

}  // namespace
}  // namespace hss
