#pragma once
// hss::detail::ValueMac: a keyed MAC (HMAC-SHA256, OpenSSL) over a hidden-state value, for both
// remote paths (the Redis/Valkey tier and the one-sided pool transfer). The xxHash3 of the
// remote-codec header catches corruption; it does not stop a writer who can reach the server (or
// the producer's control socket) from forging a value that passes. With a key configured
// (hidden_state_mac_key or hidden_state_mac_key_file), a consumer serves only values whose MAC it
// can verify, and one that fails is a counted miss.
//
// What the MAC covers (docs/design.md, "Authenticated values"): the value's remote key
// ("hss:v1:<chunk key>:<kind>:<layer>", so a value cannot be replayed under another chunk or
// layer), its 32-byte header (shape, dtype, xxHash3) and its payload:
//   HMAC-SHA256(key, u32le(len(name)) || name || header || payload)
//
// Optional at build time, like hiredis: without OpenSSL (libcrypto) the MAC is compiled out and a
// configured key is a ConfigError when a store or tier is built from the config, never a silent
// fallback to unauthenticated values.
//
// Thread safety: a ValueMac is immutable; compute() and verify() may run on many threads at once
// (each call uses its own OpenSSL context). Neither blocks on anything but the CPU.

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "hss/config.hpp"

namespace hss::detail {

inline constexpr size_t kMacBytes = 32;
using Mac = std::array<std::byte, kMacBytes>;
/// Shortest key accepted (bytes): 128 bits.
inline constexpr size_t kMinMacKeyBytes = 16;

class ValueMac {
 public:
  /// The key the config names, or nullptr when it names none. ConfigError when the build has no
  /// OpenSSL, the key file cannot be read, or the key is shorter than kMinMacKeyBytes (a key
  /// file's one trailing newline is not part of the key).
  [[nodiscard]] static std::shared_ptr<const ValueMac> from_config(const Config& config);

  /// A MAC with this key (at least kMinMacKeyBytes; InvalidArgument otherwise, ConfigError
  /// without OpenSSL).
  explicit ValueMac(std::string key);
  ~ValueMac();
  ValueMac(const ValueMac&) = delete;
  ValueMac& operator=(const ValueMac&) = delete;

  [[nodiscard]] Mac compute(std::string_view name, std::span<const std::byte> header,
                            std::span<const std::span<const std::byte>> payload) const;
  /// compute() == mac, compared in constant time.
  [[nodiscard]] bool verify(std::string_view name, std::span<const std::byte> header,
                            std::span<const std::span<const std::byte>> payload,
                            const Mac& mac) const;

 private:
  std::string key_;
};

/// True when this build has the MAC (OpenSSL was found).
[[nodiscard]] bool value_mac_available();

}  // namespace hss::detail
