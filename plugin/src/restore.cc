#include "restore.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

#include "driver_checkpoint.h"
#include "fault.h"
#include "log.h"
#include "phos/plugin/agent_client.h"
#include "phos/plugin/proc.h"

namespace phos::plugin {

Result<void> Restorer::load() {
  auto pids = image::list_process_images(dirfd_);
  if (!pids) return pids.error();
  for (pid_t vpid : *pids) {
    auto img = image::open_process_image(dirfd_, vpid, /*require_complete=*/true);
    if (!img) return img.error();
    // In place first: the load job keeps a pointer to the manifest.
    Loaded& l = images_.emplace(vpid, Loaded{std::move(*img), {}, {}, {}, {}, {}}).first->second;
    const image::Manifest& m = l.image.manifest;
    if (!m.devices.empty() || !m.allocations.empty()) {
      if (!engine_) {
        auto engine = Engine::start(EngineSettings::from(options_));
        if (!engine) return make_error(l.image.manifest_name + ": " + engine.error().message, engine.error().code);
        engine_ = std::move(*engine);
      }
      auto placement = engine_->place_devices(m, l.image.manifest_name, options_.gpu_map, l.host);
      if (!placement) return placement.error();
      l.placement = std::move(*placement);
      for (const auto& p : l.placement)
        if (p.moved())
          PHOS_INFO("%s: device %u (%s) restored onto GPU %d (%s)", l.image.manifest_name.c_str(), p.image_ordinal,
                    format_gpu_uuid(p.image_uuid).c_str(), p.host_ordinal, format_gpu_uuid(p.host_uuid).c_str());
      auto job = engine_->prepare_load(m, l.placement);
      if (!job) return make_error(l.image.manifest_name + ": " + job.error().message, job.error().code);
      l.job = std::move(*job);
    }
    PHOS_INFO("%s: %zu devices, %zu allocations, written by phos %s", l.image.manifest_name.c_str(),
              m.devices.size(), m.allocations.size(), m.writer_version.c_str());
  }
  if (engine_) {
    auto k = KeeperLink::start(dirfd_, options_.agent_timeout_ms);
    if (k)
      keeper_.emplace(std::move(*k));
    else
      PHOS_WARN("%s: if criu dies during this restore, a process it leaves half-restored stays", k.error().message.c_str());
    filler_ = std::thread([this] { fill_all(); });
  }
  return {};
}

Restorer::~Restorer() {
  if (filler_.joinable()) filler_.join();
  if (keeper_) (void)keeper_->done();
}

// The jobs are released by the thread that made them (resume), not here:
// criu clones restored tasks while this runs, and a free into the main
// thread's malloc arena could hold its lock at that moment.
void Restorer::fill_all() {
  if (fault("stall-in-fill")) {
    PHOS_WARN("fault injection (PHOS_FAULT): the fill of device memory holds for 60 s");
    ::sleep(60);
  }
  for (auto& [vpid, l] : images_) {
    if (!l.job) continue;
    auto fds = engine_->run_load(dirfd_, *l.job);
    if (!fds) {
      l.filled = make_error(l.image.manifest_name + ": " + fds.error().message, fds.error().code);
      continue;
    }
    l.fds = std::move(*fds);
  }
}

Result<void> Restorer::resume(pid_t pid, pid_t vpid, Loaded& l) {
  if (filler_.joinable()) filler_.join();  // all images filled (criu calls this hook one process at a time)
  l.job.reset();
  if (!l.filled) PHOS_ERR("cannot restore: %s", l.filled.error().message.c_str());
  PHOS_TRY(l.filled);
  // Not cuCheckpointProcessGetState: it hangs on a process criu holds stopped.
  if (!l.image.manifest.devices.empty() && has_driver_state(pid)) {
    // UUID pairs only when a GPU moves; then for every GPU (gpu_map.h).
    std::vector<CUcheckpointGpuPair> pairs;
    for (const auto& [from, to] : driver_gpu_pairs(l.placement, l.host)) {
      CUcheckpointGpuPair pair{};
      std::memcpy(pair.oldUuid.bytes, from.data(), 16);
      std::memcpy(pair.newUuid.bytes, to.data(), 16);
      pairs.push_back(pair);
    }
    const bool moved = !pairs.empty();
    PHOS_INFO("process %d: driver restore%s", pid, moved ? " onto the mapped GPUs" : "");
    PHOS_TRY(driver_restore_and_unlock(pid, pairs));
    PHOS_INFO("process %d: driver restored and unlocked", pid);
  }
  const auto& recorded = l.image.manifest.allocations;
  std::vector<agent::Allocation> allocs(recorded.begin(), recorded.end());  // without their chunks
  return with_agent(pid, options_.agent_timeout_ms, [&](AgentClient& c) -> Result<void> {
    if (c.hello().pid != vpid)
      return make_error("agent reports pid " + std::to_string(c.hello().pid) + ", the image is for " +
                        std::to_string(vpid));
    auto mapped = c.remap_all(allocs, l.fds);
    if (!mapped) return mapped.error();
    PHOS_INFO("process %d: %.1f MiB mapped at the original addresses", pid, double(*mapped) / (1 << 20));
    return c.resume();
  });
}

Result<bool> Restorer::resume_late(pid_t pid) {
  auto vpid = ns_pid(pid);
  if (!vpid) return vpid.error();
  auto it = images_.find(*vpid);
  if (it == images_.end()) return false;
  if (keeper_) (void)keeper_->restoring(pid, false);
  if (auto r = resume(pid, *vpid, it->second); !r) {
    // CRIU only logs a failing RESUME_DEVICES_LATE and would let the process
    // run on without its GPU state: it must not run at all.
    PHOS_ERR("process %d: restore of GPU state failed: %s; killing it", pid, r.error().message.c_str());
    ::kill(pid, SIGKILL);
    failed_ = true;
    return r.error();
  }
  it->second.fds.clear();
  if (keeper_) (void)keeper_->restoring(pid, true);
  PHOS_INFO("process %d (pid %d in its namespace): GPU state restored, gate open", pid, *vpid);
  return true;
}

}  // namespace phos::plugin
