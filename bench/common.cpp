#include "common.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "hss/kernels/convert.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace hss::bench {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

constexpr int32_t kVocab = 32000;

}  // namespace

std::vector<int32_t> make_tokens(int64_t n, uint64_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  uint64_t state = mix(seed);
  for (auto& t : tokens) {
    state = mix(state);
    t = static_cast<int32_t>(state % kVocab);
  }
  return tokens;
}

void refresh_keys(std::vector<int32_t>& tokens) {
  // Above the vocabulary, so no call repeats an earlier one or a make_tokens sequence.
  static int32_t next = kVocab;
  if (!tokens.empty()) tokens[0] = next++;
}

std::vector<float> random_f32(int64_t n, uint64_t seed) {
  std::vector<float> values(static_cast<size_t>(n));
  uint64_t state = mix(seed);
  for (auto& v : values) {
    state = mix(state);
    v = static_cast<float>(static_cast<int64_t>(state % 20001) - 10000) * 1e-3f;
  }
  return values;
}

std::vector<uint16_t> random_bf16(int64_t n, uint64_t seed) {
  std::vector<uint16_t> values(static_cast<size_t>(n));
  uint64_t state = mix(seed);
  for (auto& v : values) {
    state = mix(state);
    v = kernels::float_to_bf16(static_cast<float>(static_cast<int64_t>(state % 20001) - 10000) *
                               1e-3f);
  }
  return values;
}

TensorView host_view(const void* data, DType dtype, int64_t rows, int64_t cols) {
  return {data, dtype, rows, cols, 0, Device::kHost, 0};
}

namespace {
Config store_config(int64_t chunk_size, uint64_t pool_bytes, StorageDType storage,
                    StoreImpl store_impl, std::optional<int64_t> copy_threads) {
  Config c;
  c.chunk_size = chunk_size;
  c.enable_hidden_state_cache = true;
  // Whole MiB, never below the request: the GiB figure round-trips through a double.
  const uint64_t mib = (pool_bytes + (uint64_t{1} << 20) - 1) >> 20;
  c.max_hidden_state_cpu_size = static_cast<double>(mib) / 1024.0;
  c.hidden_state_storage_dtype = storage;
  c.tuning.store_impl = store_impl;
  c.tuning.copy_threads = copy_threads;
  return c;
}
}  // namespace

BareStore::BareStore(int64_t chunk_size, uint64_t pool_bytes, StorageDType storage,
                     StoreImpl store_impl, std::optional<int64_t> copy_threads)
    : db(chunk_size, false),
      store(store_config(chunk_size, pool_bytes, storage, store_impl, copy_threads), db) {}

void BareStore::drop(std::span<const int32_t> tokens) {
  for (const Chunk& chunk : db.process_tokens(tokens)) (void)store.drop_key(chunk.key);
}

uint64_t pool_bytes_for(int64_t entries, int64_t chunk_size, int64_t hidden_dim,
                        int64_t elem_bytes) {
  return static_cast<uint64_t>((entries + 1) * chunk_size * hidden_dim * elem_bytes);
}

void CopyBuffer::Unmap::operator()(std::byte*) const {
  if (base != nullptr) munmap(base, bytes);
}

CopyBuffer::CopyBuffer(size_t bytes) : size_(bytes) {
  constexpr size_t kPage = 4096, kHuge = size_t{2} << 20;
  const size_t align = bytes >= kHuge ? kHuge : kPage;
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  const size_t mapped = rounded + align;  // room to align the start
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();
  const auto start = (reinterpret_cast<uintptr_t>(base) + align - 1) / align * align;
  auto* data = reinterpret_cast<std::byte*>(start);
  if (align == kHuge) (void)madvise(data, rounded, MADV_HUGEPAGE);  // before the first touch
  data_ = std::unique_ptr<std::byte, Unmap>(data, Unmap{base, mapped});
  std::memset(data, 1, rounded);
}

CopyBuffer::CopyBuffer(const void* src, size_t bytes) : CopyBuffer(bytes) {
  std::memcpy(data_.get(), src, bytes);
}

Timed memcpy_reference(std::shared_ptr<const CopyBuffer> src, int copies, const std::string& name) {
  const size_t bytes = src->size();
  auto dst = std::make_shared<CopyBuffer>(bytes * static_cast<size_t>(copies));
  Timed t;
  t.name = name;
  t.run = [dst, src, bytes, copies] {
    for (int i = 0; i < copies; ++i) {
      std::byte* to = dst->data() + bytes * static_cast<size_t>(i);
      std::memcpy(to, src->data(), bytes);
      do_not_optimize(to);
    }
  };
  t.bytes = static_cast<double>(bytes) * copies;
  return t;
}

Timed memcpy_reference(const void* src_in, size_t bytes, int copies, const std::string& name) {
  return memcpy_reference(std::make_shared<const CopyBuffer>(src_in, bytes), copies, name);
}

namespace {

/// Persistent helpers for memcpy_threads_reference: run(fn) calls fn(0) here and fn(1..n-1) on
/// the helpers, and returns when all are done.
class HelperThreads {
 public:
  explicit HelperThreads(int threads) {
    for (int i = 1; i < threads; ++i) helpers_.emplace_back([this, i] { loop(i); });
  }
  ~HelperThreads() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    work_.notify_all();
    for (std::thread& t : helpers_) t.join();
  }
  HelperThreads(const HelperThreads&) = delete;
  HelperThreads& operator=(const HelperThreads&) = delete;

