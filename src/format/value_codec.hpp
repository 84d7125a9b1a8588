#pragma once
// The byte format of one hidden-state value in a backing tier (a Redis value, a disk tier's file,
// the same bytes), and the value's key (the Redis key; what a MAC binds a value to in every
// tier). Pure functions, no I/O: safe from any thread. The format is on disk and on servers:
// changing a byte of it needs a new version (kTierFormatVersion, kValueKeyPrefix).
//
// Value = 32-byte header + payload (rows x cols in the entry's row format, row-major, as the
// pool holds it: for FP8 the codes, then the float32 row scales in a trailing block,
// row_format.hpp):
//   offset  0: magic "HSSR"            offset 16: cols (int64)
//   offset  4: format version (u16)    offset 24: xxHash3-64 of the payload (u64)
//   offset  6: row format (u8 wire code, format/dtype_codes.hpp: 0 float32, 1 float16,
//              2 bfloat16, 3 fp8_e4m3 + f32 trailing scales, 4 fp8_e5m2 + f32 trailing scales)
//   offset  7: flags (u8): bit 0 = a 32-byte keyed MAC follows the header (src/format/value_mac.hpp);
//              other bits 0
//   offset  8: rows (int64)
// With the MAC flag the value is header + MAC + payload. All integers little-endian. A value that
// fails any check is never returned: decoding reports why (a foreign value, another version, a
// truncated or over-long one, another shape, a bad checksum, a missing or bad MAC when the reader
// has a key), and the tier counts it as a miss. A reader without a key ignores a MAC.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "hss/cache_key.hpp"
#include "hss/tensor.hpp"
#include "format/row_format.hpp"
#include "format/value_mac.hpp"

