// FP8 rows in the value codec (src/format/value_codec.hpp): wire codes 3 and 4 name fp8_e4m3 /
// fp8_e5m2 codes with float32 per-row scales in a trailing block (row_format.hpp); such a value
// round-trips bit for bit, its size counts the scales, the old codes decode as before, and a code
// no build writes is a bad header, never served.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "format/dtype_codes.hpp"
#include "format/row_format.hpp"
#include "format/value_codec.hpp"
#include "hss/error.hpp"

namespace hss::detail {
namespace {

using kernels::ElemType;

std::span<const std::byte> as_span(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return out;
}

TEST(Fp8Codec, FormatsHaveFixedWireCodesBothWays) {
  const RowFormat e4m3 = RowFormat::of(ElemType::kFp8E4M3);
  const RowFormat e5m2 = RowFormat::of(ElemType::kFp8E5M2);
  EXPECT_EQ(e4m3.scales, ScaleLayout::kRowF32Trailing);
  EXPECT_EQ(wire_code(e4m3), std::optional<uint8_t>(3));
  EXPECT_EQ(wire_code(e5m2), std::optional<uint8_t>(4));
  EXPECT_EQ(row_format_from_wire(3), e4m3);
  EXPECT_EQ(row_format_from_wire(4), e5m2);
  // The codes before FP8 mean what they meant.
  EXPECT_EQ(row_format_from_wire(0), RowFormat{});
  EXPECT_EQ(row_format_from_wire(1), RowFormat::of(ElemType::kFloat16));
  EXPECT_EQ(row_format_from_wire(2), RowFormat::of(ElemType::kBFloat16));
  EXPECT_EQ(wire_code(to_row_format(DType::kBFloat16)), std::optional<uint8_t>(2));
  // A combination no store writes has no code.
  EXPECT_FALSE(wire_code(RowFormat{ElemType::kFp8E4M3, ScaleLayout::kNone}).has_value());
  EXPECT_FALSE(wire_code(RowFormat{ElemType::kFloat32, ScaleLayout::kRowF32Trailing}).has_value());
  for (int code = 5; code < 256; ++code) {
    EXPECT_FALSE(row_format_from_wire(static_cast<uint8_t>(code)).has_value()) << code;
  }
}

TEST(Fp8Codec, PayloadBytesCountTheAlignedCodesAndTheScales) {
  const RowFormat e4m3 = RowFormat::of(ElemType::kFp8E4M3);
  EXPECT_EQ(remote_payload_bytes(e4m3, 16, 32), 512u + 64u);
  EXPECT_EQ(remote_payload_bytes(e4m3, 3, 5), 16u + 12u);  // 15 codes padded to 16
  EXPECT_EQ(remote_payload_bytes(e4m3, 1, 1), 16u + 4u);
  EXPECT_THROW((void)remote_payload_bytes(e4m3, -1, 4), InvalidArgument);
  EXPECT_THROW((void)remote_payload_bytes(RowFormat{ElemType::kFp8E5M2, ScaleLayout::kNone}, 1, 4),
               InvalidArgument);
}

TEST(Fp8Codec, ValueRoundTripsCodesAndScalesBitForBit) {
  for (const ElemType elem : {ElemType::kFp8E4M3, ElemType::kFp8E5M2}) {
    const RowFormat format = RowFormat::of(elem);
    const int64_t rows = 3, cols = 5;
    const auto payload = pattern(format.payload_bytes(rows, cols), 9);
    const std::span<const std::byte> whole(payload);
    const std::vector<std::span<const std::byte>> pieces = {whole.first(7), whole.subspan(7)};
    const std::string value = encode_remote_value(format, rows, cols, pieces);
    ASSERT_EQ(value.size(), kRemoteHeaderBytes + 28u);
    EXPECT_EQ(static_cast<uint8_t>(value[6]), *wire_code(format));

    const DecodedValue d = decode_remote_value(as_span(value), rows, cols);
    ASSERT_EQ(d.status, DecodeStatus::kOk) << to_string(d.status);
    EXPECT_EQ(d.header.format, format);
    EXPECT_EQ(d.header.rows, rows);
    EXPECT_EQ(d.header.cols, cols);
    ASSERT_EQ(d.payload.size(), payload.size());
    EXPECT_EQ(std::memcmp(d.payload.data(), payload.data(), payload.size()), 0);

    // The header alone (the P/D export carries it) decodes to the same format.
    const auto header = decode_remote_header(as_span(value));
    ASSERT_TRUE(header.has_value());
    EXPECT_EQ(header->format, format);

    // The codes without their scales, or with a scale too many, are never a value.
    EXPECT_EQ(decode_remote_value(as_span(value.substr(0, value.size() - 4)), rows, cols).status,
              DecodeStatus::kTruncated);
    EXPECT_EQ(decode_remote_value(as_span(value + "abcd"), rows, cols).status,
              DecodeStatus::kOverlong);
    // A flipped scale byte fails the checksum.
    std::string flipped = value;
    flipped[value.size() - 1] = static_cast<char>(flipped[value.size() - 1] ^ 0x01);
    EXPECT_EQ(decode_remote_value(as_span(flipped), rows, cols).status, DecodeStatus::kBadChecksum);
  }
}

TEST(Fp8Codec, AnUnknownFormatCodeIsABadHeaderNeverAValue) {
  const RowFormat format = RowFormat::of(ElemType::kFp8E4M3);
  const auto payload = pattern(format.payload_bytes(16, 32), 1);
  const std::vector<std::span<const std::byte>> pieces = {std::span<const std::byte>(payload)};
  const std::string good = encode_remote_value(format, 16, 32, pieces);
  for (const int code : {5, 6, 9, 0x83, 255}) {
    std::string bad = good;
    bad[6] = static_cast<char>(code);
    const DecodedValue d = decode_remote_value(as_span(bad), 16, 32);
    EXPECT_EQ(d.status, DecodeStatus::kBadHeader) << code;
    EXPECT_TRUE(d.payload.empty()) << code;
    EXPECT_FALSE(decode_remote_header(as_span(bad)).has_value()) << code;
  }
  // The size of a float32 value of this shape: the FP8 payload is truncated for it.
  std::string as_f32 = good;
  as_f32[6] = 0;
  EXPECT_EQ(decode_remote_value(as_span(as_f32), 16, 32).status, DecodeStatus::kTruncated);
  // A header naming a format without a wire code is refused when it is written.
  std::array<std::byte, kRemoteHeaderBytes> bytes{};
  EXPECT_THROW(encode_remote_header(
                   RemoteHeader{RowFormat{ElemType::kFp8E4M3, ScaleLayout::kNone}, 1, 1, 0}, bytes),
               InvalidArgument);
}

TEST(Fp8Codec, WithAMacTheFormatCodeIsBoundToTheValue) {
  if (!value_mac_available()) GTEST_SKIP() << "built without OpenSSL";
  // e4m3 and e5m2 payloads of one shape have one size: only the MAC (over the header) tells a
  // relabelled value. Without a key the checksum covers the payload alone.
  const ValueMac mac("0123456789abcdef-fp8");
  const RowFormat format = RowFormat::of(ElemType::kFp8E4M3);
  const auto payload = pattern(format.payload_bytes(4, 8), 2);
  const std::vector<std::span<const std::byte>> pieces = {std::span<const std::byte>(payload)};
  const std::string value = encode_remote_value(format, 4, 8, pieces, &mac, "hss:v1:k:hidden:0");
  ASSERT_EQ(decode_remote_value(as_span(value), 4, 8, &mac, "hss:v1:k:hidden:0").status,
            DecodeStatus::kOk);
  std::string relabelled = value;
  relabelled[6] = 4;
  EXPECT_EQ(decode_remote_value(as_span(relabelled), 4, 8, &mac, "hss:v1:k:hidden:0").status,
            DecodeStatus::kUnauthenticated);
}

}  // namespace
}  // namespace hss::detail
