#pragma once
// RAII NVTX range in domain "hss", also reported to the trace hook (hss/trace.hpp).

namespace hss::detail {

class ScopedRange {
 public:
  explicit ScopedRange(const char* name) noexcept;
  ~ScopedRange();
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

 private:
  const char* name_;
};

/// Opaque nvtxDomainHandle_t of domain "hss" (nullptr without NVTX).
[[nodiscard]] void* nvtx_domain() noexcept;

}  // namespace hss::detail

#define HSS_RANGE_CONCAT_(a, b) a##b
#define HSS_RANGE_CONCAT(a, b) HSS_RANGE_CONCAT_(a, b)
#define HSS_RANGE(name) ::hss::detail::ScopedRange HSS_RANGE_CONCAT(hss_range_, __LINE__)(name)
