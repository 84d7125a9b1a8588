#include "format/value_codec.hpp"

#include <xxhash.h>

#include <bit>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>

#include "format/dtype_codes.hpp"
#include "hss/error.hpp"

namespace hss::detail {
namespace {

constexpr std::array<std::byte, 4> kMagic = {std::byte{'H'}, std::byte{'S'}, std::byte{'S'},
                                             std::byte{'R'}};

template <typename Int>
void put_le(std::byte* out, Int value) {
  using U = std::make_unsigned_t<Int>;
  auto bits = static_cast<U>(value);
  for (size_t i = 0; i < sizeof(U); ++i) {
    out[i] = static_cast<std::byte>(bits & 0xffU);
    bits = static_cast<U>(bits >> 8);
  }
}

template <typename Int>
Int get_le(const std::byte* in) {
  using U = std::make_unsigned_t<Int>;
  U bits = 0;
  for (size_t i = sizeof(U); i-- > 0;) bits = static_cast<U>((bits << 8) | static_cast<U>(in[i]));
  return static_cast<Int>(bits);
}

// Payload bytes, or nothing when the shape is negative, the format has no wire code or the
// value would not fit a size_t.
std::optional<size_t> checked_payload_bytes(RowFormat format, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0 || !wire_code(format)) return std::nullopt;
  const std::optional<uint64_t> bytes = format.checked_payload_bytes(rows, cols);
  constexpr uint64_t kMax = std::numeric_limits<size_t>::max() - kTierHeaderBytes - kMacBytes;
  if (!bytes || *bytes > kMax) return std::nullopt;
  return static_cast<size_t>(*bytes);
}

struct Xxh3StateDeleter {
  void operator()(XXH3_state_t* state) const { (void)XXH3_freeState(state); }
};

}  // namespace

std::string row_format_name(RowFormat format) {
  std::string name;
  switch (format.elem) {
    case kernels::ElemType::kFloat32:
      name = "float32";
      break;
    case kernels::ElemType::kFloat16:
      name = "float16";
      break;
    case kernels::ElemType::kBFloat16:
      name = "bfloat16";
      break;
    case kernels::ElemType::kFp8E4M3:
      name = "fp8_e4m3";
      break;
    case kernels::ElemType::kFp8E5M2:
      name = "fp8_e5m2";
      break;
  }
  if (format.scales == ScaleLayout::kRowF32Trailing) name += " + float32 row scales";
  return name;
}

std::string value_key(const CacheEngineKey& key, std::string_view kind, int64_t layer) {
  std::string out(kValueKeyPrefix);
  out += key.to_string();
  out += ':';
  out += kind;
  out += ':';
  out += std::to_string(layer);
  return out;
}

size_t tier_payload_bytes(DType dtype, int64_t rows, int64_t cols) {
  return tier_payload_bytes(to_row_format(dtype), rows, cols);
}

size_t tier_payload_bytes(RowFormat format, int64_t rows, int64_t cols) {
  const auto bytes = checked_payload_bytes(format, rows, cols);
  if (!bytes) {
    throw InvalidArgument("remote value shape rows = " + std::to_string(rows) +
                          ", cols = " + std::to_string(cols) + " is negative or too large");
  }
  return *bytes;
}

uint64_t hash_pieces(std::span<const std::span<const std::byte>> pieces) {
  if (pieces.size() == 1) return XXH3_64bits(pieces.front().data(), pieces.front().size());
  const std::unique_ptr<XXH3_state_t, Xxh3StateDeleter> state(XXH3_createState());
  if (!state || XXH3_64bits_reset(state.get()) != XXH_OK) throw Error("xxHash3 state failed");
  for (const auto piece : pieces) {
    if (XXH3_64bits_update(state.get(), piece.data(), piece.size()) != XXH_OK) {
      throw Error("xxHash3 update failed");
    }
  }
  return XXH3_64bits_digest(state.get());
}

void encode_tier_header(const TierHeader& header,
                          std::span<std::byte, kTierHeaderBytes> out) {
  std::memcpy(out.data(), kMagic.data(), kMagic.size());
  put_le<uint16_t>(out.data() + 4, kTierFormatVersion);
  const std::optional<uint8_t> code = wire_code(header.format);
  if (!code) {
    throw InvalidArgument("row format " + row_format_name(header.format) + " has no wire code");
  }
  out[6] = static_cast<std::byte>(*code);
  out[7] = static_cast<std::byte>(header.flags);
  put_le<int64_t>(out.data() + 8, header.rows);
  put_le<int64_t>(out.data() + 16, header.cols);
  put_le<uint64_t>(out.data() + 24, header.payload_hash);
}

std::optional<TierHeader> decode_tier_header(std::span<const std::byte> bytes) {
  if (bytes.size() < kTierHeaderBytes ||
      std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0 ||
      get_le<uint16_t>(bytes.data() + 4) != kTierFormatVersion) {
    return std::nullopt;
  }
  const auto format_code = static_cast<uint8_t>(bytes[6]);
  const auto flags = static_cast<uint8_t>(bytes[7]);
  TierHeader header;
  header.rows = get_le<int64_t>(bytes.data() + 8);
  header.cols = get_le<int64_t>(bytes.data() + 16);
  header.payload_hash = get_le<uint64_t>(bytes.data() + 24);
  header.flags = flags;
  const std::optional<RowFormat> format = row_format_from_wire(format_code);
  if (!format || (flags & ~kTierFlagMac) != 0) return std::nullopt;
  header.format = *format;
  if (!checked_payload_bytes(header.format, header.rows, header.cols) || header.cols == 0) {
    return std::nullopt;
  }
  return header;
}

