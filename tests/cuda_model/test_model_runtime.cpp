// The CUDA runtime model against the CUDA semantics it claims (label model): memory kinds and
// copy directions, pageable staging, stream order, events, the legacy default stream against
// blocking and non-blocking streams, host functions, gates, manual stepping, sticky errors,
// planted faults, contexts and host dereferences of device memory. The library's tests rely on
// each of these; docs/design.md lists them.

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_model.hpp"
#include "model_test_util.hpp"

namespace hss::cuda_model {
namespace {

using test::DeviceMemory;
using test::Event;
using test::PinnedMemory;
using test::Stream;

constexpr unsigned kMapped = cudaHostAllocMapped | cudaHostAllocPortable;

/// Resets device 0 after a test that poisoned its context on purpose.
struct ResetAfter {
  ~ResetAfter() {
    (void)cudaDeviceReset();
    (void)cudaGetLastError();
    clear_faults();
  }
};

int read_int(const void* pinned) {
  int v = 0;
  std::memcpy(&v, pinned, sizeof v);
  return v;
}

TEST(ModelMemory, CopiesRoundTripThroughDeviceMemory) {
  DeviceMemory dev(256);
  std::vector<unsigned char> in(256), out(256, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i);
  ASSERT_EQ(cudaMemcpy(dev.ptr, in.data(), in.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), dev.ptr, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(in, out);
}

TEST(ModelMemory, AWrongDirectionOrARangePastTheAllocationIsInvalidValue) {
  DeviceMemory dev(64);
  std::vector<unsigned char> host(128);
  EXPECT_EQ(cudaMemcpy(dev.ptr, host.data(), 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  EXPECT_EQ(cudaMemcpy(dev.ptr, host.data(), 65, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 64, 64, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(dev.ptr, host.data(), 8, static_cast<cudaMemcpyKind>(17)),
            cudaErrorInvalidMemcpyDirection);
  (void)cudaGetLastError();
}

TEST(ModelMemory, PointerAttributesTellTheKinds) {
  DeviceMemory dev(64);
  PinnedMemory pinned(64, kMapped);
  PinnedMemory unmapped(64, cudaHostAllocDefault);
  int pageable = 0;
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, static_cast<char*>(dev.ptr) + 8), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.device, 0);
  ASSERT_EQ(cudaPointerGetAttributes(&a, pinned.ptr), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  EXPECT_EQ(a.devicePointer, pinned.ptr);
  ASSERT_EQ(cudaPointerGetAttributes(&a, unmapped.ptr), cudaSuccess);
  EXPECT_EQ(a.devicePointer, nullptr);
  ASSERT_EQ(cudaPointerGetAttributes(&a, &pageable), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  void* mapped = nullptr;
  EXPECT_EQ(cudaHostGetDevicePointer(&mapped, pinned.ptr, 0), cudaSuccess);
  EXPECT_EQ(mapped, pinned.ptr);
  EXPECT_EQ(cudaHostGetDevicePointer(&mapped, unmapped.ptr, 0), cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST(ModelMemory, FreeingTwiceOrAnInteriorPointerIsInvalidValue) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 128), cudaSuccess);
  EXPECT_EQ(cudaFree(static_cast<char*>(p) + 16), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(&p), cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST(ModelMemory, APageableSourceIsStagedAtTheCallAndAPageableDestinationWrittenByItsReturn) {
  Stream s;
  DeviceMemory dev(4);
  int in = 11, out = 0;
  {
    Gate gate(s.stream);
    ASSERT_EQ(cudaMemcpyAsync(dev.ptr, &in, 4, cudaMemcpyHostToDevice, s.stream), cudaSuccess);
    in = 22;  // the caller may reuse a pageable source once the call returned
    gate.open();
  }
  ASSERT_EQ(cudaMemcpyAsync(&out, dev.ptr, 4, cudaMemcpyDeviceToHost, s.stream), cudaSuccess);
  EXPECT_EQ(out, 11);  // written before the call returned: no synchronisation needed
}

TEST(ModelMemory, HostDereferenceOfDeviceMemoryFaults) {
  if (!host_access_detection()) GTEST_SKIP() << "no memory protection keys on this machine";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        void* p = nullptr;
        (void)cudaMalloc(&p, 64);
        *static_cast<volatile int*>(p) = 1;
      },
      "host code dereferenced device memory");
}

TEST(ModelMemory, ACopyIntoPinnedMemoryFreedBeforeItRanIsAStickyIllegalAddress) {
  ResetAfter reset;
  Stream s;
  DeviceMemory dev(64);
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, 64, kMapped), cudaSuccess);
  Gate gate(s.stream);
  ASSERT_EQ(cudaMemcpyAsync(pinned, dev.ptr, 64, cudaMemcpyDeviceToHost, s.stream), cudaSuccess);
  ASSERT_EQ(cudaFreeHost(pinned), cudaSuccess);  // cudaFreeHost does not wait for the copy
  gate.open();
  EXPECT_EQ(cudaStreamSynchronize(s.stream), cudaErrorIllegalAddress);
  EXPECT_EQ(sticky_error(0), cudaErrorIllegalAddress);
  void* more = nullptr;
  EXPECT_EQ(cudaMalloc(&more, 16), cudaErrorIllegalAddress);  // the context is lost
  EXPECT_NE(last_fault().find("freed before the copy ran"), std::string::npos) << last_fault();
}

TEST(ModelStreams, WorkOnAStreamRunsInOrderBehindAGate) {
  Stream s;
  DeviceMemory dev(4);
  PinnedMemory in(4, kMapped), out(4, kMapped);
  const int value = 7;
  std::memcpy(in.ptr, &value, 4);
  Gate gate(s.stream);
  ASSERT_EQ(cudaMemcpyAsync(dev.ptr, in.ptr, 4, cudaMemcpyHostToDevice, s.stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.ptr, dev.ptr, 4, cudaMemcpyDeviceToHost, s.stream), cudaSuccess);
  EXPECT_EQ(queued(s.stream), 3u);
  EXPECT_EQ(cudaStreamQuery(s.stream), cudaErrorNotReady);
  EXPECT_EQ(read_int(out.ptr), 0);
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(read_int(out.ptr), 7);
  EXPECT_EQ(queued(s.stream), 0u);
  (void)cudaGetLastError();  // cudaErrorNotReady above
}

TEST(ModelStreams, AHeldStreamDoesNotHoldAnother) {
  Stream a, b;
  DeviceMemory dev(4);
  Gate gate(a.stream);
  ASSERT_EQ(cudaMemsetAsync(dev.ptr, 1, 4, a.stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(dev.ptr, 2, 4, b.stream), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(b.stream), cudaSuccess);  // b finishes, a is still held
  EXPECT_EQ(queued(a.stream), 2u);
  gate.open();
  EXPECT_EQ(cudaStreamSynchronize(a.stream), cudaSuccess);
}

TEST(ModelStreams, AnEventOrdersAnotherStreamAfterTheRecordedWork) {
  Stream a, b;
  DeviceMemory x(4), y(4);
  PinnedMemory out(4, kMapped);
  Event done;
  Gate gate(a.stream);
  ASSERT_EQ(cudaMemsetAsync(x.ptr, 0x11, 4, a.stream), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done.event, a.stream), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done.event), cudaErrorNotReady);
  ASSERT_EQ(cudaStreamWaitEvent(b.stream, done.event, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.ptr, x.ptr, 4, cudaMemcpyDeviceToHost, b.stream), cudaSuccess);
  EXPECT_EQ(queued(b.stream), 2u);  // the wait and the copy: b waits for a on the device
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(b.stream), cudaSuccess);
  EXPECT_EQ(read_int(out.ptr), 0x11111111);
  EXPECT_EQ(cudaEventQuery(done.event), cudaSuccess);
  (void)cudaGetLastError();
}

TEST(ModelStreams, AnEventNeverRecordedIsCompleteAndWaitingForItIsANoOp) {
  Stream s;
  Event never;
  EXPECT_EQ(cudaEventQuery(never.event), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(never.event), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(s.stream, never.event, 0), cudaSuccess);
  EXPECT_EQ(queued(s.stream), 0u);
}

TEST(ModelStreams, TheLegacyStreamWaitsForBlockingStreamsButNotForNonBlockingOnes) {
  Stream blocking(cudaStreamDefault), nonblocking(cudaStreamNonBlocking);
  DeviceMemory dev(4);
  {
    Gate gate(nonblocking.stream);
    ASSERT_EQ(cudaMemsetAsync(dev.ptr, 1, 4, nonblocking.stream), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(dev.ptr, 2, 4, nullptr), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);  // not held by the non-blocking one
    gate.open();
    // Unordered with the blocking stream's memset below otherwise: TSan reports the two writes.
    EXPECT_EQ(cudaStreamSynchronize(nonblocking.stream), cudaSuccess);
  }
  Gate gate(blocking.stream);
  ASSERT_EQ(cudaMemsetAsync(dev.ptr, 3, 4, blocking.stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(dev.ptr, 4, 4, nullptr), cudaSuccess);
  EXPECT_EQ(queued(nullptr), 1u);  // the legacy stream waits for the blocking stream
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady);
  gate.open();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  (void)cudaGetLastError();
}

TEST(ModelStreams, HostFunctionsRunInStreamOrderAndMayNotCallCuda) {
  Stream s;
  struct Seen {
    int order = 0;
    cudaError_t inside = cudaSuccess;
  } seen;
  Gate gate(s.stream);
  ASSERT_EQ(cudaLaunchHostFunc(
                s.stream,
                [](void* p) {
                  auto* seen_ = static_cast<Seen*>(p);
                  seen_->order = 1;
                  int n = 0;
                  seen_->inside = cudaGetDeviceCount(&n);
                },
                &seen),
            cudaSuccess);
  EXPECT_EQ(seen.order, 0);
  gate.open();
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(seen.order, 1);
  EXPECT_EQ(seen.inside, cudaErrorNotPermitted);
}

TEST(ModelStreams, ManualModeRunsOnlyWhatAHostWaitNeeds) {
  set_manual(true);
  Stream s;
  DeviceMemory a(4), b(4);
  PinnedMemory out(4, kMapped);
  ASSERT_EQ(cudaMemsetAsync(a.ptr, 1, 4, nullptr), cudaSuccess);  // legacy stream
  ASSERT_EQ(cudaMemsetAsync(b.ptr, 2, 4, s.stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.ptr, b.ptr, 4, cudaMemcpyDeviceToHost, s.stream), cudaSuccess);
  EXPECT_EQ(queued(s.stream), 2u);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);  // runs s's two ops on this thread
  EXPECT_EQ(read_int(out.ptr), 0x02020202);
  EXPECT_EQ(queued(nullptr), 1u);  // nothing made the legacy memset run
  EXPECT_TRUE(step());
  EXPECT_FALSE(step());
  EXPECT_EQ(queued(nullptr), 0u);
  set_manual(false);
}

