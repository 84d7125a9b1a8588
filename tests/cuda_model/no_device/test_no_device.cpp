// A CUDA build in a process that finds no device (label model, its own process with
// HSS_CUDA_MODEL_DEVICES=0: the model answers cudaErrorNoDevice, as a machine without a GPU
// does): the store runs on the host path, says why, and refuses device views by name.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_model.hpp"
#include "hss/build_info.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"

namespace hss {
namespace {

TEST(NoDevice, TheStoreRunsOnTheHostPathAndRefusesDeviceViews) {
  ASSERT_EQ(cuda_model::device_count(), 0) << "run with HSS_CUDA_MODEL_DEVICES=0 (ctest sets it)";
  const RuntimeInfo& info = runtime_info();
  EXPECT_FALSE(info.device_available);
  EXPECT_NE(info.reason.find("cudaErrorNoDevice"), std::string::npos) << info.reason;
  EXPECT_TRUE(build_info().cuda);
  Config c;
  c.chunk_size = 16;
  c.enable_hidden_state_cache = true;
  c.max_hidden_state_cpu_size = 0.01;
  ChunkedTokenDatabase db(16, false);
  HiddenStateStore store(c, db);
  EXPECT_FALSE(store.stats().device_path);
  EXPECT_FALSE(store.stats().pinned);
  std::vector<int64_t> tokens(32);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i + 5);
  std::vector<float> rows(32 * 8, 2.0f);
  EXPECT_EQ(store.store_hidden_states(tokens, {rows.data(), DType::kFloat32, 32, 8}).cached, 2);
  try {
    (void)store.store_hidden_states(
        tokens, {rows.data(), DType::kFloat32, 32, 8, 0, Device::kCuda, 0}, {1, 0});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device is usable"), std::string::npos)
        << e.what();
  }
  const auto got = store.retrieve_hidden_states(tokens);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->data()[31 * 8 + 7], 2.0f);
}

}  // namespace
}  // namespace hss
