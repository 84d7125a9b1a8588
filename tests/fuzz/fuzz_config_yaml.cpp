// libFuzzer target: Config::from_yaml on arbitrary bytes.
// Checks: the only exception is ConfigError (no other exception, crash, leak or UB under
// ASan/UBSan); an accepted config validates, its derived sizes are total, it round-trips through
// to_yaml exactly, and a token database can be built from its chunk size and chunk tokens.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "hss/config.hpp"
#include "hss/error.hpp"
#include "hss/token_database.hpp"

namespace {

[[noreturn]] void violation(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_config_yaml: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::cerr.rdbuf(nullptr);  // unknown-key warnings would flood the log; ASan writes directly
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  hss::Config config;
  try {
    config = hss::Config::from_yaml(text);
  } catch (const hss::ConfigError&) {
    return 0;  // the documented failure
  }
  try {
    config.validate();
  } catch (const hss::ConfigError& e) {
    violation("accepted config does not validate", e.what());
  }
  (void)config.hidden_state_pool_bytes();
  (void)config.kv_pool_bytes();
  (void)config.layer_allowed(0);
  (void)config.layer_allowed(-1);
  // An inline MAC secret is never written back: to_yaml says it is set, not what it is. So with the
  // key, to_yaml is the key-less text plus that one line, and the round trip is checked without it.
  if (!config.hidden_state_mac_key.empty()) {
    const std::string with_key = config.to_yaml();
    config.hidden_state_mac_key.clear();
    std::string redacted = with_key;
    const std::string_view line = "# hidden_state_mac_key: set (not shown)\n";
    const size_t at = redacted.find(line);
    if (at == std::string::npos) violation("to_yaml does not say the MAC key is set", with_key);
    redacted.erase(at, line.size());
    if (redacted != config.to_yaml()) violation("to_yaml writes the inline MAC secret", with_key);
  }
  const std::string yaml = config.to_yaml();
  try {
    const hss::Config again = hss::Config::from_yaml(yaml);
    if (again.to_yaml() != yaml) violation("to_yaml does not round-trip", yaml);
  } catch (const hss::ConfigError& e) {
    violation("to_yaml output is rejected", yaml + "\n" + e.what());
  }
  const hss::ChunkedTokenDatabase db(config.chunk_size, config.save_unfull_chunk);
  const std::vector<int32_t> tokens(static_cast<size_t>(config.chunk_size % 1000 + 3), 7);
  const auto chunks = db.process_tokens(std::span<const int32_t>(tokens));
  int64_t end = 0;
  for (const hss::Chunk& chunk : chunks) {
    if (chunk.start != end || chunk.end <= chunk.start) violation("chunks not contiguous", yaml);
    end = chunk.end;
  }
  return 0;
}
