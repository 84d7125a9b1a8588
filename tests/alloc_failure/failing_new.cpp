#include "failing_new.hpp"

#include <cstddef>
#include <cstdlib>
#include <new>

namespace hss::alloc_failure {
namespace {

// Plain globals: the replaced operator new may run before any constructor of this file.
bool g_active = false;
bool g_fired = false;
uint64_t g_count = 0;
uint64_t g_fail_at = 0;

void* allocate(std::size_t size, std::size_t alignment) {
  if (g_active) {
    ++g_count;
    if (g_fail_at != 0 && g_count == g_fail_at && !g_fired) {
      g_fired = true;
      throw std::bad_alloc();
    }
  }
  if (size == 0) size = 1;
  void* p = nullptr;
  if (alignment > alignof(std::max_align_t)) {
    if (::posix_memalign(&p, alignment, size) != 0) p = nullptr;
  } else {
    p = std::malloc(size);
  }
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* allocate_nothrow(std::size_t size, std::size_t alignment) noexcept {
  try {
    return allocate(size, alignment);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

}  // namespace

void arm(uint64_t fail_at) {
  g_count = 0;
  g_fail_at = fail_at;
  g_fired = false;
  g_active = true;
}

uint64_t disarm() {
  g_active = false;
  return g_count;
}

bool fired() { return g_fired; }

Pause::Pause() : was_active_(g_active) { g_active = false; }
Pause::~Pause() { g_active = was_active_; }

}  // namespace hss::alloc_failure

namespace af = hss::alloc_failure;
constexpr std::size_t kDefaultAlign = alignof(std::max_align_t);

void* operator new(std::size_t size) { return af::allocate(size, kDefaultAlign); }
void* operator new[](std::size_t size) { return af::allocate(size, kDefaultAlign); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return af::allocate_nothrow(size, kDefaultAlign);
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return af::allocate_nothrow(size, kDefaultAlign);
}
void* operator new(std::size_t size, std::align_val_t al) {
  return af::allocate(size, static_cast<std::size_t>(al));
}
void* operator new[](std::size_t size, std::align_val_t al) {
  return af::allocate(size, static_cast<std::size_t>(al));
}
void* operator new(std::size_t size, std::align_val_t al, const std::nothrow_t&) noexcept {
  return af::allocate_nothrow(size, static_cast<std::size_t>(al));
}
void* operator new[](std::size_t size, std::align_val_t al, const std::nothrow_t&) noexcept {
  return af::allocate_nothrow(size, static_cast<std::size_t>(al));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
