// The CUDA runtime model's per-thread state against CUDA's (label model): kernel launches return
// their status and write a failure to the calling thread's last-error slot, one slot per host
// thread, which a successful call leaves alone; cudaStreamPerThread names a stream per host
// thread, which synchronises with the legacy stream and goes with its thread. The library's
// last-error and copy-stream tests (test_cuda_path_last_error.cpp, test_cuda_path_streams.cpp)
// rely on these.

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "cuda_model.hpp"
#include "model_test_util.hpp"

namespace hss::cuda_model {
namespace {

using test::Event;
using test::Stream;

/// Starts every test with an empty last-error slot and no planted fault, and ends it so.
class ModelThreads : public ::testing::Test {
 protected:
  void SetUp() override { (void)cudaGetLastError(); }
  void TearDown() override {
    clear_faults();
    (void)cudaGetLastError();
  }
};

cudaError_t launch_noop(dim3 grid, dim3 block, cudaStream_t stream) {
  return cudaLaunchKernel(noop_kernel(), grid, block, nullptr, 0, stream);
}

void set_flag(void* flag) { static_cast<std::atomic<bool>*>(flag)->store(true); }

TEST_F(ModelThreads, ALaunchReturnsItsStatusAndAFailureIsAlsoTheThreadsLastError) {
  Stream s;
  EXPECT_EQ(launch_noop(dim3(1), dim3(32), s.stream), cudaSuccess);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  EXPECT_EQ(launch_noop(dim3(0), dim3(32), s.stream), cudaErrorInvalidConfiguration);
  EXPECT_EQ(launch_noop(dim3(1), dim3(2048), s.stream), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  static int not_a_kernel = 0;
  EXPECT_EQ(cudaLaunchKernel(&not_a_kernel, dim3(1), dim3(32), nullptr, 0, s.stream),
            cudaErrorInvalidDeviceFunction);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDeviceFunction);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(2);
  config.blockDim = dim3(64);
  config.stream = s.stream;
  EXPECT_EQ(cudaLaunchKernelExC(&config, noop_kernel(), nullptr), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
}

TEST_F(ModelThreads, ASuccessfulLaunchLeavesAPendingErrorAlone) {
  Stream s;
  ASSERT_EQ(launch_noop(dim3(0), dim3(32), s.stream), cudaErrorInvalidConfiguration);
  EXPECT_EQ(launch_noop(dim3(1), dim3(32), s.stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
}

TEST_F(ModelThreads, APlantedLaunchFailureIsReturnedAndOverwritesThePendingError) {
  Stream s;
  ASSERT_EQ(launch_noop(dim3(0), dim3(32), s.stream), cudaErrorInvalidConfiguration);
  fail_launch(0, cudaErrorLaunchOutOfResources);
  EXPECT_EQ(launch_noop(dim3(1), dim3(32), s.stream), cudaErrorLaunchOutOfResources);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchOutOfResources);
  EXPECT_EQ(launch_noop(dim3(1), dim3(32), s.stream), cudaSuccess);  // once only
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(ModelThreads, TheLastErrorIsPerHostThread) {
  Stream s;
  ASSERT_EQ(launch_noop(dim3(0), dim3(32), s.stream), cudaErrorInvalidConfiguration);
  std::thread([&] {
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);  // not this thread's
    static int not_a_kernel = 0;
    EXPECT_EQ(cudaLaunchKernel(&not_a_kernel, dim3(1), dim3(32), nullptr, 0, s.stream),
              cudaErrorInvalidDeviceFunction);
    EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDeviceFunction);
  }).join();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
}

TEST_F(ModelThreads, EachHostThreadHasItsOwnPerThreadDefaultStream) {
  Gate gate(cudaStreamPerThread);  // this thread's per-thread stream, held
  EXPECT_EQ(queued(cudaStreamPerThread), 1u);
  std::thread([] {
    EXPECT_EQ(queued(cudaStreamPerThread), 0u);
    EXPECT_EQ(launch_noop(dim3(1), dim3(32), cudaStreamPerThread), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);  // not held
    EXPECT_EQ(history(cudaStreamPerThread).size(), 1u);
  }).join();
  EXPECT_EQ(cudaStreamQuery(cudaStreamPerThread), cudaErrorNotReady);
  gate.open();
  EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
}

TEST_F(ModelThreads, ThePerThreadStreamSynchronisesWithTheLegacyStream) {
  // CUDA: "The per-thread default stream is not a non-blocking stream and will synchronize with
  // the legacy default stream if both are used in a program."
  Event on_legacy;
  Gate gate(cudaStreamPerThread);
  ASSERT_EQ(cudaEventRecord(on_legacy.event, cudaStreamLegacy), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(on_legacy.event), cudaErrorNotReady);
  (void)cudaGetLastError();
  gate.open();
  EXPECT_EQ(cudaEventSynchronize(on_legacy.event), cudaSuccess);
}

TEST_F(ModelThreads, APerThreadStreamGoesWithItsThreadAndItsWorkStillRuns) {
  std::atomic<bool> ran{false};
  Event after;
  std::unique_ptr<Gate> gate;
  std::thread([&] {
    gate = std::make_unique<Gate>(cudaStreamPerThread);
    EXPECT_EQ(cudaLaunchHostFunc(cudaStreamPerThread, &set_flag, &ran), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(after.event, cudaStreamPerThread), cudaSuccess);
  }).join();
  EXPECT_FALSE(ran.load());
  gate->open();
  EXPECT_EQ(cudaEventSynchronize(after.event), cudaSuccess);
  EXPECT_TRUE(ran.load());
}

}  // namespace
}  // namespace hss::cuda_model
