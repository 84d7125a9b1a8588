#pragma once
// The proof that a store's index mutex is held. The mutex (StoreState, store_state.hpp) is
// private; StoreState::lock_index() is the one way to take it, and it answers with an IndexLock.
// Every function that reads or changes what the mutex guards (the index, the entries' states,
// `closed`, the call guards) takes `const IndexLock&`: calling one without the lock does not
// compile, where a `_locked` suffix was only a convention. Held for index updates only: never
// across a copy, a launch, I/O or a KV contains() call (docs/design.md, "What may run
// concurrently and what may block the host").

#include <mutex>

namespace hss::detail {

class StoreState;

class IndexLock {
 public:
  IndexLock(const IndexLock&) = delete;
  IndexLock& operator=(const IndexLock&) = delete;
  IndexLock(IndexLock&&) = delete;
  IndexLock& operator=(IndexLock&&) = delete;
  ~IndexLock() = default;

 private:
  friend class StoreState;
  // Returned as a prvalue by StoreState::lock_index() (guaranteed elision: never moved).
  explicit IndexLock(std::mutex& mutex) : lock_(mutex) {}
  std::lock_guard<std::mutex> lock_;
};

}  // namespace hss::detail
