#include "phos/hooks/nccl_communicators.h"

#include <algorithm>

namespace phos::hooks {

void NcclCommunicators::created(const NcclCommunicator& c) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(live_, [&](const NcclCommunicator& l) { return l.handle == c.handle; });
  live_.push_back(c);
}

void NcclCommunicators::destroyed(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(live_, [&](const NcclCommunicator& l) { return l.handle == handle; });
}

std::optional<NcclCommunicator> NcclCommunicators::find(uint64_t handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(live_.begin(), live_.end(), [&](const NcclCommunicator& l) { return l.handle == handle; });
  if (it == live_.end()) return std::nullopt;
  return *it;
}

std::vector<NcclCommunicator> NcclCommunicators::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

size_t NcclCommunicators::spanning_processes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return size_t(std::count_if(live_.begin(), live_.end(),
                              [](const NcclCommunicator& l) { return l.nranks > 1 && !l.single_process; }));
}

}  // namespace phos::hooks