TEST(ModelStreams, WaitForHostWaitersSeesABlockedThread) {
  Stream s;
  Gate gate(s.stream);
  std::thread waiter([&] { EXPECT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess); });
  wait_for_host_waiters(1);
  EXPECT_EQ(host_waiters(), 1u);
  gate.open();
  waiter.join();
  EXPECT_EQ(host_waiters(), 0u);
}

// ---- capture

TEST(ModelCapture, CapturedWorkRunsOnlyWhenTheGraphIsLaunched) {
  Stream s;
  DeviceMemory dev(4);
  PinnedMemory out(4, kMapped);
  ASSERT_EQ(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(s.stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaMemsetAsync(dev.ptr, 5, 4, s.stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.ptr, dev.ptr, 4, cudaMemcpyDeviceToHost, s.stream), cudaSuccess);
  EXPECT_EQ(queued(s.stream), 0u);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s.stream, &graph), cudaSuccess);
  EXPECT_EQ(read_int(out.ptr), 0);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s.stream), cudaSuccess);
  EXPECT_EQ(read_int(out.ptr), 0x05050505);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

TEST(ModelCapture, SynchronisingOrQueryingACapturingStreamInvalidatesTheCapture) {
  Stream s;
  ASSERT_EQ(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(s.stream), cudaErrorStreamCaptureUnsupported);
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(s.stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(cudaStreamSynchronize(s.stream), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s.stream, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  (void)cudaGetLastError();
}

TEST(ModelCapture, QueryingAnEventRecordedInACaptureIsCapturedEvent) {
  Stream s;
  Event e;
  ASSERT_EQ(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e.event, s.stream), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e.event), cudaErrorCapturedEvent);
  EXPECT_EQ(cudaEventSynchronize(e.event), cudaErrorCapturedEvent);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s.stream, &graph), cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
}

