// Which GPU gets a context (label model, its own process: nothing may touch CUDA before it).
// An engine worker meant for GPU 1 whose thread never selected a device (so CUDA's current device
// is 0) probes the runtime and constructs a store configured for device 1: device 0 must get no
// context, and the thread's current device stays what it was. Two model devices.

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "cuda_model.hpp"
#include "hss/build_info.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"

namespace hss {
namespace {

TEST(FirstContext, TheProbeAndAStoreForDevice1OpenNoContextOnDevice0) {
  ASSERT_EQ(cuda_model::device_count(), 2) << "run with HSS_CUDA_MODEL_DEVICES=2 (ctest sets it)";
  ASSERT_FALSE(cuda_model::context_active(0)) << "something used CUDA before this test";
  const RuntimeInfo& info = runtime_info();  // the device probe
  ASSERT_TRUE(info.device_available);
  EXPECT_EQ(info.devices.size(), 2u);
  EXPECT_TRUE(info.pinned_memory);
  EXPECT_FALSE(cuda_model::context_active(0)) << "the probe opened a context on device 0";
  EXPECT_FALSE(cuda_model::context_active(1)) << "the probe opened a context on device 1";

  Config c;
  c.chunk_size = 16;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = 0.01;
  c.hidden_state_device = 1;
  ChunkedTokenDatabase db(16, false);
  {
    HiddenStateStore store(c, db);
    EXPECT_TRUE(store.stats().pinned);  // the pool is page-locked, allocated on device 1
    EXPECT_TRUE(cuda_model::context_active(1));
    EXPECT_FALSE(cuda_model::context_active(0)) << "constructing the store opened device 0";
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, 0);  // the caller's current device is as it was

    // The engine's thread for GPU 1 stores and restores device rows there.
    std::thread worker([&] {
      ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
      std::vector<int64_t> tokens(32);
      for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i * 7 + 3);
      std::vector<float> rows(32 * 64, 1.5f);
      void* dev = nullptr;
      ASSERT_EQ(cudaMalloc(&dev, rows.size() * 4), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dev, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(
          store.store_hidden_states(tokens, {dev, DType::kFloat32, 32, 64, 0, Device::kCuda, 1})
              .cached,
          2);
      EXPECT_EQ(store.retrieve_hidden_states_into(
                    tokens, {dev, DType::kFloat32, 32, 64, 0, Device::kCuda, 1}),
                32);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaFree(dev), cudaSuccess);
    });
    worker.join();
  }
  EXPECT_FALSE(cuda_model::context_active(0)) << "using or closing the store opened device 0";
}

}  // namespace
}  // namespace hss
