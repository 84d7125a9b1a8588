#pragma once
// The device work of one store or retrieve call, grouped per (device, stream): every group is
// one launch (DevicePath::store_batch / restore_batch), or the single-job path when it holds one
// job (DevicePath::store / restore, which honour hidden_state_store_impl and
// hidden_state_restore_impl). The one place a call decides how its device jobs are launched is
// the caller of this grouping: Impl::copy_plans (stores) and Impl::restore_walks (restores).

#include <cstddef>
#include <utility>
#include <vector>

#include "hss/tensor.hpp"

namespace hss::detail {

/// The jobs of one (device, stream) and the call items (plans, walks) they came from.
template <typename Job>
struct LaunchGroup {
  int device_index = 0;
  Stream stream = nullptr;
  std::vector<Job> jobs;
  std::vector<size_t> items;  ///< one per job: the item it came from (repeats for several slots)
};

template <typename Job>
class LaunchGroups {
 public:
  /// Adds `job` of item `item` to the group of (device_index, stream).
  void add(int device_index, Stream stream, Job job, size_t item) {
    LaunchGroup<Job>* group = nullptr;
    for (auto& g : groups_) {  // an engine uses a handful of streams: a linear search
      if (g.device_index == device_index && g.stream == stream) {
        group = &g;
        break;
      }
    }
    if (group == nullptr) {
      groups_.push_back({device_index, stream, {}, {}});
      group = &groups_.back();
    }
    group->jobs.push_back(std::move(job));
    group->items.push_back(item);
  }

  [[nodiscard]] bool empty() const { return groups_.empty(); }
  [[nodiscard]] auto begin() { return groups_.begin(); }
  [[nodiscard]] auto end() { return groups_.end(); }

 private:
  std::vector<LaunchGroup<Job>> groups_;
};

}  // namespace hss::detail
