#pragma once
// Move-only handle to a host buffer owned by the process-wide output recycler
// (src/pool/host_buffer_pool.cpp). Thread-safe: buffers may be acquired and released on any thread.

#include <cstddef>
#include <utility>

namespace hss::detail {

class HostBuffer {
 public:
  HostBuffer() = default;
  /// A buffer of at least `bytes` bytes, 64-byte aligned, contents unspecified.
  [[nodiscard]] static HostBuffer acquire(size_t bytes);

  HostBuffer(HostBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      capacity_ = std::exchange(other.capacity_, 0);
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { reset(); }

  [[nodiscard]] void* data() const { return data_; }
  [[nodiscard]] size_t capacity() const { return capacity_; }
  void reset() noexcept;

 private:
  HostBuffer(void* data, size_t capacity) : data_(data), capacity_(capacity) {}
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

/// Statistics and limits of the output recycler.
struct HostBufferPoolStats {
  size_t cached_bytes = 0;  ///< released buffers kept for reuse
  size_t limit_bytes = 0;   ///< most bytes kept (hidden_state_output_cache_bytes)
  size_t reuses = 0;        ///< acquisitions served from the cache
  size_t fresh_allocations = 0;
};
[[nodiscard]] HostBufferPoolStats host_buffer_pool_stats();
/// Sets the most bytes kept (Config::tuning.output_cache_bytes; each store constructed sets it,
/// process-wide, from its config with HSS_OUTPUT_CACHE_MB applied). Buffers already cached stay
/// until reused or trimmed.
void host_buffer_pool_set_limit(size_t bytes);
/// Frees every cached buffer (tests; memory pressure).
void host_buffer_pool_trim();

}  // namespace hss::detail
