#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hss/kernels/convert.hpp"

#if defined(__SSE2__)
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
                    StoreImpl store_impl) {
  Config c;
  c.chunk_size = chunk_size;
  c.enable_hidden_state_cache = true;
  // Whole MiB, never below the request: the GiB figure round-trips through a double.
  const uint64_t mib = (pool_bytes + (uint64_t{1} << 20) - 1) >> 20;
  c.max_hidden_state_cpu_size = static_cast<double>(mib) / 1024.0;
  c.hidden_state_storage_dtype = storage;
  c.hidden_state_store_impl = store_impl;
  return c;
}
}  // namespace

BareStore::BareStore(int64_t chunk_size, uint64_t pool_bytes, StorageDType storage,
                     StoreImpl store_impl)
    : db(chunk_size, false), store(store_config(chunk_size, pool_bytes, storage, store_impl), db) {}

void BareStore::drop(std::span<const int32_t> tokens) {
  for (const Chunk& chunk : db.process_tokens(tokens)) (void)store.drop_key(chunk.key);
}

uint64_t pool_bytes_for(int64_t entries, int64_t chunk_size, int64_t hidden_dim,
                        int64_t elem_bytes) {
  return static_cast<uint64_t>((entries + 1) * chunk_size * hidden_dim * elem_bytes);
}

CopyBuffer::CopyBuffer(size_t bytes) : size_(bytes) {
  constexpr size_t kPage = 4096;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  data_.reset(static_cast<std::byte*>(std::aligned_alloc(kPage, rounded)));
  if (!data_) throw std::bad_alloc();
  std::memset(data_.get(), 1, rounded);
}

CopyBuffer::CopyBuffer(const void* src, size_t bytes) : CopyBuffer(bytes) {
  std::memcpy(data_.get(), src, bytes);
}

Timed memcpy_reference(const void* src_in, size_t bytes, int copies, const std::string& name) {
  auto dst = std::make_shared<CopyBuffer>(bytes * static_cast<size_t>(copies));
  auto aligned_src = std::make_shared<CopyBuffer>(src_in, bytes);
  Timed t;
  t.name = name;
  t.run = [dst, aligned_src, bytes, copies] {
    const std::byte* src = aligned_src->data();
    for (int i = 0; i < copies; ++i) {
      std::byte* to = dst->data() + bytes * static_cast<size_t>(i);
      std::memcpy(to, src, bytes);
      do_not_optimize(to);
    }
  };
  t.bytes = static_cast<double>(bytes) * copies;
  return t;
}

void stream_copy(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  size_t i = head;
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

Timed stream_copy_reference(const void* src_in, size_t bytes, int copies) {
  auto dst = std::make_shared<CopyBuffer>(bytes * static_cast<size_t>(copies));
  auto aligned_src = std::make_shared<CopyBuffer>(src_in, bytes);
  Timed t;
  t.name = "stream copy";
  t.run = [dst, aligned_src, bytes, copies] {
    const std::byte* src = aligned_src->data();
    for (int i = 0; i < copies; ++i) {
      std::byte* to = dst->data() + bytes * static_cast<size_t>(i);
      stream_copy(to, src, bytes);
      do_not_optimize(to);
    }
  };
  t.bytes = static_cast<double>(bytes) * copies;
  return t;
}

}  // namespace hss::bench
