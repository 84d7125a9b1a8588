#include "tiers/disk/file_read_ahead.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "hss/error.hpp"

namespace hss::detail {

FileReadAhead::FileReadAhead(size_t count, int readers, ReadFile read, AlignedBufferCache* buffers)
    : count_(count), read_(std::move(read)), buffers_(buffers) {
  if (readers < 1) {
    throw InvalidArgument("FileReadAhead: readers must be >= 1, got " + std::to_string(readers));
  }
  const size_t threads = std::min(static_cast<size_t>(readers), count);
  slots_.resize(threads + 1);
  for (size_t s = 0; s < slots_.size(); ++s) {
    slots_[s].item = s;
    if (buffers_ != nullptr) slots_[s].buffer = buffers_->take();
  }
  try {
    for (size_t t = 0; t < threads; ++t) readers_.emplace_back([this] { run(); });
  } catch (...) {
    stop();  // the readers already started, before the error leaves the constructor
    give_back_buffers();
    throw;
  }
}

FileReadAhead::~FileReadAhead() {
  stop();
  give_back_buffers();
}

void FileReadAhead::give_back_buffers() noexcept {
  if (buffers_ == nullptr) return;
  for (Slot& slot : slots_) buffers_->give_back(std::move(slot.buffer));
}

void FileReadAhead::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (std::thread& t : readers_) t.join();
  readers_.clear();
}

void FileReadAhead::run() {
  while (true) {
    size_t item = 0;
    Slot* slot = nullptr;
    {
      std::unique_lock lock(mutex_);
      if (stopping_ || failure_ || claimed_ >= count_) return;  // nothing read past a failure
      item = claimed_++;
      slot = &slots_[item % slots_.size()];
      changed_.wait(lock, [&] {
        return stopping_ || (slot->state == SlotState::kFree && slot->item == item);
      });
      if (stopping_) return;
    }
    // The slot is this reader's alone until it is marked filled: read without the lock.
    FileRead result;
    std::exception_ptr error;
    try {
      result = read_(item, slot->buffer);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      slot->read = result;
      slot->error = error;
      slot->state = SlotState::kFilled;
      if (error && !failure_) failure_ = error;
    }
    changed_.notify_all();
  }
}

FileReadAhead::Item FileReadAhead::next() {
  if (taken_ >= count_) {
    throw InvalidArgument("FileReadAhead::next: all " + std::to_string(count_) +
                          " items were taken");
  }
  Slot& slot = slots_[taken_ % slots_.size()];
  std::unique_lock lock(mutex_);
  if (taken_ > 0) {  // the previous item is done with: its slot takes the item `slots` later
    Slot& previous = slots_[(taken_ - 1) % slots_.size()];
    previous.state = SlotState::kFree;
    previous.item += slots_.size();
    changed_.notify_all();
  }
  // An item no reader will take on (claimed after a failure) gets the failure instead.
  changed_.wait(lock, [&] {
    return slot.state == SlotState::kFilled || (failure_ && taken_ >= claimed_);
  });
  if (slot.state != SlotState::kFilled) std::rethrow_exception(failure_);
  slot.state = SlotState::kInUse;
  ++taken_;
  if (slot.error) std::rethrow_exception(slot.error);
  return Item{slot.read, &slot.buffer};
}

}  // namespace hss::detail
