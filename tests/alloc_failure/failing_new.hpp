#pragma once
// A global operator new (all forms, this executable only) that can be told to throw
// std::bad_alloc at the Nth allocation from now. Single-threaded use: the sweep forks a child per
// N.

#include <cstdint>

namespace hss::alloc_failure {

/// Starts counting allocations; the `fail_at`-th one (1-based) throws std::bad_alloc, once.
/// fail_at = 0 counts without failing.
void arm(uint64_t fail_at);
/// Stops counting and failing; returns the allocations counted since arm().
uint64_t disarm();
/// True once the armed failure has been thrown.
bool fired();

/// Suspends counting and failing for its lifetime (the checker's own allocations).
class Pause {
 public:
  Pause();
  ~Pause();
  Pause(const Pause&) = delete;
  Pause& operator=(const Pause&) = delete;

 private:
  bool was_active_;
};

}  // namespace hss::alloc_failure
