// The CUDA path and the calling thread's last error (label model). hsstore's device calls run on
// the engine's threads, and the last-error slot (cudaGetLastError) is the engine's: an error an
// engine launch left pending there must still be there after hsstore's calls, and hsstore's own
// failures are thrown, never left there for the engine to find. The model holds the slot per host
// thread and returns each launch's status from cudaLaunchKernel / cudaLaunchKernelExC, as CUDA
// does (docs/design.md, "The thread's last error").

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda_model.hpp"
#include "gpu/gpu_test_util.hpp"
#include "hss/error.hpp"
#include "hss/hidden_state_store.hpp"
#include "hss/token_database.hpp"

namespace hss {
namespace {

using test::DeviceBytes;
using test::StreamHolder;
using test::tokens64;

constexpr int64_t kChunk = 16;
constexpr int64_t kCols = 64;
constexpr int64_t kRows = 2 * kChunk;

std::vector<float> rows_of(const std::vector<int64_t>& tokens) {
  const std::vector<int32_t> t32(tokens.begin(), tokens.end());
  return test::make_rows(t32, 0, 0, kCols);
}

/// What an engine does with an unchecked `noop<<<0, 256, 0, stream>>>()`: the launch fails with
/// cudaErrorInvalidConfiguration, which stays pending in the calling thread's last-error slot.
void leave_an_error_pending(cudaStream_t stream) {
  ASSERT_EQ(cudaLaunchKernel(cuda_model::noop_kernel(), dim3(0), dim3(256), nullptr, 0, stream),
            cudaErrorInvalidConfiguration);
  ASSERT_EQ(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
}

class LastError : public ::testing::Test {
 protected:
  void SetUp() override {
    HSS_REQUIRE_DEVICE();
    (void)cudaGetLastError();  // whatever an earlier test of this process left: not this test's
  }
  void TearDown() override {
    cuda_model::clear_faults();
    (void)cudaGetLastError();  // the next test starts clean whatever this one left
  }

  TensorView device_rows(const std::vector<float>& rows) {
    buffers_.push_back(std::make_unique<DeviceBytes>(rows.size() * 4));
    test::upload(*buffers_.back(), rows.data(), rows.size() * 4);
    return {buffers_.back()->ptr, DType::kFloat32, kRows, kCols, 0, Device::kCuda, 0};
  }
  MutableTensorView device_out() {
    buffers_.push_back(std::make_unique<DeviceBytes>(static_cast<size_t>(kRows * kCols) * 4));
    test::fill(buffers_.back()->ptr, 0, buffers_.back()->bytes);
    return {buffers_.back()->ptr, DType::kFloat32, kRows, kCols, 0, Device::kCuda, 0};
  }
  static void expect_rows(const MutableTensorView& out, const std::vector<float>& want) {
    const auto got = test::download(out.data, want.size() * 4);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0);
  }

  std::vector<std::unique_ptr<DeviceBytes>> buffers_;
};

TEST_F(LastError, AnErrorTheEngineLeftPendingSurvivesADeviceStoreAndRetrieve) {
  // A store's gather kernel and a retrieve's restore kernel launch on the engine's thread, after
  // the engine's failed launch: both succeed, and the engine still finds its own error.
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(test::store_config(kChunk, kCols, 64), db);
  const auto t = tokens64(kRows, 31);
  const auto want = rows_of(t);
  const TensorView rows = device_rows(want);
  const MutableTensorView out = device_out();
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;
  RetrieveOptions ro;
  ro.stream = s.stream;

  leave_an_error_pending(s.stream);
  ASSERT_EQ(store.store_hidden_states(t, rows, so), (StoreResult{2, 2}));
  store.flush();
  ASSERT_EQ(store.retrieve_hidden_states_into(t, out, ro), kRows);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);

