#include "checkpoint.h"

#include <time.h>

#include "driver_checkpoint.h"
#include "log.h"
#include "phos/images/format.h"
#include "phos/images/image_dir.h"
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
  auto status = client->status();
  if (!status) return status.error();
  if (!status->unsupported_calls.empty())
    return make_error("process " + std::to_string(pid) + " used " + join(status->unsupported_calls) +
                      ", which phos cannot checkpoint");

  uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  auto drained = client->quiesce(options_.quiesce_timeout_ms);
  if (!drained) return make_error("process " + std::to_string(pid) + ": quiesce: " + drained.error().message);
  // The gate is closed: from here on the process is ours to give back,
  // whatever fails (finish() does it).
  Target& t = targets_[pid];
  t.vpid = *vpid;
  t.hello = client->hello();
  t.status = *status;
  t.paused_at_ns = t0;
  t.manifest.statistics.quiesce_ns = *drained;
  PHOS_TRY(pause_target(pid, *client, t));
  PHOS_INFO("process %d (pid %d in its namespace): agent %s, gate closed in %.3f ms, %zu allocations%s", pid,
            t.vpid, t.hello.agent_version.c_str(), double(*drained) / 1e6, t.allocations.size(),
            t.driver_locked ? ", driver locked" : "");
  return true;
}

Result<void> Checkpointer::pause_target(pid_t pid, AgentClient& client, Target& t) {
  auto allocs = client.list_allocations(true, &t.fds);
  if (!allocs) return allocs.error();
  t.allocations = std::move(*allocs);
  if (!t.allocations.empty()) {
    if (!engine_) {
      auto engine = Engine::start(EngineSettings::from(options_));
      if (!engine) return engine.error();
      engine_ = std::move(*engine);
    }
    // Mapped into criu now; copied in the background, off criu's freeze
    // timer (PAUSE_DEVICES runs under it). criu's mapping keeps the memory,
    // so the process lets go of its own at once.
    auto job = engine_->prepare_save(dirfd_, t.vpid, t.allocations, t.fds, t.manifest);
    if (!job) return job.error();
    t.save = std::move(*job);
    t.copier = std::thread([this, &t] { t.copied = engine_->run_save(*t.save); });
    auto released = client.release_mappings(true);
    if (!released) return released.error();
    t.released = true;
  }
  PHOS_TRY(client.goodbye());
  if (t.status.cuda_initialized) {
    auto state = driver_state(pid);
    if (!state) {
      PHOS_INFO("process %d: no CUDA state for the driver to checkpoint (%s)", pid, state.error().message.c_str());
    } else if (*state == CU_PROCESS_STATE_RUNNING) {
      PHOS_TRY(driver_lock(pid, options_.quiesce_timeout_ms));
      t.driver_locked = true;
    }
  }
  return {};
}

Checkpointer::~Checkpointer() {
  for (auto& [pid, t] : targets_) (void)copy_done(t);
}

Result<void> Checkpointer::copy_done(Target& t) {
  if (t.copier.joinable()) t.copier.join();
  t.save.reset();
  return t.copied;
}

Result<bool> Checkpointer::checkpoint(pid_t pid) {
  auto it = targets_.find(pid);
  if (it == targets_.end()) return false;
  Target& t = it->second;
  PHOS_TRY(copy_done(t));
  if (t.driver_locked) {
    PHOS_TRY(driver_checkpoint(pid));
    t.driver_checkpointed = true;
  }
  image::Manifest& m = t.manifest;
  m.writer_version = std::string(image::writer_version());
  m.pid = t.vpid;
  m.protocol = image::Protocol::StopTheWorld;
  m.created_unix_ns = clock_ns(CLOCK_REALTIME);
  m.statistics.total_ns = clock_ns(CLOCK_MONOTONIC) - t.paused_at_ns;
  auto written = image::write_manifest(dirfd_, m);
  if (!written) return written.error();
  t.manifest_file = std::move(*written);
  PHOS_INFO("process %d: wrote %s (%zu allocations, %.1f MiB)", pid, image::manifest_file_name(t.vpid).c_str(),
            m.allocations.size(), double(m.statistics.raw_bytes) / (1 << 20));
  return true;
}

// Gives a process that lives on back what the dump took, in reverse order.
void Checkpointer::give_back(pid_t pid, Target& t) {
  uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  (void)copy_done(t);  // the engine's mapping goes before the process maps again
  if (t.driver_checkpointed) {
    if (auto r = driver_restore_and_unlock(pid); !r) PHOS_ERR("%s", r.error().message.c_str());
  } else if (t.driver_locked) {
    if (auto r = driver_unlock(pid); !r) PHOS_ERR("%s", r.error().message.c_str());
  }
  auto r = with_agent(pid, options_.agent_timeout_ms, [&](AgentClient& c) -> Result<void> {
    if (t.released) {
      auto mapped = c.remap_all(t.allocations, t.fds);
      if (!mapped) return mapped.error();
    }
    return c.resume();
  });
  if (!r)
    PHOS_ERR("process %d: could not give back its GPU state: %s", pid, r.error().message.c_str());
  else
    PHOS_INFO("process %d: gate reopened (device memory and driver state given back in %.1f ms)", pid,
              double(clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
}

void Checkpointer::finish(bool dump_succeeded) {
  for (auto& [pid, t] : targets_) {
    if (dump_succeeded && !t.manifest_file.empty()) {
      if (auto r = image::write_completion_marker(dirfd_, t.vpid, t.manifest_file); !r)
        PHOS_ERR("process %d: completion marker: %s", pid, r.error().message.c_str());
    } else if (auto r = image::remove_completion_marker(dirfd_, t.vpid); !r) {
      PHOS_ERR("process %d: %s", pid, r.error().message.c_str());
    }
    // Without --leave-running criu kills the process after this; giving its
    // state back first costs time but is always safe, and the plugin cannot
    // tell (criu's options are not visible to plugins).
    if (process_alive(pid)) give_back(pid, t);
    else (void)copy_done(t);
  }
  targets_.clear();
}

}  // namespace phos::plugin
