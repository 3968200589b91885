#include "restore.h"

#include <signal.h>

#include "agent_client.h"
#include "log.h"
#include "proc.h"

namespace phos::plugin {

Result<void> Restorer::load() {
  auto pids = image::list_process_images(dirfd_);
  if (!pids) return pids.error();
  for (pid_t vpid : *pids) {
    auto img = image::open_process_image(dirfd_, vpid, /*require_complete=*/true);
    if (!img) return img.error();
    if (!img->manifest.allocations.empty())
      return make_error(img->manifest_name + ": has " + std::to_string(img->manifest.allocations.size()) +
                        " device allocations; this build of phos cannot restore device memory yet");
    PHOS_INFO("%s: %zu devices, %zu allocations, written by phos %s", img->manifest_name.c_str(),
              img->manifest.devices.size(), img->manifest.allocations.size(), img->manifest.writer_version.c_str());
    images_.emplace(vpid, std::move(*img));
  }
  return {};
}

Result<bool> Restorer::resume_late(pid_t pid) {
  auto vpid = ns_pid(pid);
  if (!vpid) return vpid.error();
  auto it = images_.find(*vpid);
  if (it == images_.end()) return false;

  auto r = with_agent(pid, options_.agent_timeout_ms, [&](AgentClient& c) -> Result<void> {
    if (c.hello().pid != *vpid)
      return make_error("agent reports pid " + std::to_string(c.hello().pid) + ", the image is for " +
                        std::to_string(*vpid));
    auto mapped = c.remap({}, {});
    if (!mapped) return mapped.error();
    return c.resume();
  });
  if (!r) {
    // CRIU only logs a failing RESUME_DEVICES_LATE and would let the process
    // run on without its GPU state: it must not run at all.
    PHOS_ERR("process %d: restore of GPU state failed: %s; killing it", pid, r.error().message.c_str());
    ::kill(pid, SIGKILL);
    return r.error();
  }
  PHOS_INFO("process %d (pid %d in its namespace): GPU state restored, gate open", pid, *vpid);
  return true;
}

}  // namespace phos::plugin
