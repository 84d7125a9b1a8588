#include "base/nvtx.hpp"

#include <atomic>

#include "hss/trace.hpp"

#if HSS_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace hss {
namespace {

struct Hook {
  trace::RangeHook fn;
  void* user;
};
std::atomic<const Hook*> g_hook{nullptr};
// Hooks are few and installed rarely; keeping every installed one alive makes a concurrent
// reader's pointer always valid without reference counting.
Hook g_hooks[64];
std::atomic<int> g_hook_count{0};

void notify(const char* name, bool push) {
  if (const Hook* hook = g_hook.load(std::memory_order_acquire); hook && hook->fn) {
    hook->fn(name, push, hook->user);
  }
}

}  // namespace

void trace::set_range_hook(RangeHook hook, void* user_data) {
  if (hook == nullptr) {
    g_hook.store(nullptr, std::memory_order_release);
    return;
  }
  const int slot = g_hook_count.fetch_add(1) % 64;
  g_hooks[slot] = Hook{hook, user_data};
  g_hook.store(&g_hooks[slot], std::memory_order_release);
}

namespace detail {

void* nvtx_domain() noexcept {
#if HSS_HAVE_NVTX
  static nvtxDomainHandle_t domain = nvtxDomainCreateA("hss");
  return domain;
#else
  return nullptr;
#endif
}

ScopedRange::ScopedRange(const char* name) noexcept : name_(name) {
#if HSS_HAVE_NVTX
  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = name;
  nvtxDomainRangePushEx(static_cast<nvtxDomainHandle_t>(nvtx_domain()), &attributes);
#endif
  notify(name_, true);
}

ScopedRange::~ScopedRange() {
  notify(name_, false);
#if HSS_HAVE_NVTX
  nvtxDomainRangePop(static_cast<nvtxDomainHandle_t>(nvtx_domain()));
#endif
}

}  // namespace detail
}  // namespace hss