namespace hss::detail {

inline constexpr size_t kTierHeaderBytes = 32;
inline constexpr uint16_t kTierFormatVersion = 1;
/// Header flag: a keyed MAC (kMacBytes) follows the header.
inline constexpr uint8_t kTierFlagMac = 1;
/// Every key of this format starts with this, so a format change never reads old values.
inline constexpr std::string_view kValueKeyPrefix = "hss:v1:";

/// "hss:v1:<CacheEngineKey::to_string()>:<kind>:<layer>": the Redis tier's key, and the name
/// every tier's MAC binds a value to.
[[nodiscard]] std::string value_key(const CacheEngineKey& key, std::string_view kind,
                                     int64_t layer);

struct TierHeader {
  RowFormat format;  ///< how the payload's rows are encoded (float32 unscaled by default)
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t payload_hash = 0;
  uint8_t flags = 0;  ///< kTierFlagMac when a MAC follows
};

/// "bfloat16", "fp8_e4m3 + float32 row scales": for messages.
[[nodiscard]] std::string row_format_name(RowFormat format);

/// Payload bytes of a rows x cols chunk; throws InvalidArgument on negative sizes or overflow.
[[nodiscard]] size_t tier_payload_bytes(RowFormat format, int64_t rows, int64_t cols);
[[nodiscard]] size_t tier_payload_bytes(DType dtype, int64_t rows, int64_t cols);

/// xxHash3-64 (no seed) of the concatenation of `pieces`.
[[nodiscard]] uint64_t hash_pieces(std::span<const std::span<const std::byte>> pieces);

/// Writes the header into the first kTierHeaderBytes of `out`.
void encode_tier_header(const TierHeader& header, std::span<std::byte, kTierHeaderBytes> out);

/// Reads a header (no MAC or payload checks): nullopt unless magic, version, row format code,
/// flags and a non-negative shape are valid.
[[nodiscard]] std::optional<TierHeader> decode_tier_header(std::span<const std::byte> bytes);

/// Header + payload as one value (header + MAC + payload with `mac`, the MAC taken over `name`,
/// the value's value_key). The pieces' total size must match the shape (InvalidArgument).
[[nodiscard]] std::string encode_tier_value(RowFormat format, int64_t rows, int64_t cols,
                                              std::span<const std::span<const std::byte>> pieces,
                                              const ValueMac* mac = nullptr,
                                              std::string_view name = {});
/// The same for an unscaled DType's rows.
[[nodiscard]] std::string encode_tier_value(DType dtype, int64_t rows, int64_t cols,
                                              std::span<const std::span<const std::byte>> pieces,
                                              const ValueMac* mac = nullptr,
                                              std::string_view name = {});

enum class DecodeStatus {
  kOk,
  kForeign,             ///< too short for a header, or no magic: not ours
  kUnsupportedVersion,  ///< ours, another format version
  kBadHeader,           ///< unknown row format code, negative or overflowing shape
  kWrongShape,          ///< not the rows/cols the caller expects
  kTruncated,           ///< fewer payload bytes than the header's shape needs
  kOverlong,            ///< more payload bytes than the header's shape needs
  kBadChecksum,         ///< payload does not hash to the header's checksum
  kUnauthenticated,     ///< the reader has a MAC key and the value's MAC is missing or wrong
};
[[nodiscard]] std::string_view to_string(DecodeStatus status);

struct DecodedValue {
  DecodeStatus status = DecodeStatus::kForeign;
  TierHeader header;
  std::span<const std::byte> payload;  ///< points into the decoded value
};

/// Checks and splits a value. expected_rows/expected_cols of 0 accept any. With `mac`, the value
/// must carry a MAC that verifies over `name` (its value_key), else kUnauthenticated.
[[nodiscard]] DecodedValue decode_tier_value(std::span<const std::byte> value,
                                               int64_t expected_rows, int64_t expected_cols,
                                               const ValueMac* mac = nullptr,
                                               std::string_view name = {});

// The names the Redis tier's code and tests grew up with (the format was the remote tier's first).
using RemoteHeader = TierHeader;
inline constexpr size_t kRemoteHeaderBytes = kTierHeaderBytes;
inline constexpr uint16_t kRemoteFormatVersion = kTierFormatVersion;
inline constexpr uint8_t kRemoteFlagMac = kTierFlagMac;
inline constexpr std::string_view kRemoteKeyPrefix = kValueKeyPrefix;
[[nodiscard]] inline std::string remote_key(const CacheEngineKey& key, std::string_view kind,
                                            int64_t layer) {
  return value_key(key, kind, layer);
}
[[nodiscard]] inline size_t remote_payload_bytes(RowFormat format, int64_t rows, int64_t cols) {
  return tier_payload_bytes(format, rows, cols);
}
[[nodiscard]] inline size_t remote_payload_bytes(DType dtype, int64_t rows, int64_t cols) {
  return tier_payload_bytes(dtype, rows, cols);
}
inline void encode_remote_header(const TierHeader& header,
                                 std::span<std::byte, kTierHeaderBytes> out) {
  encode_tier_header(header, out);
}
[[nodiscard]] inline std::optional<TierHeader> decode_remote_header(
    std::span<const std::byte> bytes) {
  return decode_tier_header(bytes);
}
[[nodiscard]] inline std::string encode_remote_value(
    RowFormat format, int64_t rows, int64_t cols,
    std::span<const std::span<const std::byte>> pieces, const ValueMac* mac = nullptr,
    std::string_view name = {}) {
  return encode_tier_value(format, rows, cols, pieces, mac, name);
}
[[nodiscard]] inline std::string encode_remote_value(
    DType dtype, int64_t rows, int64_t cols, std::span<const std::span<const std::byte>> pieces,
    const ValueMac* mac = nullptr, std::string_view name = {}) {
  return encode_tier_value(dtype, rows, cols, pieces, mac, name);
}
[[nodiscard]] inline DecodedValue decode_remote_value(std::span<const std::byte> value,
                                                      int64_t expected_rows,
                                                      int64_t expected_cols,
                                                      const ValueMac* mac = nullptr,
                                                      std::string_view name = {}) {
  return decode_tier_value(value, expected_rows, expected_cols, mac, name);
}

}  // namespace hss::detail
