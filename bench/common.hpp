#pragma once
// What every workload of hss-bench shares: the run context, synthetic inputs, stores built
// outside the timed regions, and the memcpy reference.

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "harness.hpp"
#include "hss/hss.hpp"

namespace hss::bench {

struct Context {
  Report& report;
  bool quick = false;
};

/// Pseudo-random token ids in [0, 32000); `seed` picks the sequence.
[[nodiscard]] std::vector<int32_t> make_tokens(int64_t n, uint64_t seed);
/// Gives `tokens` keys no earlier call gave them (its first token changes every call), so a
/// store writes every chunk again without the previous keys being dropped.
void refresh_keys(std::vector<int32_t>& tokens);

/// Host tensors of random values, touched on creation (no page fault in a timed region).
[[nodiscard]] std::vector<float> random_f32(int64_t n, uint64_t seed);
[[nodiscard]] std::vector<uint16_t> random_bf16(int64_t n, uint64_t seed);

[[nodiscard]] TensorView host_view(const void* data, DType dtype, int64_t rows, int64_t cols);

/// A hidden-state store with no KV backend bound (every chunk's KV counts as present), so the
/// figures measure the store alone.
struct BareStore {
  ChunkedTokenDatabase db;
  HiddenStateStore store;

  /// pool_bytes is rounded up to what Config can express; the pool is prefaulted here.
  /// copy_threads: hidden_state_copy_threads (unset: auto, the default).
  BareStore(int64_t chunk_size, uint64_t pool_bytes, StorageDType storage,
            StoreImpl store_impl = StoreImpl::kStaging,
            std::optional<int64_t> copy_threads = 1);
  /// Drops every key of `tokens` (untimed resets between reps).
  void drop(std::span<const int32_t> tokens);
};

/// Pool bytes for `entries` full chunks of chunk_size x hidden_dim elements of `elem_bytes`, plus
/// one chunk of slack.
[[nodiscard]] uint64_t pool_bytes_for(int64_t entries, int64_t chunk_size, int64_t hidden_dim,
                                      int64_t elem_bytes);

/// A buffer for the copy references (and the inputs of host figures), page-aligned and touched on
/// creation. Alignment matters: a destination 16 bytes off its source's 64-byte phase made glibc's
/// memcpy 20x slower for 128 KiB copies (64-71 us instead of ~3 us), so every buffer starts on a
/// page. Buffers of 2 MiB or more are on transparent huge pages, as hsstore's pool and output
/// recycler are, so page size is no part of a ratio (4 KiB reference pages had put the retrieve
/// at 1.25x of "the machine's limit").
class CopyBuffer {
 public:
  explicit CopyBuffer(size_t bytes);
  /// A page-aligned copy of `bytes` bytes of `src`.
  CopyBuffer(const void* src, size_t bytes);
  [[nodiscard]] std::byte* data() { return data_.get(); }
  [[nodiscard]] const std::byte* data() const { return data_.get(); }
  [[nodiscard]] size_t size() const { return size_; }

 private:
  struct Unmap {
    void* base;
    size_t bytes;
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Unmap> data_{nullptr, Unmap{nullptr, 0}};
  size_t size_ = 0;
};

/// The reference every host figure is held against: memcpy of `bytes` from `src` into a buffer
/// that already exists, `copies` times into consecutive destinations (one per layer).
[[nodiscard]] Timed memcpy_reference(const void* src, size_t bytes, int copies = 1,
                                     const std::string& name = "memcpy");

/// memcpy of the same bytes split into `threads` contiguous parts, the calling thread copying the
/// first and persistent helper threads (woken per run, as hidden_state_copy_threads' workers
/// are) the others: the reference of multi-threaded copies. Named "memcpy N threads".
[[nodiscard]] Timed memcpy_threads_reference(const void* src, size_t bytes, int threads);

/// The same three references reading `src` itself (the candidate's own input), not a copy of it:
/// source memory is then no part of the ratio either (a store read its input vector 10-15% slower
/// than the references read their own copies of it, docs/perf.md).
[[nodiscard]] Timed memcpy_reference(std::shared_ptr<const CopyBuffer> src, int copies = 1,
                                     const std::string& name = "memcpy");
[[nodiscard]] Timed memcpy_threads_reference(std::shared_ptr<const CopyBuffer> src, int threads);
/// The same split with the streaming copy in every part ("stream copy N threads").
[[nodiscard]] Timed stream_copy_threads_reference(std::shared_ptr<const CopyBuffer> src,
                                                  int threads);
[[nodiscard]] Timed stream_copy_reference(std::shared_ptr<const CopyBuffer> src, int copies = 1);

/// The same copy with non-temporal stores (the bench's own loop, 32-byte stores with AVX2, else
/// 16-byte): the most a streaming copy gets out of this machine's memory, for figures whose
/// candidate streams. Plain memcpy off x86-64.
void stream_copy(void* dst, const void* src, size_t bytes);
[[nodiscard]] Timed stream_copy_reference(const void* src, size_t bytes, int copies = 1);

/// The tier workloads' timed reads: a retrieve of all of `tokens` that must return `rows` rows (a
/// miss throws). `prepare` runs untimed before each rep: it empties what the figure must not find
/// (the pool, the page cache).
[[nodiscard]] Timed prefix_retrieve(std::string name, std::shared_ptr<HiddenStateStore> store,
                                    std::shared_ptr<const std::vector<int32_t>> tokens,
                                    int64_t rows, std::function<void()> prepare);

/// The tier workloads' timed writes: a store of `view` (`bytes` of it) into `store` under keys no
/// earlier rep used, then flush() when `then_flush` (the figure includes the write-behind).
/// Untimed before each rep, whichever store comes next: `drain` is flushed (no earlier rep's
/// write-behind runs beside this one), the previous rep's keys are dropped from `store` and handed
/// to `forget` (a tier's own copy removed), then `settle` runs.
[[nodiscard]] Timed fresh_store(std::string name, std::shared_ptr<HiddenStateStore> store,
                                std::shared_ptr<HiddenStateStore> drain,
                                std::shared_ptr<ChunkedTokenDatabase> db,
                                const std::vector<int32_t>& tokens, TensorView view, double bytes,
                                bool then_flush, std::function<void(const Chunk&)> forget = {},
                                std::function<void()> settle = {});

// Workloads.
void run_store(Context& ctx);
void run_retrieve(Context& ctx);
void run_keys(Context& ctx);
void run_small(Context& ctx);
void run_mixed(Context& ctx);
void run_threads(Context& ctx);
void run_pressure(Context& ctx);
void run_gpu_store(Context& ctx);
void run_gpu_store_mapped(Context& ctx);
void run_gpu_retrieve(Context& ctx);
void run_gpu_small(Context& ctx);
void run_gpu_overlap(Context& ctx);
void run_gpu_fp8(Context& ctx);
void run_gpu_tier(Context& ctx);
void run_remote(Context& ctx);
void run_batch(Context& ctx);
void run_gpu_batch(Context& ctx);
void run_copy_threads(Context& ctx);
void run_mac(Context& ctx);
void run_tiers(Context& ctx);
void run_fp8(Context& ctx);
/// The device variants inside `store` and `retrieve` (one case each, or a skip line).
void run_device_store_variant(Context& ctx);
void run_device_retrieve_variant(Context& ctx);

}  // namespace hss::bench