TEST(ModelCapture, AnUnsafeCallInAnotherThreadInvalidatesAGlobalCaptureUnlessRelaxed) {
  Stream s;
  DeviceMemory dev(4);
  Event unrelated;
  ASSERT_EQ(cudaEventRecord(unrelated.event, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(unrelated.event), cudaSuccess);
  cudaGraph_t graph = nullptr;
  for (const bool relaxed : {true, false}) {
    ASSERT_EQ(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(dev.ptr, 1, 4, s.stream), cudaSuccess);
    std::thread other([&] {
      cudaStreamCaptureMode mode =
          relaxed ? cudaStreamCaptureModeRelaxed : cudaStreamCaptureModeGlobal;
      ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
      EXPECT_EQ(cudaEventQuery(unrelated.event),
                relaxed ? cudaSuccess : cudaErrorStreamCaptureUnsupported);
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, 16), relaxed ? cudaSuccess : cudaErrorStreamCaptureUnsupported);
      (void)cudaFree(p);
      ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    });
    other.join();
    EXPECT_EQ(cudaStreamEndCapture(s.stream, &graph),
              relaxed ? cudaSuccess : cudaErrorStreamCaptureInvalidated);
    if (graph != nullptr) {
      EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    }
    graph = nullptr;
  }
  (void)cudaGetLastError();
}