  expect_rows(out, want);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);  // still the engine's
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(LastError, AnErrorTheEngineLeftPendingSurvivesBatchLaunches) {
  // The batch kernels: one launch per stream for a store batch and for a retrieve batch.
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(test::store_config(kChunk, kCols, 64), db);
  const auto t1 = tokens64(kRows, 32), t2 = tokens64(kRows, 33);
  const auto want1 = rows_of(t1), want2 = rows_of(t2);
  const TensorView rows1 = device_rows(want1), rows2 = device_rows(want2);
  const MutableTensorView out1 = device_out(), out2 = device_out();
  StreamHolder s;
  const StoreItem items[] = {{t1, rows1, {0, 0, ActivationKind::kHidden, s.stream}},
                             {t2, rows2, {0, 0, ActivationKind::kHidden, s.stream}}};
  const RetrieveItem reads[] = {{t1, out1, {0, 0, ActivationKind::kHidden, s.stream}},
                                {t2, out2, {0, 0, ActivationKind::kHidden, s.stream}}};

  leave_an_error_pending(s.stream);
  ASSERT_EQ(store.store_batch(items), (std::vector<StoreResult>{{2, 2}, {2, 2}}));
  ASSERT_EQ(store.retrieve_batch_into(reads), (std::vector<int64_t>{kRows, kRows}));
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);

  expect_rows(out1, want1);
  expect_rows(out2, want2);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
}

TEST_F(LastError, TheCubRestoreTakesTheKernelWhileAnErrorIsPending) {
  // cub reads the thread's last error as its launches' status: with the engine's error pending it
  // would fail (and stop after its first kernel), so the restore launches the custom kernel.
  Config c = test::store_config(kChunk, kCols, 64);
  c.tuning.restore_impl = RestoreImpl::kCub;
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(c, db);
  const auto t = tokens64(kRows, 34);
  const auto want = rows_of(t);
  ASSERT_EQ(store.store_hidden_states(t, test::view_of(want, kCols)), (StoreResult{2, 2}));
  const MutableTensorView out = device_out();
  StreamHolder s;
  RetrieveOptions ro;
  ro.stream = s.stream;

  leave_an_error_pending(s.stream);
  ASSERT_EQ(store.retrieve_hidden_states_into(t, out, ro), kRows);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);

  expect_rows(out, want);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  bool kernel = false;
  for (const std::string& op : cuda_model::history(s.stream)) {
    kernel = kernel || op.find("kernel restore_gather") != std::string::npos;
    EXPECT_EQ(op.find("cub"), std::string::npos) << op;
  }
  EXPECT_TRUE(kernel);
}

TEST_F(LastError, AnOwnFailedLaunchIsAnErrorNamingItAndLeavesNothingPending) {
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(test::store_config(kChunk, kCols, 64), db);
  const auto t = tokens64(kRows, 35);
  const auto want = rows_of(t);
  const TensorView rows = device_rows(want);
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;

  cuda_model::fail_launch(0, cudaErrorLaunchOutOfResources);  // the store's gather kernel
  try {
    (void)store.store_hidden_states(t, rows, so);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaErrorLaunchOutOfResources"), std::string::npos) << what;
    EXPECT_NE(what.find(cudaGetErrorString(cudaErrorLaunchOutOfResources)), std::string::npos)
        << what;
    EXPECT_NE(what.find("cudaLaunchKernelEx"), std::string::npos) << what;
  }
  // The runtime wrote the failure into the thread's slot; hsstore threw it and took it out.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(store.num_entries(), 0u);
  ASSERT_EQ(store.store_hidden_states(t, rows, so), (StoreResult{2, 2}));
  const auto got = store.retrieve_hidden_states(t);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(std::memcmp(got->data(), want.data(), got->bytes()), 0);
}

TEST_F(LastError, AnOwnFailedLaunchOverAPendingErrorThrowsItsOwnError) {
  // A failed runtime call overwrites the slot (CUDA: the variable "is overwritten by the error
  // code every time an error occurs"): the engine's earlier error is gone then, by the runtime's
  // rule. hsstore reports its own failure, not the engine's, and leaves nothing behind.
  ChunkedTokenDatabase db(kChunk, false);
  HiddenStateStore store(test::store_config(kChunk, kCols, 64), db);
  const auto t = tokens64(kRows, 36);
  const TensorView rows = device_rows(rows_of(t));
  StreamHolder s;
  StoreOptions so;
  so.stream = s.stream;

  leave_an_error_pending(s.stream);
  cuda_model::fail_launch(0, cudaErrorLaunchOutOfResources);
  try {
    (void)store.store_hidden_states(t, rows, so);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaErrorLaunchOutOfResources"), std::string::npos) << what;
    EXPECT_EQ(what.find("cudaErrorInvalidConfiguration"), std::string::npos) << what;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace hss
