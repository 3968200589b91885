#include "phos/plugin/give_back.h"

#include "driver/driver_checkpoint.h"
#include "phos/plugin/log.h"
#include "phos/support/clock.h"

namespace phos::plugin {

Result<void> give_back_gpu_state(pid_t pid, uint32_t taken, const std::vector<agent::Allocation>& allocs,
                                 const std::vector<UniqueFd>& fds, int agent_timeout_ms,
                                 const std::function<Result<bool>(AgentClient&)>& before_resume,
                                 GiveBackTimes* times) {
  GiveBackTimes own;
  GiveBackTimes& took = times ? *times : own;
  Result<void> first;
  uint64_t t = monotonic_ns();
  auto lap = [&](uint64_t& into) {
    const uint64_t now = monotonic_ns();
    into += now - t;
    t = now;
  };
  auto keep = [&](Result<void> r) {
    if (!r) PHOS_ERR("process %d: %s", pid, r.error().message.c_str());
    if (!r && first.ok()) first = r;
  };
  if (taken & kDriverCheckpointed) {
    auto r = driver_restore_and_unlock(pid);
    // Restored but not unlocked (or restored by an earlier try): an unlock
    // alone, or the process would run on with its driver locked and hang at
    // its next CUDA call.
    if (!r && (taken & kDriverLocked)) {
      PHOS_WARN("process %d: %s; trying an unlock alone", pid, r.error().message.c_str());
      r = driver_unlock(pid);
    }
    keep(r);
  } else if (taken & kDriverLocked) {
    keep(driver_unlock(pid));
  }
  lap(took.driver_ns);
  if (taken & (kGateClosed | kMappingsReleased)) {
    keep(with_agent(pid, agent_timeout_ms, [&](AgentClient& c) -> Result<void> {
      if (taken & kMappingsReleased) {
        auto mapped = c.remap_all(allocs, fds);
        if (!mapped) return mapped.error();
      }
      lap(took.remap_ns);
      Result<bool> resume_now = before_resume ? before_resume(c) : Result<bool>(true);
      if (resume_now && !*resume_now) return {};
      PHOS_TRY(c.resume());
      if (!resume_now) return resume_now.error();
      return {};
    }));
    lap(took.resume_ns);
  }
  return first;
}

}  // namespace phos::plugin