  void run(const std::function<void(int)>& fn) {
    {
      std::lock_guard lock(mutex_);
      fn_ = &fn;
      pending_ = static_cast<int>(helpers_.size());
      ++generation_;
    }
    work_.notify_all();
    fn(0);
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  void loop(int index) {
    uint64_t seen = 0;
    std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const auto* fn = fn_;
      lock.unlock();
      (*fn)(index);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_, done_;
  const std::function<void(int)>* fn_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> helpers_;
};

}  // namespace

namespace {

Timed threads_reference(std::shared_ptr<const CopyBuffer> src, int threads, bool streaming) {
  const size_t bytes = src->size();
  auto dst = std::make_shared<CopyBuffer>(bytes);
  auto helpers = std::make_shared<HelperThreads>(threads);
  // Parts on 4 KiB boundaries, as the store's split falls on whole cache lines.
  const size_t part = (bytes / static_cast<size_t>(threads) + 4095) / 4096 * 4096;
  auto copy_part = std::make_shared<std::function<void(int)>>([=](int i) {
    const size_t begin = std::min(bytes, part * static_cast<size_t>(i));
    const size_t end = std::min(bytes, begin + part);
    if (streaming) {
      stream_copy(dst->data() + begin, src->data() + begin, end - begin);
    } else {
      std::memcpy(dst->data() + begin, src->data() + begin, end - begin);
    }
  });
  Timed t;
  t.name = (streaming ? "stream copy " : "memcpy ") + std::to_string(threads) + " threads";
  t.run = [helpers, copy_part, dst] {
    helpers->run(*copy_part);
    do_not_optimize(dst->data());
  };
  t.bytes = static_cast<double>(bytes);
  return t;
}

}  // namespace

Timed memcpy_threads_reference(std::shared_ptr<const CopyBuffer> src, int threads) {
  return threads_reference(std::move(src), threads, false);
}

Timed stream_copy_threads_reference(std::shared_ptr<const CopyBuffer> src, int threads) {
  return threads_reference(std::move(src), threads, true);
}

Timed memcpy_threads_reference(const void* src_in, size_t bytes, int threads) {
  return memcpy_threads_reference(std::make_shared<const CopyBuffer>(src_in, bytes), threads);
}

namespace {
#if defined(__x86_64__)
// 32-byte non-temporal stores where the CPU has AVX2 (faster than 16-byte ones on the EPYC VMs:
// 12.3 vs 10.1 GB/s for 32 MiB, docs/perf.md): the strongest streaming reference we can write.
__attribute__((target("avx2"))) size_t stream_avx2(unsigned char* d, const unsigned char* s,
                                                   size_t i, size_t bytes) {
  for (; i + 128 <= bytes; i += 128) {
    for (size_t k = 0; k < 128; k += 32) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + k),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + k)));
    }
  }
  return i;
}
const bool kHaveAvx2 = __builtin_cpu_supports("avx2") != 0;
#endif
}  // namespace

void stream_copy(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t head = std::min(bytes, (32 - reinterpret_cast<uintptr_t>(d) % 32) % 32);
  std::memcpy(d, s, head);
  size_t i = head;
#if defined(__x86_64__)
  if (kHaveAvx2) i = stream_avx2(d, s, i, bytes);
#endif
  for (; i + 64 <= bytes; i += 64) {
    for (size_t k = 0; k < 64; k += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + k),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + k)));
    }
  }
  std::memcpy(d + i, s + i, bytes - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

Timed stream_copy_reference(std::shared_ptr<const CopyBuffer> src, int copies) {
  const size_t bytes = src->size();
  auto dst = std::make_shared<CopyBuffer>(bytes * static_cast<size_t>(copies));
  Timed t;
  t.name = "stream copy";
  t.run = [dst, src, bytes, copies] {
    for (int i = 0; i < copies; ++i) {
      std::byte* to = dst->data() + bytes * static_cast<size_t>(i);
      stream_copy(to, src->data(), bytes);
      do_not_optimize(to);
    }
  };
  t.bytes = static_cast<double>(bytes) * copies;
  return t;
}

Timed stream_copy_reference(const void* src_in, size_t bytes, int copies) {
  return stream_copy_reference(std::make_shared<const CopyBuffer>(src_in, bytes), copies);
}

Timed prefix_retrieve(std::string name, std::shared_ptr<HiddenStateStore> store,
                      std::shared_ptr<const std::vector<int32_t>> tokens, int64_t rows,
                      std::function<void()> prepare) {
  Timed t;
  t.name = std::move(name);
  t.prepare = std::move(prepare);
  t.run = [store, tokens, rows, what = t.name] {
    auto out = store->retrieve_hidden_states(*tokens);
    if (!out || out->rows() != rows) throw std::runtime_error(what + " missed");
    do_not_optimize(out->data());
  };
  t.tokens = static_cast<double>(rows);
  return t;
}

Timed fresh_store(std::string name, std::shared_ptr<HiddenStateStore> store,
                  std::shared_ptr<HiddenStateStore> drain, std::shared_ptr<ChunkedTokenDatabase> db,
                  const std::vector<int32_t>& tokens, TensorView view, double bytes,
                  bool then_flush, std::function<void(const Chunk&)> forget,
                  std::function<void()> settle) {
  auto own_tokens = std::make_shared<std::vector<int32_t>>(tokens);
  Timed t;
  t.name = std::move(name);
  t.prepare = [store, drain, own_tokens, db, forget = std::move(forget),
               settle = std::move(settle)] {
    drain->flush();
    for (const Chunk& c : db->process_tokens(*own_tokens)) {
      (void)store->drop_key(c.key);
      if (forget) forget(c);
    }
    refresh_keys(*own_tokens);
    if (settle) settle();
  };
  t.run = [store, own_tokens, view, then_flush] {
    (void)store->store_hidden_states(*own_tokens, view);
    if (then_flush) store->flush();
  };
  t.bytes = bytes;
  t.tokens = static_cast<double>(view.rows);
  return t;
}

}  // namespace hss::bench
