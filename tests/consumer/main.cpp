// Stores and restores one chunk through the installed library; exit 0 only on an exact round trip.
#include <hss/hss.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

#if defined(HSS_CONSUMER_CUDA)
int consumer_device_count();  // scale.cu
#endif

int main() {
#if defined(HSS_CONSUMER_CUDA)
  std::printf("consumer: %d CUDA device(s) seen by the consumer's own code\n",
              consumer_device_count());
#endif
  hss::Config config;
  config.chunk_size = 16;
  config.enable_hidden_state_cache = true;
  config.max_hidden_state_cpu_size = 1.0 / 1024;
  config.max_local_cpu_size = 1.0 / 1024;
  auto engine = hss::Engine::create(config);
  std::vector<int32_t> tokens(32);
  for (int i = 0; i < 32; ++i) tokens[static_cast<size_t>(i)] = i * 7;
  std::vector<uint16_t> kv(32 * 4, 1);
  engine->store(tokens, {kv.data(), hss::DType::kBFloat16, 32, 4});
  std::vector<float> hidden(32 * 8);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = static_cast<float>(i);
  const hss::StoreResult stored = engine->hidden_state_store()->store_hidden_states(
      tokens, {hidden.data(), hss::DType::kFloat32, 32, 8});
  auto restored = engine->hidden_state_store()->retrieve_hidden_states(tokens);
  const bool ok = stored.written == 2 && stored.cached == 2 && restored && restored->rows() == 32 &&
                  std::memcmp(restored->data(), hidden.data(), hidden.size() * 4) == 0;
  std::printf("consumer: %s (hsstore %s)\n", ok ? "ok" : "MISMATCH",
              hss::build_info().version.c_str());
  return ok ? 0 : 1;
}
