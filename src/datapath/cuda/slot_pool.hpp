#pragma once
// A fixed set of reusable device resources (launch tables), each guarded by the event recorded
// after the last GPU work that used it.
//
// Slot states:  idle --acquire--> leased --record(stream)--> idle+pending --event done--> idle
//                                      \--lease dropped without record (error)--> idle
// * Every slot is created with the pool (when a device's state is), so acquire() never allocates.
// * acquire() hands out an idle slot whose event has finished; when every slot is pending it
//   waits for one event (outside the lock); when all are leased it waits for a lease to end.
// * A lease dropped without record() (an exception after enqueueing work) synchronises the
//   streams it touched before the slot is reused: no later user overwrites memory a DMA or kernel
//   still reads.
// Thread-safe.

#include <array>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "datapath/cuda/cuda_raii.hpp"
#include "hss/kernels/cuda_check.hpp"

namespace hss::detail::cuda {

template <typename Payload>
class SlotPool {
  struct Slot {
    // Blocking-sync: acquire() and synchronize() wait on it from the host.
    explicit Slot(Payload p) : payload(std::move(p)), done(Event::create(/*blocking_sync=*/true)) {}
    Payload payload;
    Event done;
    bool leased = false;
    bool pending = false;  // `done` recorded; the work may still run
  };

 public:
  /// Creates `slots` payloads with make() now (the caller's device must be current).
  SlotPool(size_t slots, const std::function<Payload()>& make) {
    slots_.reserve(slots);
    for (size_t i = 0; i < slots; ++i) slots_.push_back(std::make_unique<Slot>(make()));
  }
  ~SlotPool() { synchronize(); }
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  class Lease {
   public:
    Lease(SlotPool* pool, Slot* slot) : pool_(pool), slot_(slot) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      if (!recorded_) {
        for (int i = 0; i < touched_count_; ++i) {
          clear_own_error(cudaStreamSynchronize(touched_[i]));
        }
      }
      pool_->give_back(slot_, recorded_);
    }

    Payload& operator*() { return slot_->payload; }
    Payload* operator->() { return &slot_->payload; }
    /// Work using the slot is (about to be) enqueued on `stream`.
    void touch(cudaStream_t stream) {
      for (int i = 0; i < touched_count_; ++i) {
        if (touched_[i] == stream) return;
      }
      if (touched_count_ < static_cast<int>(touched_.size())) touched_[touched_count_++] = stream;
    }
    /// Marks the end of the slot's work: `stream` must be ordered after every use.
    void record(cudaStream_t stream) {
      HSS_CUDA_CHECK(cudaEventRecord(slot_->done.get(), stream));
      recorded_ = true;
    }
    /// Blocks until the recorded work has finished.
    void wait() { HSS_CUDA_CHECK(cudaEventSynchronize(slot_->done.get())); }

   private:
    SlotPool* pool_;
    Slot* slot_;
    std::array<cudaStream_t, 2> touched_{};
    int touched_count_ = 0;
    bool recorded_ = false;
  };

  /// `waited` is set when the host had to wait for a slot (every slot busy).
  [[nodiscard]] std::unique_ptr<Lease> acquire(bool* waited = nullptr) {
    std::unique_lock lock(mutex_);
    for (;;) {
      Slot* wait_for = nullptr;
      for (auto& slot : slots_) {
        if (slot->leased) continue;
        if (!slot->pending || event_finished(slot->done.get())) {
          return lease(*slot);
        }
        if (wait_for == nullptr) wait_for = slot.get();
      }
      if (waited != nullptr) *waited = true;
      if (wait_for != nullptr) {
        wait_for->leased = true;
        lock.unlock();
        auto held = std::make_unique<Lease>(this, wait_for);  // gives the slot back on a throw
        held->wait();
        return held;
      }
      released_.wait(lock);
    }
  }

  [[nodiscard]] size_t size() const { return slots_.size(); }

  /// The payload of slot `i` while no lease can exist yet (the device state's warm-up).
  [[nodiscard]] Payload& unleased(size_t i) { return slots_.at(i)->payload; }

  /// Calls fn(payload) for every idle slot whose work has completed (to drop what it kept alive).
  template <typename Fn>
  void sweep(Fn&& fn) {
    std::lock_guard lock(mutex_);
    for (auto& slot : slots_) {
      if (slot->leased) continue;
      if (slot->pending && !event_finished(slot->done.get())) continue;
      slot->pending = false;
      fn(slot->payload);
    }
  }

  /// Waits for every recorded event (best effort: errors are left to the next checked call).
  void synchronize() noexcept {
    std::lock_guard lock(mutex_);
    for (auto& slot : slots_) {
      if (slot->pending) clear_own_error(cudaEventSynchronize(slot->done.get()));
    }
  }

 private:
  std::unique_ptr<Lease> lease(Slot& slot) {
    slot.leased = true;
    slot.pending = false;
    return std::make_unique<Lease>(this, &slot);
  }
  void give_back(Slot* slot, bool pending) {
    {
      std::lock_guard lock(mutex_);
      slot->leased = false;
      slot->pending = pending;
    }
    released_.notify_one();
  }

  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace hss::detail::cuda