std::string encode_tier_value(DType dtype, int64_t rows, int64_t cols,
                                std::span<const std::span<const std::byte>> pieces,
                                const ValueMac* mac, std::string_view name) {
  return encode_tier_value(to_row_format(dtype), rows, cols, pieces, mac, name);
}

std::string encode_tier_value(RowFormat format, int64_t rows, int64_t cols,
                                std::span<const std::span<const std::byte>> pieces,
                                const ValueMac* mac, std::string_view name) {
  const size_t payload = tier_payload_bytes(format, rows, cols);
  size_t given = 0;
  for (const auto piece : pieces) given += piece.size();
  if (given != payload) {
    throw InvalidArgument("remote payload has " + std::to_string(given) + " bytes but rows = " +
                          std::to_string(rows) + ", cols = " + std::to_string(cols) + " of " +
                          row_format_name(format) + " need " + std::to_string(payload));
  }
  const size_t body_at = kTierHeaderBytes + (mac != nullptr ? kMacBytes : 0);
  std::string value(body_at + payload, '\0');
  auto* bytes = reinterpret_cast<std::byte*>(value.data());
  size_t at = body_at;
  for (const auto piece : pieces) {
    if (!piece.empty()) std::memcpy(bytes + at, piece.data(), piece.size());
    at += piece.size();
  }
  const TierHeader header{format, rows, cols, XXH3_64bits(bytes + body_at, payload),
                            mac != nullptr ? kTierFlagMac : uint8_t{0}};
  encode_tier_header(header, std::span<std::byte, kTierHeaderBytes>(bytes, kTierHeaderBytes));
  if (mac != nullptr) {
    const std::span<const std::byte> body(bytes + body_at, payload);
    const Mac tag = mac->compute(name, std::span<const std::byte>(bytes, kTierHeaderBytes),
                                 std::span<const std::span<const std::byte>>(&body, 1));
    std::memcpy(bytes + kTierHeaderBytes, tag.data(), tag.size());
  }
  return value;
}

std::string_view to_string(DecodeStatus status) {
  switch (status) {
    case DecodeStatus::kOk:
      return "ok";
    case DecodeStatus::kForeign:
      return "foreign value";
    case DecodeStatus::kUnsupportedVersion:
      return "unsupported format version";
    case DecodeStatus::kBadHeader:
      return "bad header";
    case DecodeStatus::kWrongShape:
      return "wrong shape";
    case DecodeStatus::kTruncated:
      return "truncated";
    case DecodeStatus::kOverlong:
      return "over-long";
    case DecodeStatus::kBadChecksum:
      return "bad checksum";
    case DecodeStatus::kUnauthenticated:
      return "missing or bad MAC";
  }
  return "unknown";
}

DecodedValue decode_tier_value(std::span<const std::byte> value, int64_t expected_rows,
                                 int64_t expected_cols, const ValueMac* mac,
                                 std::string_view name) {
  DecodedValue out;
  if (value.size() < kTierHeaderBytes ||
      std::memcmp(value.data(), kMagic.data(), kMagic.size()) != 0) {
    out.status = DecodeStatus::kForeign;
    return out;
  }
  if (get_le<uint16_t>(value.data() + 4) != kTierFormatVersion) {
    out.status = DecodeStatus::kUnsupportedVersion;
    return out;
  }
  const auto format_code = static_cast<uint8_t>(value[6]);
  out.header.rows = get_le<int64_t>(value.data() + 8);
  out.header.cols = get_le<int64_t>(value.data() + 16);
  out.header.payload_hash = get_le<uint64_t>(value.data() + 24);
  const auto flags = static_cast<uint8_t>(value[7]);
  out.header.flags = flags;
  const std::optional<RowFormat> format = row_format_from_wire(format_code);
  if (!format || (flags & ~kTierFlagMac) != 0) {
    out.status = DecodeStatus::kBadHeader;
    return out;
  }
  out.header.format = *format;
  const auto payload = checked_payload_bytes(out.header.format, out.header.rows, out.header.cols);
  if (!payload || out.header.cols == 0) {
    out.status = DecodeStatus::kBadHeader;
    return out;
  }
  if ((expected_rows != 0 && out.header.rows != expected_rows) ||
      (expected_cols != 0 && out.header.cols != expected_cols)) {
    out.status = DecodeStatus::kWrongShape;
    return out;
  }
  const bool has_mac = (flags & kTierFlagMac) != 0;
  const size_t body_at = kTierHeaderBytes + (has_mac ? kMacBytes : 0);
  if (value.size() < body_at) {
    out.status = DecodeStatus::kTruncated;
    return out;
  }
  const size_t have = value.size() - body_at;
  if (have < *payload) {
    out.status = DecodeStatus::kTruncated;
    return out;
  }
  if (have > *payload) {
    out.status = DecodeStatus::kOverlong;
    return out;
  }
  const auto body = value.subspan(body_at);
  if (XXH3_64bits(body.data(), body.size()) != out.header.payload_hash) {
    out.status = DecodeStatus::kBadChecksum;
    return out;
  }
  if (mac != nullptr) {
    Mac tag{};
    if (has_mac) std::memcpy(tag.data(), value.data() + kTierHeaderBytes, tag.size());
    if (!has_mac || !mac->verify(name, value.first(kTierHeaderBytes),
                                 std::span<const std::span<const std::byte>>(&body, 1), tag)) {
      out.status = DecodeStatus::kUnauthenticated;
      return out;
    }
  }
  out.status = DecodeStatus::kOk;
  out.payload = body;
  return out;
}

}  // namespace hss::detail
