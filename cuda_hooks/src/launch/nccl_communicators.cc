#include "phos/hooks/nccl_communicators.h"

#include <algorithm>

namespace phos::hooks {

void NcclCommunicators::created(const NcclCommunicator& c) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(live_, [&](const NcclCommunicator& l) { return l.handle == c.handle; });
  live_.push_back(c);
}

// FNV-1a (64 bits): a name, not a defence; the ids are NCCL's own random
// bytes.
uint64_t nccl_job_id(const void* unique_id, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ static_cast<const unsigned char*>(unique_id)[i]) * 0x100000001b3ull;
  return h;
}

uint64_t nccl_split_job_id(uint64_t parent_job, int color) {
  unsigned char bytes[12];
  for (int i = 0; i < 8; i++) bytes[i] = static_cast<unsigned char>(parent_job >> (8 * i));
  for (int i = 0; i < 4; i++) bytes[8 + i] = static_cast<unsigned char>(uint32_t(color) >> (8 * i));
  return nccl_job_id(bytes, sizeof(bytes));
}

void NcclCommunicators::count_call(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  for (NcclCommunicator& l : live_)
    if (l.handle == handle) {
      l.calls++;
      return;
    }
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
