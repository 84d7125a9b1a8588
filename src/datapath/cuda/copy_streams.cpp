#include "datapath/cuda/copy_streams.hpp"

#include <string>
#include <vector>

#include "hss/kernels/cuda_check.hpp"

#if HSS_HAVE_NVTX
#include <nvtx3/nvToolsExtCudaRt.h>
#endif

namespace hss::detail::cuda {
namespace {

/// Lives as long as the calling host thread: among live threads its address names the thread
/// (and so its per-thread default stream), and a weak_ptr to it expires once the thread has
/// exited.
const std::shared_ptr<const void>& thread_token() {
  thread_local const std::shared_ptr<const void> token = std::make_shared<char>('\0');
  return token;
}

}  // namespace

cudaStream_t CopyStreams::for_caller(cudaStream_t caller) {
  if (caller == cudaStreamPerThread) return for_this_thread();
  if (caller == cudaStreamLegacy) caller = nullptr;  // two names of the legacy stream: one key
  std::lock_guard lock(mutex_);
  auto it = by_handle_.find(caller);
  if (it == by_handle_.end()) it = by_handle_.emplace(caller, make()).first;
  return it->second.get();
}

cudaStream_t CopyStreams::for_this_thread() {
  const std::shared_ptr<const void>& token = thread_token();
  std::vector<OwnedStream> gone;  // destroyed after the lock is released
  std::lock_guard lock(mutex_);
  // Among live threads the address is this thread's; the key of a thread gone is pruned below
  // before its address can name a new thread's token.
  if (const auto it = by_thread_.find(token.get());
      it != by_thread_.end() && !it->second.thread.expired()) {
    return it->second.stream.get();
  }
  // This thread's first store on the device: the copy streams of threads that have exited go.
  for (auto it = by_thread_.begin(); it != by_thread_.end();) {
    if (it->second.thread.expired()) {
      gone.push_back(std::move(it->second.stream));
      it = by_thread_.erase(it);
    } else {
      ++it;
    }
  }
  const auto made = by_thread_.emplace(token.get(), ThreadCopyStream{make(), token});
  return made.first->second.stream.get();
}

OwnedStream CopyStreams::make() {
  OwnedStream stream = OwnedStream::create_non_blocking();
  ++made_;
#if HSS_HAVE_NVTX
  const std::string name = "hss/copy/" + std::to_string(device_) + "/" + std::to_string(made_);
  nvtxNameCudaStreamA(stream.get(), name.c_str());
#endif
  return stream;
}

void CopyStreams::synchronize() noexcept {
  std::lock_guard lock(mutex_);
  for (auto& [caller, stream] : by_handle_) clear_own_error(cudaStreamSynchronize(stream.get()));
  for (auto& [thread, entry] : by_thread_) {
    clear_own_error(cudaStreamSynchronize(entry.stream.get()));
  }
}

}  // namespace hss::detail::cuda
