#pragma once
// HSS_ADDRESS_SANITIZER is defined (to 1) in a build with AddressSanitizer, by gcc
// (__SANITIZE_ADDRESS__) or clang (__has_feature): the pools that recycle memory themselves
// (entry_pool.hpp, node_pool.hpp) poison or bypass it there, and their tests check that.

#if defined(__SANITIZE_ADDRESS__)
#define HSS_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HSS_ADDRESS_SANITIZER 1
#endif
#endif
