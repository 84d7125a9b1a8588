#include "base/heap_resource.hpp"

#include <cstddef>
#include <new>

namespace hss::detail {

namespace {

class HeapResource final : public std::pmr::memory_resource {
 private:
  void* do_allocate(size_t bytes, size_t alignment) override {
    if (alignment <= __STDCPP_DEFAULT_NEW_ALIGNMENT__) return ::operator new(bytes);
    return ::operator new(bytes, std::align_val_t(alignment));
  }
  // Unsized deletes: clang 14 declares the sized ones only with -fsized-deallocation.
  void do_deallocate(void* p, size_t bytes, size_t alignment) noexcept override {
    (void)bytes;
    if (alignment <= __STDCPP_DEFAULT_NEW_ALIGNMENT__) {
      ::operator delete(p);
    } else {
      ::operator delete(p, std::align_val_t(alignment));
    }
  }
  [[nodiscard]] bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return dynamic_cast<const HeapResource*>(&other) != nullptr;
  }
};

}  // namespace

std::pmr::memory_resource* heap_resource() noexcept {
  static HeapResource heap;  // trivially destructible state: safe from any static destructor
  return &heap;
}

}  // namespace hss::detail
