#pragma once
// The copy streams of one device. A store's device-to-host copies run on a copy stream paired with
// the caller's stream, never on the caller's (device_path.hpp), and one per caller stream, so that
// the copies of one caller never queue behind another's.
//
// What a caller's handle names. A handle names one stream, except two:
// * cudaStreamPerThread, one value for every thread, names the calling host thread's own default
//   stream. Keyed by the handle alone, every thread on it would share one copy stream and queue
//   behind all the others; so each thread gets its own, keyed by a token that lives as long as
//   the thread (thread_token, copy_streams.cpp).
// * cudaStreamLegacy names what nullptr does: the device's one legacy stream. One copy stream.
//
// How many: one per explicit stream the engine has ever stored from (a handle reused after
// cudaStreamDestroy is the same key: its copy stream serves the new stream); per thread, one for
// each live thread that stored, plus those of threads that have exited since the last first store
// of a new thread, which destroys them (a thread's exit makes no CUDA call). Destroying a copy
// stream returns at once: copies still queued on it run to completion (CUDA), and the fences and
// staging rounds recorded after them are what flush() and the destructor wait for.
//
// Thread-safe.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "datapath/cuda/cuda_raii.hpp"

namespace hss::detail::cuda {

class CopyStreams {
 public:
  explicit CopyStreams(int device) : device_(device) {}

  /// The copy stream paired with the stream `caller` names for the calling thread. Made at its
  /// first use (non-blocking, named "hss/copy/<device>/<n>") on the current device, which must be
  /// this one.
  cudaStream_t for_caller(cudaStream_t caller);
  /// Waits for every live copy stream (errors are the fences' to report).
  void synchronize() noexcept;

 private:
  /// A per-thread caller's copy stream, and the calling thread's life (expired: it has exited).
  struct ThreadCopyStream {
    OwnedStream stream;
    std::weak_ptr<const void> thread;
  };

  cudaStream_t for_this_thread();
  OwnedStream make();  // mutex_ held

  [[maybe_unused]] const int device_;  // for the streams' names (NVTX builds)
  std::mutex mutex_;  // guards the maps and made_
  std::unordered_map<cudaStream_t, OwnedStream> by_handle_;  // the legacy stream as nullptr
  std::unordered_map<const void*, ThreadCopyStream> by_thread_;
  size_t made_ = 0;
};

}  // namespace hss::detail::cuda