TEST(ModelCapture, AForkNeverJoinedBackIsUnjoined) {
  Stream origin, side;
  DeviceMemory dev(4);
  Event fork;
  ASSERT_EQ(cudaStreamBeginCapture(origin.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork.event, origin.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side.stream, fork.event, 0), cudaSuccess);  // side joins
  ASSERT_EQ(cudaMemsetAsync(dev.ptr, 1, 4, side.stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(origin.stream, &graph), cudaErrorStreamCaptureUnjoined);
  // Joined back through an event recorded after the side's work: a valid graph.
  Event join;
  ASSERT_EQ(cudaStreamBeginCapture(origin.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(fork.event, origin.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(side.stream, fork.event, 0), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(dev.ptr, 1, 4, side.stream), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(join.event, side.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(origin.stream, join.event, 0), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(origin.stream, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  (void)cudaGetLastError();
}

TEST(ModelCapture, TheLegacyStreamWhileABlockingStreamCapturesIsImplicit) {
  Stream blocking(cudaStreamDefault);
  DeviceMemory dev(4);
  ASSERT_EQ(cudaStreamBeginCapture(blocking.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus status{};
  EXPECT_EQ(cudaStreamIsCapturing(nullptr, &status), cudaErrorStreamCaptureImplicit);
  EXPECT_EQ(cudaMemsetAsync(dev.ptr, 1, 4, nullptr), cudaErrorStreamCaptureImplicit);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(blocking.stream, &graph), cudaErrorStreamCaptureInvalidated);
  (void)cudaGetLastError();
}

// ---- faults, sticky errors, contexts

TEST(ModelFaults, APlantedAllocationFailureHitsTheChosenCall) {
  fail_allocation(1);
  void* a = nullptr;
  void* b = nullptr;
  EXPECT_EQ(cudaMalloc(&a, 16), cudaSuccess);
  EXPECT_EQ(cudaHostAlloc(&b, 16, kMapped), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaHostAlloc(&b, 16, kMapped), cudaSuccess);  // once only, not sticky
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(b), cudaSuccess);
}

TEST(ModelFaults, APlantedCopyFailureIsStickyUntilTheDeviceIsReset) {
  ResetAfter reset;
  Stream s;
  DeviceMemory dev(16);
  Event e;
  fail_copy(0);
  int host[4] = {};
  ASSERT_EQ(cudaMemcpyAsync(dev.ptr, host, sizeof host, cudaMemcpyHostToDevice, s.stream),
            cudaSuccess);  // accepted: the failure comes when it runs
  EXPECT_EQ(cudaStreamSynchronize(s.stream), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);  // sticky: it cannot be cleared
  EXPECT_EQ(cudaEventRecord(e.event, s.stream), cudaErrorIllegalAddress);
}

TEST(ModelDevices, DetectionCreatesNoContextButSetDeviceDoes) {
  ASSERT_EQ(device_count(), 2) << "run with HSS_CUDA_MODEL_DEVICES=2 (ctest sets it)";
  if (context_active(1)) GTEST_SKIP() << "an earlier test of this process used device 1";
  int n = 0;
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 1), cudaSuccess);
  EXPECT_EQ(prop.major, 9);
  EXPECT_TRUE(prop.canMapHostMemory);
  EXPECT_FALSE(context_active(1));
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_TRUE(context_active(1));
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);
  (void)cudaGetLastError();
}

}  // namespace
}  // namespace hss::cuda_model
