#include "checkpoint.h"

#include <time.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "driver_checkpoint.h"
#include "give_back.h"
#include "log.h"
#include "phos/images/format.h"
#include "phos/images/image_dir.h"
#include "phos/plugin/proc.h"

namespace phos::plugin {
namespace {

uint64_t clock_ns(clockid_t clock) {
  struct timespec ts {};
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// Fault injection for tests, in the manner of CRIU's own (CRIU_FAULT):
// PHOS_FAULT=stall-after-checkpoint holds CHECKPOINT_DEVICES for 60 s, so a
// test can kill criu mid-dump at a known point.
bool fault(const char* name) {
  const char* v = std::getenv("PHOS_FAULT");
  return v && std::strcmp(v, name) == 0;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

Checkpointer::Checkpointer(int image_dirfd, PluginOptions options)
    : own_dir_(::fcntl(image_dirfd, F_DUPFD_CLOEXEC, 0)),
      dirfd_(own_dir_.valid() ? own_dir_.get() : image_dirfd),
      options_(options),
      write_behind_(options.write_behind && criu_leaves_running()) {
  if (write_behind_ && !own_dir_.valid()) {
    PHOS_WARN("cannot duplicate the image directory's fd (%s): no write-behind", std::strerror(errno));
    write_behind_ = false;
  }
  if (write_behind_)
    PHOS_INFO("criu leaves the processes running: their device memory is snapshotted on the GPU where it fits, "
              "and written while they run again (write_behind=auto)");
}

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

  // CUDA start-up in criu while the process still runs (gate open), and the
  // process's GPUs found in criu's own numbering.
  std::map<uint32_t, int> host_ordinal;
  if (status->allocation_count > 0) {
    PHOS_TRY(start_engine());
    auto ordinals = process_gpus(pid, *status);
    if (!ordinals) return ordinals.error();
    host_ordinal = std::move(*ordinals);
  }

  uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  auto drained = client->quiesce(options_.quiesce_timeout_ms);
  if (!drained) return make_error("process " + std::to_string(pid) + ": quiesce: " + drained.error().message);
  // The gate is closed: from here on the process is ours to give back,
  // whatever fails (finish() does it).
  start_keeper();
  Target& t = targets_[pid];
  taking(pid, t, kGateClosed);
  t.vpid = *vpid;
  t.hello = client->hello();
  t.status = *status;
  t.paused_at_ns = t0;
  t.host_ordinal = std::move(host_ordinal);
  t.manifest.statistics.quiesce_ns = *drained;
  PHOS_TRY(pause_target(pid, *client, t));
  PHOS_INFO("process %d (pid %d in its namespace): agent %s, gate closed in %.3f ms, %zu allocations%s", pid,
            t.vpid, t.hello.agent_version.c_str(), double(*drained) / 1e6, t.allocations.size(),
            (t.taken & kDriverLocked) ? ", driver locked" : "");
  return true;
}

Result<void> Checkpointer::pause_target(pid_t pid, AgentClient& client, Target& t) {
  auto allocs = client.list_allocations(true, &t.fds);
  if (!allocs) return allocs.error();
  t.allocations = std::move(*allocs);
  // Memory on a GPU the status before the gate closed did not name (allocated
  // in between): ask again, so that no device is taken at its ordinal.
  bool unnamed = false;
  for (const auto& a : t.allocations) unnamed = unnamed || !t.host_ordinal.count(a.device);
  if (unnamed) {
    auto status = client.status();
    if (!status) return status.error();
    if (!status->devices.empty()) {
      PHOS_TRY(start_engine());
      auto ordinals = process_gpus(pid, *status);
      if (!ordinals) return ordinals.error();
      t.host_ordinal = std::move(*ordinals);
    }
  }
  if (keeper_) {
    if (auto held = keeper_->hold(pid, t.allocations, t.fds); !held) {
      PHOS_WARN("phos-keeper: %s; going on without it", held.error().message.c_str());
      keeper_.reset();
    }
  }
  if (!t.allocations.empty()) {
    PHOS_TRY(start_engine());
    // Mapped into criu now; copied in the background, off criu's freeze
    // timer (PAUSE_DEVICES runs under it). criu's mapping keeps the memory,
    // so the process lets go of its own at once.
    auto job = engine_->prepare_save(dirfd_, t.vpid, t.allocations, t.fds, t.host_ordinal, t.manifest);
    if (!job) return job.error();
    t.save = std::move(*job);
    std::promise<bool> snapshotted;
    t.snapshotted = snapshotted.get_future();
    std::future<void> go = t.write_go.get_future();
    t.copier = std::thread([this, &t, want = write_behind_, snapshotted = std::move(snapshotted),
                            go = std::move(go)]() mutable {
      bool taken = false;
      if (want) {
        auto snap = engine_->snapshot(*t.save);
        if (!snap) PHOS_WARN("process %d: snapshot: %s; the image is written while the process is stopped", t.vpid,
                             snap.error().message.c_str());
        taken = snap && *snap;
      }
      snapshotted.set_value(taken);
      if (taken) go.wait();
      if (taken && t.abandoned) {
        t.copied = make_error("the dump failed; its image is not written", ECANCELED);
        return;
      }
      t.copied = engine_->run_save(*t.save);
    });
    taking(pid, t, kMappingsReleased);
    auto released = client.release_mappings(true);
    if (!released) return released.error();
  }
  PHOS_TRY(client.goodbye());
  if (t.status.cuda_initialized) {
    auto state = driver_state(pid);
    if (!state) {
      PHOS_INFO("process %d: no CUDA state for the driver to checkpoint (%s)", pid, state.error().message.c_str());
    } else if (*state == CU_PROCESS_STATE_RUNNING) {
      taking(pid, t, kDriverLocked);
      if (auto locked = driver_lock(pid, options_.quiesce_timeout_ms); !locked) {
        t.taken &= ~uint32_t(kDriverLocked);  // nothing to unlock
        if (maps_library(pid, "libcupti.so"))
          return make_error(locked.error().message + " (libcupti is loaded in the process: the driver refuses to "
                                                     "checkpoint a process CUPTI is subscribed in)", locked.error().code);
        return locked.error();
      }
    }
  }
  return {};
}

Checkpointer::~Checkpointer() {
  for (auto& [pid, t] : targets_) (void)copy_done(t);
}

void Checkpointer::let_write(Target& t) {
  if (t.write_go_given) return;
  t.write_go_given = true;
  t.write_go.set_value();
}

Result<void> Checkpointer::copy_done(Target& t) {
  let_write(t);
  if (t.copier.joinable()) t.copier.join();
  t.save.reset();
  return t.copied;
}

Result<bool> Checkpointer::checkpoint(pid_t pid) {
  auto it = targets_.find(pid);
  if (it == targets_.end()) return false;
  Target& t = it->second;
  // The driver checkpoint (~0.35 s, fixed) runs while the engine copies:
  // the process let go of its memory at PAUSE, so the two do not meet.
  if (t.taken & kDriverLocked) {
    taking(pid, t, kDriverCheckpointed);
    if (auto r = driver_checkpoint(pid); !r) {
      t.taken &= ~uint32_t(kDriverCheckpointed);  // still locked: an unlock gives it back
      return r.error();
    }
  }
  // Without device memory there is nothing to snapshot: the manifest waits
  // for criu's exit all the same, one rule for every leave-running dump.
  const bool has_memory = t.snapshotted.valid();
  if (write_behind_ && (!has_memory || t.snapshotted.get())) {
    // The image is finished at criu's exit (complete_pending); until then
    // this manifest, without allocations (the copier, which fills them in,
    // waits for exit(DUMP)) and without a completion marker, makes a restore
    // refuse the image rather than ignore the process.
    t.write_behind = true;
    PHOS_TRY(write_manifest(pid, t));
    PHOS_INFO("process %d: %s; the image is finished after the process runs again", pid,
              has_memory ? "device memory snapshotted" : "no device memory");
  } else {
    PHOS_TRY(copy_done(t));
    PHOS_TRY(write_manifest(pid, t));
  }
  if (fault("stall-after-checkpoint")) {
    PHOS_WARN("fault injection (PHOS_FAULT): stalling CHECKPOINT_DEVICES of %d for 60 s", pid);
    ::sleep(60);
  }
  return true;
}

Result<void> Checkpointer::write_manifest(pid_t pid, Target& t) {
  image::Manifest& m = t.manifest;
  m.writer_version = std::string(image::writer_version());
  m.pid = t.vpid;
  m.protocol = image::Protocol::kStopTheWorld;
  m.created_unix_ns = clock_ns(CLOCK_REALTIME);
  m.statistics.total_ns = clock_ns(CLOCK_MONOTONIC) - t.paused_at_ns;
  auto written = image::write_manifest(dirfd_, m);
  if (!written) return written.error();
  t.manifest_file = std::move(*written);
  PHOS_INFO("process %d: wrote %s (%zu allocations, %.1f MiB)", pid, image::manifest_file_name(t.vpid).c_str(),
            m.allocations.size(), double(m.statistics.raw_bytes) / (1 << 20));
  return {};
}

// Gives a process that lives on back what the dump took, in reverse order.
void Checkpointer::give_back(pid_t pid, Target& t, bool wait_copy) {
  uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  if (wait_copy) (void)copy_done(t);  // the engine's mapping goes before the process maps again
  auto r = give_back_gpu_state(pid, t.taken, t.allocations, t.fds, options_.agent_timeout_ms);
  if (!r) {
    PHOS_ERR("process %d: could not give back its GPU state: %s", pid, r.error().message.c_str());
    return;
  }
  t.taken = 0;
  if (keeper_) (void)keeper_->state(pid, 0);
  PHOS_INFO("process %d: gate reopened (device memory and driver state given back in %.1f ms)", pid,
            double(clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
}

void Checkpointer::taking(pid_t pid, Target& t, uint32_t step) {
  t.taken |= step;
  if (!keeper_) return;
  if (auto r = keeper_->state(pid, t.taken); !r) {
    PHOS_WARN("phos-keeper: %s; going on without it", r.error().message.c_str());
    keeper_.reset();
  }
}

Result<void> Checkpointer::start_engine() {
  if (engine_) return {};
  auto engine = Engine::start(EngineSettings::from(options_));
  if (!engine) return engine.error();
  engine_ = std::move(*engine);
  return {};
}

Result<std::map<uint32_t, int>> Checkpointer::process_gpus(pid_t pid, const agent::StatusReply& status) {
  auto host = engine_->host_gpus();
  if (!host) return host.error();
  auto ordinals = host_ordinals(status.devices, *host);
  if (!ordinals) return make_error("process " + std::to_string(pid) + ": " + ordinals.error().message, ENODEV);
  std::vector<int> warm;
  for (auto [theirs, ours] : *ordinals) {
    warm.push_back(ours);
    if (int(theirs) != ours)
      PHOS_INFO("process %d: its device %u is GPU %d here (%s; CUDA_VISIBLE_DEVICES)", pid, theirs, ours,
                format_gpu_uuid((*host)[size_t(ours)].uuid).c_str());
  }
  // An agent that names no UUIDs: the process's ordinals are taken as criu's.
  if (status.devices.empty())
    for (uint32_t d = 0; d < status.device_count; d++) warm.push_back(int(d));
  engine_->warm_up(warm);
  return ordinals;
}

void Checkpointer::start_keeper() {
  if (keeper_tried_) return;
  keeper_tried_ = true;
  auto k = KeeperLink::start(dirfd_, options_.agent_timeout_ms);
  if (!k) {
    PHOS_WARN("%s: if criu dies during this dump, paused processes stay paused", k.error().message.c_str());
    return;
  }
  keeper_.emplace(std::move(*k));
}

bool Checkpointer::finish(bool dump_succeeded) {
  bool pending = false;
  for (auto& [pid, t] : targets_) {
    if (dump_succeeded && t.write_behind) {
      // Its memory is in the snapshot: the process may run while the image
      // is written; the marker comes with the manifest (complete_pending).
      if (process_alive(pid)) give_back(pid, t, /*wait_copy=*/false);
      // The process holds its memory again: criu's fds must not keep what
      // it frees from now on.
      t.fds.clear();
      let_write(t);
      pending = true;
      continue;
    }
    // A failed dump: a snapshot not written yet never will be (the copier
    // skips it), so the process does not wait for a useless image.
    if (!dump_succeeded) t.abandoned = true;
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
  // Only the write-behind targets stay (complete_pending), without fds.
  std::erase_if(targets_, [](const auto& entry) { return !entry.second.write_behind || !entry.second.fds.empty(); });
  if (!pending) targets_.clear();
  if (keeper_) {
    if (auto r = keeper_->done(); !r) PHOS_WARN("phos-keeper: %s", r.error().message.c_str());
    keeper_.reset();
  }
  return pending;
}

Result<void> Checkpointer::complete_pending() {
  Result<void> first;
  for (auto& [pid, t] : targets_) {
    if (!t.write_behind) continue;
    uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
    Result<void> r = copy_done(t);
    if (r && fault("fail-write-behind")) r = make_error("fault injection (PHOS_FAULT): the write-behind fails", EIO);
    if (r) r = write_manifest(pid, t);
    if (r) r = image::write_completion_marker(dirfd_, t.vpid, t.manifest_file);
    if (!r) {
      PHOS_ERR("process %d: its image could not be written after it ran again: %s; the image is incomplete", pid,
               r.error().message.c_str());
      if (first.ok()) first = r;
      continue;
    }
    PHOS_INFO("process %d: image written behind the running process (criu waited %.1f ms for it at exit)", pid,
              double(clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
  }
  targets_.clear();
  return first;
}

}  // namespace phos::plugin
