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
  std::unique_lock<std::mutex> lock(mu_);
  auto entry = [&]() -> NcclCommunicator* {
    for (NcclCommunicator& l : live_)
      if (l.handle == handle) return &l;
    return nullptr;
  };
  NcclCommunicator* c = entry();
  if (!c) return;
  if (c->stop_at && *c->stop_at == c->calls) {
    c->held = true;
    // The vector may change meanwhile: found again after each wake.
    stop_cv_.wait(lock, [&] {
      c = entry();
      return !c || !c->stop_at || *c->stop_at != c->calls;
    });
    if (!c) return;
    c->held = false;
  }
  c->calls++;
}

bool NcclCommunicators::arm_stop(uint64_t job_id, uint64_t at_call) {
  std::lock_guard<std::mutex> lock(mu_);
  bool armed = false;
  for (NcclCommunicator& l : live_)
    if (l.job_id == job_id && l.calls <= at_call) {
      l.stop_at = at_call;
      armed = true;
    }
  return armed;
}

void NcclCommunicators::disarm(uint64_t job_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (NcclCommunicator& l : live_)
      if (l.job_id == job_id) l.stop_at.reset();
  }
  stop_cv_.notify_all();
}

void NcclCommunicators::destroyed(uint64_t handle) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(live_, [&](const NcclCommunicator& l) { return l.handle == handle; });
  }
  stop_cv_.notify_all();
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
