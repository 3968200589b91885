#include "checkpoint.h"

#include <time.h>

#include "log.h"
#include "phos/images/format.h"
#include "phos/images/image_dir.h"
#include "phos/images/manifest.h"
#include "proc.h"

namespace phos::plugin {
namespace {

uint64_t clock_ns(clockid_t clock) {
  struct timespec ts {};
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

Result<bool> Checkpointer::pause(pid_t pid) {
  auto client = AgentClient::connect(pid, options_.agent_timeout_ms);
  if (!client) {
    if (client.error().code == ENOENT) {
      PHOS_INFO("process %d has no phos agent; left to other plugins", pid);
      return false;
    }
    return make_error("process " + std::to_string(pid) + ": " + client.error().message, client.error().code);
  }
  auto vpid = ns_pid(pid);
  if (!vpid) return vpid.error();

  Target t;
  t.vpid = *vpid;
  t.hello = client->hello();
  t.paused_at_ns = clock_ns(CLOCK_MONOTONIC);
  auto status = client->status();
  if (!status) return status.error();
  if (!status->unsupported_calls.empty())
    return make_error("process " + std::to_string(pid) + " used " + join(status->unsupported_calls) +
                      ", which phos cannot checkpoint");
  t.status = *status;

  auto drained = client->quiesce(options_.quiesce_timeout_ms);
  if (!drained) return make_error("process " + std::to_string(pid) + ": quiesce: " + drained.error().message);
  t.quiesce_ns = *drained;
  // The gate is closed: from here on the process is ours to reopen, whatever
  // fails, in finish() if not right here.
  Target& target = targets_[pid] = std::move(t);
  auto reopen_now = [&](const Error& e) {
    if (auto r = client->resume(); r.ok())
      targets_.erase(pid);
    else
      PHOS_WARN("process %d: reopening the gate now failed (%s); retrying at the end of the dump", pid,
                r.error().message.c_str());
    return e;
  };
  auto allocs = client->list_allocations(false, nullptr);
  if (!allocs) return reopen_now(allocs.error());
  if (!allocs->empty())
    return reopen_now(make_error("process " + std::to_string(pid) + " has " + std::to_string(allocs->size()) +
                                 " device allocations; this build of phos cannot checkpoint device memory yet"));
  target.allocations = std::move(*allocs);
  if (auto bye = client->goodbye(); !bye) return bye.error();

  PHOS_INFO("process %d (pid %d in its namespace): agent %s, gate closed in %.3f ms, %zu allocations", pid,
            target.vpid, target.hello.agent_version.c_str(), double(target.quiesce_ns) / 1e6,
            target.allocations.size());
  return true;
}

Result<bool> Checkpointer::checkpoint(pid_t pid) {
  auto it = targets_.find(pid);
  if (it == targets_.end()) return false;
  Target& t = it->second;
  image::Manifest m;
  m.writer_version = std::string(image::writer_version());
  m.pid = t.vpid;
  m.protocol = image::Protocol::StopTheWorld;
  m.created_unix_ns = clock_ns(CLOCK_REALTIME);
  m.statistics.quiesce_ns = t.quiesce_ns;
  m.statistics.total_ns = clock_ns(CLOCK_MONOTONIC) - t.paused_at_ns;
  auto written = image::write_manifest(dirfd_, m);
  if (!written) return written.error();
  t.manifest_file = std::move(*written);
  PHOS_INFO("process %d: wrote %s", pid, image::manifest_file_name(t.vpid).c_str());
  return true;
}

Result<void> Checkpointer::resume(pid_t pid) {
  return with_agent(pid, options_.agent_timeout_ms, [](AgentClient& c) { return c.resume(); });
}

void Checkpointer::finish(bool dump_succeeded) {
  for (auto& [pid, t] : targets_) {
    if (dump_succeeded && !t.manifest_file.empty()) {
      if (auto r = image::write_completion_marker(dirfd_, t.vpid, t.manifest_file); !r)
        PHOS_ERR("process %d: completion marker: %s", pid, r.error().message.c_str());
    } else if (auto r = image::remove_completion_marker(dirfd_, t.vpid); !r) {
      PHOS_ERR("process %d: %s", pid, r.error().message.c_str());
    }
    // The process may be killed by criu after this; opening its gate first is
    // harmless and keeps every process that lives on usable.
    if (!process_alive(pid)) continue;
    if (auto r = resume(pid); !r)
      PHOS_ERR("process %d: could not reopen its gate: %s", pid, r.error().message.c_str());
    else
      PHOS_INFO("process %d: gate reopened", pid);
  }
  targets_.clear();
}

}  // namespace phos::plugin
