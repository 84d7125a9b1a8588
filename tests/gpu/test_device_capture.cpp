// CUDA graph capture and hsstore (defect 4), on a GPU (label gpu) and on the CUDA runtime model
// (label gpu-model). Engines capture their decode steps. hsstore's device calls read and write
// host-side state when they are enqueued (pool addresses, pins, fences, descriptor tables), which
// a graph replay would not repeat, so a device store or retrieve on a capturing stream is an
// hss::Error before anything changes, and the capture stays valid. hsstore's own queries, waits
// and allocations run in relaxed capture mode: its work on other streams and threads never
// invalidates a capture the engine runs meanwhile.

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_util.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"

#if !HSS_WITH_CUDA

TEST(DeviceCapture, RequiresACudaBuild) {
  GTEST_SKIP() << "built without CUDA (HSS_ENABLE_CUDA=OFF): " << hss::runtime_info().reason;
}

#else

namespace hss {
namespace {

using test::DeviceBytes;
using test::StreamHolder;
using test::tokens64;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 64;

std::vector<float> rows_of(const std::vector<int64_t>& tokens) {
  const std::vector<int32_t> t32(tokens.begin(), tokens.end());
  return test::make_rows(t32, 0, 0, kCols);
}

class DeviceCapture : public ::testing::Test {
 protected:
  void SetUp() override {
    HSS_REQUIRE_DEVICE();
    store_ = std::make_unique<HiddenStateStore>(test::store_config(kChunk, kCols, 64), db_);
    host_rows_ = rows_of(tokens_);
    input_ = std::make_unique<DeviceBytes>(host_rows_.size() * 4);
    test::upload(*input_, host_rows_.data(), host_rows_.size() * 4);
    output_ = std::make_unique<DeviceBytes>(host_rows_.size() * 4);
    test::fill(output_->ptr, 0x55, output_->bytes);
  }
  TensorView input() const {
    return {input_->ptr, DType::kFloat32, 2 * kChunk, kCols, 0, Device::kCuda, 0};
  }
  MutableTensorView output() const {
    return {output_->ptr, DType::kFloat32, 2 * kChunk, kCols, 0, Device::kCuda, 0};
  }
  /// Every device call on `stream` is an hss::Error naming the capture, and changes nothing.
  void expect_every_device_call_refused(cudaStream_t stream) {
    const HiddenStateStats before = store_->stats();
    const size_t entries = store_->num_entries();
    const auto refused = [](const auto& call, const char* what) {
      try {
        call();
        ADD_FAILURE() << what << ": no error";
      } catch (const InvalidArgument& e) {
        ADD_FAILURE() << what << ": InvalidArgument, expected hss::Error: " << e.what();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("captur"), std::string::npos) << what << e.what();
      }
    };
    StoreOptions so;
    so.stream = stream;
    so.layer_idx = 1;
    RetrieveOptions ro;
    ro.stream = stream;
    refused([&] { (void)store_->store_hidden_states(tokens_, input(), so); }, "store");
    const StoreItem items[] = {{tokens_, input(), so}};
    refused([&] { (void)store_->store_batch(items); }, "store_batch");
    refused([&] { (void)store_->retrieve_hidden_states_into(tokens_, output(), ro); }, "retrieve");
    const RetrieveItem reads[] = {{tokens_, output(), ro}};
    refused([&] { (void)store_->retrieve_batch_into(reads); }, "retrieve_batch_into");
    const Slot slots[] = {{ActivationKind::kHidden, 0}};
    const MutableTensorView outs[] = {output()};
    refused(
        [&] {
          (void)store_->retrieve_layers_into(tokens_, slots, outs, {0, stream});
        },
        "retrieve_layers_into");
    const HiddenStateStats after = store_->stats();
    EXPECT_EQ(store_->num_entries(), entries);
    EXPECT_EQ(after.stores, before.stores);
    EXPECT_EQ(after.retrieves, before.retrieves);
    EXPECT_EQ(after.device_launches, before.device_launches);
  }

