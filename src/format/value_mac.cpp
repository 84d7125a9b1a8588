#include "format/value_mac.hpp"

#include <string>

#include "hss/detail/file_reader.hpp"
#include "hss/error.hpp"

#if HSS_HAVE_MAC
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#endif

namespace hss::detail {
namespace {

std::string key_from_file(const std::string& file) {
  std::string key;  // one named result (NRVO): GCC 12 warns on the move of a second one
  try {
    key = read_regular_file(file, "MAC key file", 4096);
  } catch (const Error& e) {
    throw ConfigError(std::string("config key 'hidden_state_mac_key_file': ") + e.what());
  }
  if (!key.empty() && key.back() == '\n') key.pop_back();
  if (key.size() < kMinMacKeyBytes) {
    throw ConfigError("config key 'hidden_state_mac_key_file': the key in '" + file + "' has " +
                      std::to_string(key.size()) + " bytes, at least " +
                      std::to_string(kMinMacKeyBytes) + " are needed");
  }
  return key;
}

std::string key_from_config(const Config& config) {
  if (!config.hidden_state_mac_key_file.empty()) {
    return key_from_file(config.hidden_state_mac_key_file);
  }
  return config.hidden_state_mac_key;  // length checked by Config::validate
}

#if HSS_HAVE_MAC
std::string openssl_error() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "unknown OpenSSL error";
  std::string text(256, '\0');
  ERR_error_string_n(code, text.data(), text.size());
  text.resize(text.find('\0'));
  return text;
}

struct MacDeleter {
  void operator()(EVP_MAC* mac) const { EVP_MAC_free(mac); }
};
struct MacCtxDeleter {
  void operator()(EVP_MAC_CTX* ctx) const { EVP_MAC_CTX_free(ctx); }
};

// The HMAC algorithm, fetched once per process (EVP_MAC objects are shareable across threads).
EVP_MAC* hmac_algorithm() {
  static const std::unique_ptr<EVP_MAC, MacDeleter> mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr));
  if (!mac) throw Error("HMAC unavailable in OpenSSL: " + openssl_error());
  return mac.get();
}
#endif

}  // namespace

#if HSS_HAVE_MAC

bool value_mac_available() { return true; }

ValueMac::ValueMac(std::string key) : key_(std::move(key)) {
  if (key_.size() < kMinMacKeyBytes) {
    throw InvalidArgument("MAC key has " + std::to_string(key_.size()) + " bytes, at least " +
                          std::to_string(kMinMacKeyBytes) + " are needed");
  }
  (void)hmac_algorithm();
}

Mac ValueMac::compute(std::string_view name, std::span<const std::byte> header,
                      std::span<const std::span<const std::byte>> payload) const {
  const std::unique_ptr<EVP_MAC_CTX, MacCtxDeleter> ctx(EVP_MAC_CTX_new(hmac_algorithm()));
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_END};
  const auto* key = reinterpret_cast<const unsigned char*>(key_.data());
  if (!ctx || EVP_MAC_init(ctx.get(), key, key_.size(), params) != 1) {
    throw Error("HMAC-SHA256 init failed: " + openssl_error());
  }
  const auto update = [&](const void* data, size_t bytes) {
    if (bytes != 0 &&
        EVP_MAC_update(ctx.get(), static_cast<const unsigned char*>(data), bytes) != 1) {
      throw Error("HMAC-SHA256 update failed: " + openssl_error());
    }
  };
  const auto name_bytes = static_cast<uint32_t>(name.size());
  const std::array<unsigned char, 4> length = {
      static_cast<unsigned char>(name_bytes), static_cast<unsigned char>(name_bytes >> 8),
      static_cast<unsigned char>(name_bytes >> 16), static_cast<unsigned char>(name_bytes >> 24)};
  update(length.data(), length.size());
  update(name.data(), name.size());
  update(header.data(), header.size());
  for (const auto piece : payload) update(piece.data(), piece.size());
  Mac mac{};
  size_t written = 0;
  if (EVP_MAC_final(ctx.get(), reinterpret_cast<unsigned char*>(mac.data()), &written,
                    mac.size()) != 1 ||
      written != mac.size()) {
    throw Error("HMAC-SHA256 final failed: " + openssl_error());
  }
  return mac;
}

bool ValueMac::verify(std::string_view name, std::span<const std::byte> header,
                      std::span<const std::span<const std::byte>> payload, const Mac& mac) const {
  const Mac expected = compute(name, header, payload);
  return CRYPTO_memcmp(expected.data(), mac.data(), mac.size()) == 0;
}

#else  // !HSS_HAVE_MAC

bool value_mac_available() { return false; }

ValueMac::ValueMac(std::string key) : key_(std::move(key)) {
  throw ConfigError(
      "a MAC key is configured (hidden_state_mac_key / hidden_state_mac_key_file) but this build "
      "has no MAC: OpenSSL's libcrypto was not found when it was built (install libssl-dev and "
      "rebuild); refusing to run with unauthenticated values");
}

Mac ValueMac::compute(std::string_view, std::span<const std::byte>,
                      std::span<const std::span<const std::byte>>) const {
  throw Error("no MAC in this build");
}

bool ValueMac::verify(std::string_view, std::span<const std::byte>,
                      std::span<const std::span<const std::byte>>, const Mac&) const {
  throw Error("no MAC in this build");
}

#endif  // HSS_HAVE_MAC

ValueMac::~ValueMac() {
  // The key is a secret: do not leave it in freed memory.
  volatile char* p = key_.data();
  for (size_t i = 0; i < key_.size(); ++i) p[i] = 0;
}

std::shared_ptr<const ValueMac> ValueMac::from_config(const Config& config) {
  if (config.hidden_state_mac_key.empty() && config.hidden_state_mac_key_file.empty()) {
    return nullptr;
  }
  if (!value_mac_available()) {
    throw ConfigError(
        "config key '" +
        std::string(config.hidden_state_mac_key_file.empty() ? "hidden_state_mac_key"
                                                             : "hidden_state_mac_key_file") +
        "': this build has no MAC (OpenSSL's libcrypto was not found when it was built; install "
        "libssl-dev and rebuild); refusing to run with unauthenticated values");
  }
  try {
    return std::make_shared<const ValueMac>(key_from_config(config));
  } catch (const InvalidArgument& e) {
    throw ConfigError(std::string("config key 'hidden_state_mac_key': ") + e.what());
  }
}

}  // namespace hss::detail