  ChunkedTokenDatabase db_{kChunk, false};
  std::unique_ptr<HiddenStateStore> store_;
  const std::vector<int64_t> tokens_ = tokens64(2 * kChunk, 1);
  std::vector<float> host_rows_;
  std::unique_ptr<DeviceBytes> input_, output_;
};

TEST_F(DeviceCapture, ADeviceCallOnACapturingStreamIsAnErrorAndTheCaptureStaysValid) {
  ASSERT_EQ(store_->store_hidden_states(tokens_, test::view_of(host_rows_, kCols)).cached, 2);
  StreamHolder s;
  DeviceBytes scratch(64);
  ASSERT_EQ(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(scratch.ptr, 3, 64, s.stream), cudaSuccess);  // the engine's step
  expect_every_device_call_refused(s.stream);
  // Host calls during the capture are fine: they wait, in relaxed mode, for nothing captured.
  EXPECT_TRUE(store_->retrieve_hidden_states(tokens_).has_value());
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s.stream, &graph), cudaSuccess);  // nothing invalidated it
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(test::download(scratch.ptr, 64), std::vector<unsigned char>(64, 3));
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  // After the capture the same calls work.
  RetrieveOptions ro;
  ro.stream = s.stream;
  EXPECT_EQ(store_->retrieve_hidden_states_into(tokens_, output(), ro), 2 * kChunk);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  const auto got = test::download(output_->ptr, output_->bytes);
  EXPECT_EQ(std::memcmp(got.data(), host_rows_.data(), got.size()), 0);
}

TEST_F(DeviceCapture, TheLegacyStreamWhileABlockingStreamCapturesIsRefused) {
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&blocking, cudaStreamDefault), cudaSuccess);
  DeviceBytes scratch(64);
  ASSERT_EQ(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(scratch.ptr, 1, 64, blocking), cudaSuccess);
  // The legacy default stream would synchronise with the capturing stream: refused too.
  expect_every_device_call_refused(nullptr);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(blocking, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
}

TEST_F(DeviceCapture, HsstoreWorkOnOtherThreadsDoesNotInvalidateAGlobalCapture) {
  // The engine captures in the default (global) mode, in which a potentially unsafe call from
  // any thread (an event query or synchronisation, an allocation) invalidates its capture.
  StreamHolder engine, other;
  DeviceBytes scratch(64);
  std::mutex mutex;
  std::condition_variable changed;
  int phase = 0;  // 1: capturing, 2: hsstore's work done
  const auto advance = [&](int to) {
    std::lock_guard lock(mutex);
    phase = to;
    changed.notify_all();
  };
  const auto await = [&](int at) {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return phase >= at; });
  };
  cudaError_t end = cudaErrorUnknown;
  std::thread capturer([&] {
    if (cudaStreamBeginCapture(engine.stream, cudaStreamCaptureModeGlobal) != cudaSuccess) {
      advance(1);
      return;
    }
    (void)cudaMemsetAsync(scratch.ptr, 7, 64, engine.stream);
    advance(1);
    await(2);
    cudaGraph_t graph = nullptr;
    end = cudaStreamEndCapture(engine.stream, &graph);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  });
  await(1);
  // Meanwhile this thread stores, retrieves to host and device, and flushes on its own stream.
  StoreOptions so;
  so.stream = other.stream;
  RetrieveOptions ro;
  ro.stream = other.stream;
  EXPECT_NO_THROW({
    EXPECT_EQ(store_->store_hidden_states(tokens_, input(), so).cached, 2);
    EXPECT_TRUE(store_->retrieve_hidden_states(tokens_).has_value());
    EXPECT_EQ(store_->retrieve_hidden_states_into(tokens_, output(), ro), 2 * kChunk);
    store_->flush();
  });
  advance(2);
  capturer.join();
  EXPECT_EQ(end, cudaSuccess) << cudaGetErrorName(end);
  EXPECT_EQ(store_->stats().copy_failures, 0u);
  ASSERT_EQ(cudaStreamSynchronize(other.stream), cudaSuccess);
  const auto got = test::download(output_->ptr, output_->bytes);
  EXPECT_EQ(std::memcmp(got.data(), host_rows_.data(), got.size()), 0);
}

}  // namespace
}  // namespace hss

#endif  // HSS_WITH_CUDA
