#include "dump/checkpoint.h"

#include <time.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "driver/cuda_api.h"
#include "driver/driver_checkpoint.h"
#include "common/fault.h"
#include "phos/plugin/give_back.h"
#include "phos/plugin/log.h"
#include "phos/images/format.h"
#include "phos/images/image_dir.h"
#include "phos/images/parent_index.h"
#include "phos/plugin/ipc_sharing.h"
#include "phos/plugin/job_store.h"
#include "phos/plugin/proc.h"
#include "phos/plugin/sum_check.h"
#include "phos/plugin/window_report.h"
#include "phos/support/tcp_store_client.h"

namespace phos::plugin {
namespace {

uint64_t clock_ns(clockid_t clock) {
  struct timespec ts {};
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// Whether the process's status named its device `ordinal` (an agent that
// names no UUIDs: its device count).
bool names_device(const agent::StatusReply& status, uint32_t ordinal) {
  if (status.devices.empty()) return ordinal < status.device_count;
  for (const auto& d : status.devices)
    if (d.ordinal == ordinal) return true;
  return false;
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
  if (const auto& job = job_run_of_process(); job && *job) job_ = **job;
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
  if (fault("slow-pause-devices")) {
    PHOS_WARN("fault injection (PHOS_FAULT): PAUSE_DEVICES of %d holds for 3 s", pid);
    ::sleep(3);
  }
  auto vpid = ns_pid(pid);
  if (!vpid) return vpid.error();
  auto status = client->status();
  if (!status) return status.error();
  // A process that started CUDA but holds no device memory (torchrun's
  // agent) comes before the ranks it started in criu's order: criu's own
  // CUDA start-up (cuInit, then a context per GPU: 270 ms in all for two
  // H200s) begins here, on a thread of its own, not at the ranks' hold,
  // which waited 87 ms for it (on the GPUs of the processes of criu's tree
  // that hold device memory; none: nothing).
  if (status->cuda_initialized && status->allocation_count == 0 && !engine_warming_.valid() && !engine_)
    if (auto with_memory = statuses_with_memory(pid); !with_memory.empty())
      warm_up_engine(std::move(with_memory), "ahead of the processes that hold device memory");
  if (const auto* c = spanning_communicator(*status); c && job_) {
    PHOS_TRY(check_job_rank(pid, *c));
  } else if (c && !c->held) {
    // The agent serves one connection at a time: ours closes while the
    // job's ranks, this one among them, are held.
    (void)client->goodbye();
    PHOS_TRY(hold_nccl_job(pid, *c));
    client = AgentClient::connect(pid, options_.agent_timeout_ms);
    if (!client) return make_error("process " + std::to_string(pid) + ": " + client.error().message);
    status = client->status();
    if (!status) return status.error();
  }
  if (!status->unsupported_calls.empty())
    return make_error("process " + std::to_string(pid) + " used " + join(status->unsupported_calls) +
                      ", which phos cannot checkpoint");

  Target& t = targets_[pid];
  t.vpid = *vpid;
  t.hello = client->hello();
  t.status = *status;
  // CUDA start-up in criu while the process still runs (gate open), and the
  // process's GPUs found in criu's own numbering; or, where nothing needs
  // it before the gate closes, beside the gate and the driver's checkpoint.
  if (status->allocation_count > 0 && options_.migrate_to.empty() && engine_may_wait(pid, t) &&
      !recopy_wanted(pid, t)) {
    t.engine_deferred = true;
    warm_up_engine({*status}, "beside the process's gate and the driver's checkpoint", status->allocated_bytes);
  } else if (status->allocation_count > 0) {
    auto started = start_engine();
    auto ordinals = started ? process_gpus(pid, *status) : Result<std::map<uint32_t, int>>(started.error());
    if (!ordinals) {
      targets_.erase(pid);  // nothing taken yet
      return ordinals.error();
    }
    t.host_ordinal = std::move(*ordinals);
  }
  if (!options_.migrate_to.empty()) {
    if (auto planned = plan_migration(pid, t); !planned) {
      targets_.erase(pid);  // nothing taken yet
      return planned.error();
    }
  }
  if (!t.engine_deferred && recopy_wanted(pid, t)) {
    if (auto r = first_pass(pid, *client, t); !r) {
      // The process runs (its gate is open again, or never closed): the
      // dump goes on as a stopped one.
      PHOS_WARN("process %d: no soft recopy (%s); its memory is copied while it is stopped", pid,
                r.error().message.c_str());
      discard_first_pass(t);
    }
  }
  // Not a job's rank: held already (nothing runs beside the listing), and
  // its NCCL release at the gate frees most of what a listing would find.
  if (!t.recopy() && status->allocation_count > 0 && !spanning_communicator(*status)) list_ahead(pid, *client, t);
  // phos-keeper's start (a process) is off the stall too; it holds nothing
  // until the gate is closed.
  start_keeper();
  PHOS_INFO("process %d: closing its gate%s", pid, t.recopy() ? " for soft recopy's final pass" : "");
  uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  auto drained = client->quiesce(options_.quiesce_timeout_ms);
  if (!drained) {
    if (t.recopy()) {
      (void)client->close_copy_window();
      discard_first_pass(t);
    }
    targets_.erase(pid);  // nothing taken (the agent reopened the gate)
    return make_error("process " + std::to_string(pid) + ": quiesce: " + drained.error().message);
  }
  // The gate is closed: from here on the process is ours to give back,
  // whatever fails (finish() does it).
  start_keeper();
  taking(pid, t, kGateClosed);
  t.paused_at_ns = t0;
  t.manifest.statistics.gate_closed_unix_ns = clock_ns(CLOCK_REALTIME);
  t.manifest.statistics.quiesce_ns = drained->drained_ns;
  t.nccl_release_ns = drained->nccl_released ? drained->nccl_release_ns : 0;
  t.manifest.fill_order = drained->touch_order;
  if (drained->at_step) PHOS_INFO("process %d: gate closed at the program's iteration boundary (phos_step)", pid);
  // Only this closing's: a first pass's list went stale when the gate reopened.
  t.dead = std::move(drained->dead);
  if (drained->dead_dropped_calls)
    PHOS_INFO("process %d: its allocator's free blocks not used: %llu CUDA calls of other threads between its "
              "taking them and the gate closing; all its memory is stored",
              pid, (unsigned long long)drained->dead_dropped_calls);
  if (drained->nccl_released)
    PHOS_INFO("process %d: %u NCCL communicator(s) released in %.1f ms (made again when the gate opens)", pid,
              drained->nccl_released, double(drained->nccl_release_ns) / 1e6);
  PHOS_TRY(pause_target(pid, *client, t));
  t.paused_done_ns = clock_ns(CLOCK_MONOTONIC);
  PHOS_INFO("process %d (pid %d in its namespace): agent %s, gate closed in %.3f ms, %zu allocations%s", pid,
            t.vpid, t.hello.agent_version.c_str(), double(drained->drained_ns) / 1e6, t.allocations.size(),
            (t.taken & kDriverLocked) ? ", driver locked" : "");
  return true;
}

// Exporting every allocation's fd is the slow part of listing them (56-70
// ms for the 8B server's 203): done while the process runs, it is off the
// stall wherever the process allocates or frees nothing before its gate
// closes. A listing that fails here is only done again at the gate.
void Checkpointer::list_ahead(pid_t pid, AgentClient& client, Target& t) {
  auto allocs = client.list_allocations(true, &t.ahead_fds);
  if (!allocs) {
    t.ahead_fds.clear();
    return;
  }
  t.ahead = std::move(*allocs);
  if (fault("stale-ahead") && !t.ahead.empty()) {
    PHOS_WARN("fault injection (PHOS_FAULT): the listing ahead of process %d's gate drops its last allocation", pid);
    t.ahead.pop_back();
    t.ahead_fds.pop_back();
  }
  // The same for mapping them into criu (a migration maps elsewhere; a
  // deferred engine is not up, and its thread may be assigning engine_).
  if (t.migrate || t.engine_deferred || !engine_) return;
  std::vector<agent::Allocation> own;
  std::vector<UniqueFd> own_fds;
  if (!own_allocations(t.ahead, t.ahead_fds, &own, &own_fds)) return;
  auto mapped = engine_->map_ahead(own, own_fds, t.host_ordinal);
  if (!mapped) {
    PHOS_INFO("process %d: its allocations not mapped into criu ahead (%s): mapped at the gate", pid,
              mapped.error().message.c_str());
    return;
  }
  t.mapped_ahead = std::move(*mapped);
  // The copy's staging, too: made at the gate, it slowed criu's own work
  // inside the stall (Engine::prepare_rings).
  engine_->prepare_rings(t.mapped_ahead, pid);
}

Result<void> Checkpointer::list_allocations(pid_t pid, AgentClient& client, Target& t) {
  t.fds.clear();  // an earlier listing's (a first pass given up)
  Result<std::vector<agent::Allocation>> allocs = make_error("not listed", ENODATA);
  if (!t.ahead.empty()) {
    // Without fds the listing is cheap: the same allocations keep the fds
    // exported ahead.
    allocs = client.list_allocations(false, nullptr);
    if (allocs && *allocs == t.ahead) {
      t.fds = std::move(t.ahead_fds);
      t.listed_ahead = true;
    } else if (allocs) {
      PHOS_INFO("process %d: its allocations changed after they were listed ahead (%zu then, %zu at the gate): listed "
                "again with their fds", pid, t.ahead.size(), allocs->size());
      allocs = make_error("changed", ENODATA);
      t.mapped_ahead.release();
    }
    t.ahead.clear();
    t.ahead_fds.clear();
  }
  if (!allocs) allocs = client.list_allocations(true, &t.fds);
  if (!allocs) return allocs.error();
  t.allocations = std::move(*allocs);
  PHOS_TRY(own_allocations(t.allocations, t.fds, &t.own_allocations, &t.own_fds));
  if (size_t shared = t.allocations.size() - t.own_allocations.size())
    PHOS_INFO("process %d: %zu CUDA IPC mapping(s) of other processes' memory: their owners' images store it", pid,
              shared);
  // Memory on a GPU the status before the gate closed did not name (allocated
  // in between): ask again, so that no device is taken at its ordinal.
  bool unnamed = false;
  for (const auto& a : t.allocations)
    unnamed = unnamed || (t.engine_deferred ? !names_device(t.status, a.device) : !t.host_ordinal.count(a.device));
  if (unnamed) {
    auto status = client.status();
    if (!status) return status.error();
    if (t.engine_deferred) {
      // Its copier finds them in criu's numbering once criu's CUDA is up.
      t.status.devices = status->devices;
      t.status.device_count = status->device_count;
    } else if (!status->devices.empty()) {
      PHOS_TRY(start_engine());
      auto ordinals = process_gpus(pid, *status);
      if (!ordinals) return ordinals.error();
      t.host_ordinal = std::move(*ordinals);
    }
  }
  return {};
}

Result<void> Checkpointer::pause_target(pid_t pid, AgentClient& client, Target& t) {
  if (t.recopy()) PHOS_TRY(end_first_window(pid, client, t));
  PHOS_TRY(list_allocations(pid, client, t));
  t.listed_at_ns = clock_ns(CLOCK_MONOTONIC);
  if (t.migrate) PHOS_TRY(check_migration(pid, t));
  if (t.recopy() && t.save->allocs != t.own_allocations) {
    PHOS_WARN("process %d: its allocations changed while soft recopy's first pass ran; its memory is copied while "
              "it is stopped", pid);
    discard_first_pass(t);
  }
  if (keeper_) {
    if (auto held = keeper_->hold(pid, t.allocations, t.fds); !held) {
      PHOS_WARN("phos-keeper: %s; going on without it", held.error().message.c_str());
      keeper_.reset();
    }
    t.kept_at_ns = clock_ns(CLOCK_MONOTONIC);
  }
  if (!t.own_allocations.empty() && !t.engine_deferred) {
    PHOS_TRY(start_engine());
    // Mapped into criu now; copied in the background, off criu's freeze
    // timer (PAUSE_DEVICES runs under it). criu's mapping keeps the memory,
    // so the process lets go of its own at once. Soft recopy mapped it
    // before its first pass: the same job goes on.
    if (!t.recopy()) {
      const bool had_ahead = !t.mapped_ahead.empty();
      auto job = engine_->prepare_save(dirfd_, t.vpid, t.own_allocations, t.own_fds, t.host_ordinal, t.manifest,
                                       sink(t), &t.mapped_ahead);
      t.mapped_at_gate = !had_ahead || !t.mapped_ahead.empty();
      t.mapped_ahead.release();  // not taken: not what was saved
      if (!job) return job.error();
      t.save = std::move(*job);
      PHOS_TRY(use_parent(t));
    }
    engine_->set_dead(*t.save, t.dead);
    for (int d : std::set<int>(t.save->devices.begin(), t.save->devices.end()))
      t.pool_need[d] = engine_->pool_need(*t.save, d);
    t.mapped_at_ns = clock_ns(CLOCK_MONOTONIC);
  }
  if (!t.own_allocations.empty()) {
    std::promise<CopyPlan> decided;
    t.plan = decided.get_future().share();
    std::future<void> go = t.write_go.get_future();
    // Memory other processes map (CUDA IPC) is copied once every process
    // of the tree is paused: until then they may still write it.
    const bool wait_tree = !t.status.ipc_exports.empty();
    t.copier = std::thread([this, pid, &t, want = write_behind_, decided = std::move(decided), go = std::move(go),
                            wait_tree, tree_paused = tree_paused_]() mutable {
      if (t.engine_deferred) {
        if (auto r = prepare_deferred_save(pid, t); !r) {
          decided.set_value(CopyPlan{});
          t.copied = r.error();
          return;
        }
      }
      if (wait_tree) {
        tree_paused.wait();
        if (t.abandoned) {
          decided.set_value(CopyPlan{});
          t.copied = make_error("the dump failed; its image is not written", ECANCELED);
          return;
        }
      }
      const CopyPlan plan = want ? choose_copy(t) : CopyPlan{};
      if (plan.protocol != CopyProtocol::kSoftCopyOnWrite) t.no_pool = true;  // before the plan is seen
      decided.set_value(plan);
      if (plan.error) {  // the dump fails with it (CHECKPOINT_DEVICES waits for the copy)
        t.copied = *plan.error;
        return;
      }
      if (t.abandoned) {  // choose_copy waited for the tree, and the dump failed meanwhile
        t.copied = make_error("the dump failed; its image is not written", ECANCELED);
        return;
      }
      // A copy-on-write copy waits for the process to run again too, unless
      // cow_start=pause (it then competes with criu and the driver during
      // the stall).
      if (plan.snapshot ||
          (plan.protocol == CopyProtocol::kSoftCopyOnWrite && options_.cow_start == PluginOptions::CowStart::kResume)) {
        go.wait();
        if (t.abandoned) {
          t.copied = make_error("the dump failed; its image is not written", ECANCELED);
          return;
        }
      } else if (plan.protocol == CopyProtocol::kSoftCopyOnWrite) {
        wait_stopped_copies(t, tree_paused);
      }
      t.copied = engine_->run_save(*t.save);
      t.validated = t.save->checked;
      if (t.copied) t.kept = Engine::take_kept(*t.save);
      if (t.recopy()) {
        t.manifest.statistics.recopied_bytes = t.save->recopied_chunks * t.manifest.chunk_size;
        t.manifest.statistics.final_pass_ns = clock_ns(CLOCK_MONOTONIC) - t.paused_at_ns;
      }
    });
  }
  // IPC mappings too: the driver must find no device memory in the process.
  if (!t.allocations.empty()) {
    taking(pid, t, kMappingsReleased);
    auto released = client.release_mappings(true);
    if (!released) return released.error();
    t.released_at_ns = clock_ns(CLOCK_MONOTONIC);
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

bool Checkpointer::recopy_wanted(pid_t pid, const Target& t) {
  if (!options_.recopy || write_behind_ || criu_leaves_running() || t.status.allocation_count == 0) return false;
  if (t.migrate && t.migrate->in_place) return false;  // nothing is copied
  if (t.status.allocated_bytes < (uint64_t(options_.recopy_min_mib) << 20)) {
    PHOS_INFO("process %d: no soft recopy: %.1f MiB of device memory, under recopy_min_mib=%u: copied while it is "
              "stopped, beside the driver's checkpoint",
              pid, double(t.status.allocated_bytes) / (1 << 20), options_.recopy_min_mib);
    return false;
  }
  // Its gate opened for the first pass, a process makes its NCCL
  // communicators again, and its final pass must release them once more: a
  // job's ranks, held at one call meanwhile, could not meet for that rebuild
  // (the final quiesce refused: "still being made again"). Held, such a
  // process does not run while the first pass copies anyway.
  if (!t.status.nccl_communicators.empty()) {
    PHOS_INFO("process %d: no soft recopy: it has %zu NCCL communicator(s), which its first pass would make again "
              "before the final one releases them; its memory is copied while it is stopped",
              pid, t.status.nccl_communicators.size());
    return false;
  }
  // A launch with a set not trusted marks every chunk dirty: the first pass
  // would be copied again whole.
  if (options_.cow_trust == agent::CopyTrust::kValidated && !t.status.validation_active) {
    PHOS_INFO("process %d: no soft recopy: cow_trust=validated, but no validator runs in it (start it with "
              "PHOS_VALIDATE=ptx, or set cow_trust=speculated); its memory is copied while it is stopped", pid);
    return false;
  }
  return true;
}

// Whether criu's CUDA start-up (cuInit, a context, the checksum kernel and
// the copy's staging: 134 ms for a small program on an H200) may wait until
// the gate is closed, to run beside the driver's checkpoint (200-300 ms),
// which needs no engine: the process lets go of its memory, which the fds
// listed at the gate keep, and the copier maps them once criu's CUDA is up.
// Only where nothing needs the engine before: a stopped dump (no copy while
// the process runs), no migration, no soft recopy, no memory other processes
// map, and no other process of criu's tree with CUDA (whose pause would
// start the engine beside the copier).
bool Checkpointer::engine_may_wait(pid_t pid, const Target& t) {
  if (engine_ || engine_warming_.valid() || write_behind_ || criu_leaves_running() || !t.status.ipc_exports.empty())
    return false;
  if (targets_.size() > 1) return false;  // another process of the tree paused already
  bool all_answered = false;
  const auto others = tree_statuses(pid, &all_answered);
  return all_answered &&
         std::none_of(others.begin(), others.end(), [](const agent::StatusReply& s) { return s.cuda_initialized; });
}

// The copier's first step where criu's CUDA started beside the gate: what
// pause_target() does at the gate otherwise.
Result<void> Checkpointer::prepare_deferred_save(pid_t pid, Target& t) {
  PHOS_TRY(start_engine());
  auto ordinals = process_gpus(pid, t.status);
  if (!ordinals) return ordinals.error();
  t.host_ordinal = std::move(*ordinals);
  auto job = engine_->prepare_save(dirfd_, t.vpid, t.own_allocations, t.own_fds, t.host_ordinal, t.manifest, sink(t),
                                   nullptr, engine_->workers_for_stopped(t.status.allocated_bytes));
  if (!job) return job.error();
  t.save = std::move(*job);
  PHOS_TRY(use_parent(t));
  engine_->set_dead(*t.save, t.dead);
  t.mapped_at_ns = clock_ns(CLOCK_MONOTONIC);
  PHOS_INFO("process %d: its memory mapped into criu %.1f ms after the gate closed (criu's CUDA started beside it)",
            pid, double(t.mapped_at_ns - t.paused_at_ns) / 1e6);
  return {};
}

// How long the first pass may run. PAUSE_DEVICES runs under criu's freeze
// timer (alarm(opts.timeout) in collect_pstree): what is left of it is read
// by taking the alarm and setting it again at once (criu's dump thread is
// the only one that uses it, and it is here).
uint64_t Checkpointer::first_pass_budget_ms() const {
  if (options_.recopy_pass_ms) return options_.recopy_pass_ms;
  const unsigned left = ::alarm(0);
  if (left) ::alarm(left);
  return left ? uint64_t(left) * 1000 / 2 : 5000;
}

Result<void> Checkpointer::first_pass(pid_t pid, AgentClient& c, Target& t) {
  const uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  auto drained = c.quiesce(options_.quiesce_timeout_ms);
  if (!drained) return make_error("quiesce: " + drained.error().message, drained.error().code);
  // The gate is open again on every way out of here; the keeper knows it is
  // closed meanwhile.
  start_keeper();
  taking(pid, t, kGateClosed);
  bool window = false;
  auto run = [&]() -> Result<void> {
    PHOS_TRY(list_allocations(pid, c, t));
    // Its IPC mappings of other processes' memory are their owners' to copy.
    if (t.own_allocations.empty()) return make_error("no device memory of its own", ENODATA);
    PHOS_TRY(recopy_allows_sharing(t));
    PHOS_TRY(start_engine());
    if (t.migrate) PHOS_TRY(check_migration(pid, t));
    auto job =
        engine_->prepare_save(dirfd_, t.vpid, t.own_allocations, t.own_fds, t.host_ordinal, t.manifest, sink(t));
    if (!job) return job.error();
    t.save = std::move(*job);
    PHOS_TRY(use_parent(t));
    // criu's mapping holds the memory; the final listing gives fds again.
    t.fds.clear();
    t.own_fds.clear();
    // By checksum the hooks mark no chunk for a call they cannot read: the
    // final pass must be able to fingerprint the memory.
    if (options_.cow_trust == agent::CopyTrust::kChecksum)
      if (auto sums = engine_->can_sum(*t.save); !sums)
        return make_error("cow_trust=checksum, but " + sums.error().message, sums.error().code);
    auto opened = engine_->open_window(*t.save, CopyProtocol::kSoftRecopy, 0);
    if (!opened) return opened.error();
    agent::OpenCopyWindowRequest q{.trust = options_.cow_trust, .timeout_ms = options_.cow_timeout_ms, .pools = {}};
    const int fd = (*opened)->table.fd();
    auto reply = c.open_copy_window(q, std::vector<int>{fd});
    if (!reply) return reply.error();
    window = true;
    if (q.trust == agent::CopyTrust::kValidated && !reply->validating)
      return make_error("cow_trust=validated, but validation is off in the process", ENOTSUP);
    return {};
  };
  Result<void> ready = run();
  auto resumed = c.resume();
  t.taken &= ~uint32_t(kGateClosed);
  if (keeper_) (void)keeper_->state(pid, t.taken);
  if (!resumed) return make_error("resume after opening the window: " + resumed.error().message, EIO);
  if (!ready) {
    if (window) (void)c.close_copy_window();
    return ready.error();
  }
  t.protocol = CopyProtocol::kSoftRecopy;
  const uint64_t budget = first_pass_budget_ms();
  PHOS_INFO("process %d: soft recopy: gate reopened after %.1f ms; the first pass copies for %llu ms at most", pid,
            double(clock_ns(CLOCK_MONOTONIC) - t0) / 1e6, (unsigned long long)budget);
  auto pass = engine_->run_first_pass(*t.save, clock_ns(CLOCK_MONOTONIC) + budget * 1000000ull);
  if (!pass) {
    (void)c.close_copy_window();
    return pass.error();
  }
  t.manifest.statistics.recopy_first_pass_bytes = pass->bytes;
  t.manifest.statistics.recopy_first_pass_ns = pass->ns;
  return {};
}

Result<void> Checkpointer::end_first_window(pid_t pid, AgentClient& c, Target& t) {
  auto closed = c.close_copy_window();
  copystate::CopyState& table = t.save->window->table;
  if (!closed) {
    PHOS_WARN("process %d: close its recopy window: %s; every chunk is copied again", pid,
              closed.error().message.c_str());
    table.mark_all_dirty();
    t.manifest.statistics.recopy_wasted_bytes = table.copied_dirty_count() * t.manifest.chunk_size;
    return {};
  }
  image::Statistics& s = t.manifest.statistics;
  s.copy_window.calls_checked = closed->counters.calls_checked;
  // A write outside a validated set may have gone anywhere: all of it again
  // (the image is then what a stopped dump would have written). By
  // checksum the final pass finds whatever changed anyway.
  const char* why = closed->violations ? "a validated launch wrote outside its set"
                    : closed->aborted  ? "the process gave its window up"
                                       : nullptr;
  const bool by_checksum = t.save->validated;
  if (why && by_checksum) {
    PHOS_INFO("process %d: %s while soft recopy's first pass ran (%s); the final pass copies again what changed", pid,
              why, closed->violations ? closed->violation.c_str() : closed->abort_reason.c_str());
  } else if (why) {
    PHOS_WARN("process %d: %s while soft recopy's first pass ran (%s); every chunk is copied again", pid, why,
              closed->violations ? closed->violation.c_str() : closed->abort_reason.c_str());
    table.mark_all_dirty();
  }
  // The gate is closed: nothing writes any more. A chunk copied and dirty
  // was copied by the first pass and written after: copied twice.
  const uint64_t wasted = table.copied_dirty_count();
  s.recopy_wasted_bytes = wasted * t.manifest.chunk_size;
  PHOS_INFO("process %d: recopy window closed: %llu calls checked, %llu of %llu chunks dirty, %llu of the first "
            "pass's %llu written after their copy%s",
            pid, (unsigned long long)closed->counters.calls_checked, (unsigned long long)table.dirty_count(),
            (unsigned long long)table.chunk_count(), (unsigned long long)wasted,
            (unsigned long long)t.save->first_pass_chunks,
            by_checksum ? ("; " + std::to_string(closed->unmarked_calls) +
                           " calls with a set not trusted left unmarked (the final pass goes by checksum)")
                              .c_str()
                        : "");
  return {};
}

Result<void> Checkpointer::recopy_allows_sharing(const Target& t) const {
  if (!shares_ipc(t.status, t.allocations)) return {};
  if (t.migrate)
    return make_error("it shares device memory with other processes through CUDA IPC (no migration of such "
                      "processes)",
                      ENOTSUP);
  // Other processes' writes to its memory that they map mark no chunk
  // dirty. By checksum the final pass copies again every chunk that changed
  // since its copy, marked or not, and it fingerprints once every process
  // of the tree is paused (its copier waits for them): their writes are
  // found there (counted among the changes without a dirty mark).
  if (!shared_allocations(t.status, t.own_allocations).empty() &&
      options_.cow_trust != agent::CopyTrust::kChecksum)
    return make_error("other processes map its device memory through CUDA IPC and their writes mark no chunk dirty: "
                      "only cow_trust=checksum finds them, by fingerprint",
                      ENOTSUP);
  return {};
}

void Checkpointer::discard_first_pass(Target& t) {
  if (t.save && engine_) engine_->discard_save(dirfd_, std::move(t.save));
  t.save.reset();
  t.protocol = CopyProtocol::kStopTheWorld;
  // prepare_save filled the manifest's devices; the stopped copy fills them
  // again. What the final quiesce
  // recorded stays.
  image::Manifest fresh;
  fresh.statistics.quiesce_ns = t.manifest.statistics.quiesce_ns;
  fresh.statistics.gate_closed_unix_ns = t.manifest.statistics.gate_closed_unix_ns;
  fresh.fill_order = std::move(t.manifest.fill_order);
  t.manifest = std::move(fresh);
}

Checkpointer::CopyPlan Checkpointer::choose_copy(Target& t) {
  using Cow = PluginOptions::CopyOnWrite;
  if (options_.copy_on_write != Cow::kAlways) {
    auto snap = engine_->snapshot(*t.save);
    if (!snap) PHOS_WARN("process %d: snapshot: %s", t.vpid, snap.error().message.c_str());
    if (snap && *snap) return CopyPlan{.protocol = CopyProtocol::kStopTheWorld, .snapshot = true};
  }
  if (options_.copy_on_write == Cow::kOff) {
    PHOS_INFO("process %d: copy_on_write=off: the image is written while the process is stopped", t.vpid);
    return CopyPlan{};
  }
  // Every launch with a speculated set would wait for the whole copy: the
  // copy is better made now, during the stall.
  if (options_.cow_trust == agent::CopyTrust::kValidated && !t.status.validation_active) {
    PHOS_WARN("process %d: no copy-on-write: cow_trust=validated, but no validator runs in it (start it with "
              "PHOS_VALIDATE=ptx, or set cow_trust=checksum); the image is written while it is stopped", t.vpid);
    return CopyPlan{};
  }
  if (!checksum_allows(t)) return CopyPlan{};
  const std::optional<uint64_t> pool =
      options_.cow_pool_mib == PluginOptions::kCowPoolAuto ? std::nullopt
                                                            : std::optional<uint64_t>(uint64_t(options_.cow_pool_mib) << 20);
  std::map<int, PoolPeers> peers;
  if (!pool) {
    // The other processes of the dump on its GPUs are known once criu has
    // paused them all (the first CHECKPOINT_DEVICES, while the driver
    // checkpoints): their pools share the free memory with this one's.
    std::shared_future<void> paused = tree_paused_;  // a copy per thread
    paused.wait();
    if (t.abandoned) {
      PHOS_INFO("process %d: the dump failed before its copy-on-write pool was made", t.vpid);
      return CopyPlan{};
    }
    peers = pool_peers(t);
  }
  auto window = engine_->open_window(*t.save, CopyProtocol::kSoftCopyOnWrite, pool, peers);
  if (!window) {
    PHOS_WARN("process %d: no copy-on-write (%s): the image is written while the process is stopped", t.vpid,
              window.error().message.c_str());
    return CopyPlan{};
  }
  t.manifest.statistics.cow_pool_bytes = (*window)->pool_bytes;
  if (!take_freeze_sums(t)) return CopyPlan{};
  if (auto shared = copy_shared_now(t); !shared) return CopyPlan{.error = shared.error()};
  // After the shared memory's copy, which takes its chunks whatever they hold.
  if (options_.cow_zero_settle) engine_->settle_zero_chunks(*t.save);
  return CopyPlan{.protocol = CopyProtocol::kSoftCopyOnWrite, .snapshot = false};
}

void Checkpointer::wait_stopped_copies(const Target& t, std::shared_future<void>& tree_paused) {
  // cow_start=pause: this copy would hold the engine (one copy at a time)
  // while an owner of shared memory waits to copy it stopped, and the
  // whole tree's stall would wait for this copy. The owners go first.
  tree_paused.wait();  // targets_ stays as it is from then on
  for (const auto& [pid, other] : targets_)
    if (&other != &t && !other.status.ipc_exports.empty() && other.plan.valid()) {
      std::shared_future<CopyPlan> decided = other.plan;  // a copy per thread
      decided.wait();
    }
}

Result<void> Checkpointer::copy_shared_now(Target& t) {
  // Other processes' writes to the memory they map pass no hook of this
  // one: it is copied now, while every process that shares it is stopped
  // (the copier waited for the tree: it has importers), and the window
  // leaves it alone. Its importers' windows do not hold it (their images
  // only name it).
  const std::set<uint64_t> shared = shared_allocations(t.status, t.own_allocations);
  if (shared.empty()) return {};
  auto pass = engine_->copy_stopped(*t.save, shared, t.abandoned);
  if (!pass)
    return make_error("process " + std::to_string(t.vpid) + " (pid in its namespace): the copy of its memory shared " +
                          "through CUDA IPC, before it runs again: " + pass.error().message,
                      pass.error().code);
  t.manifest.statistics.ipc_stopped_bytes = pass->bytes;
  return {};
}

std::map<int, PoolPeers> Checkpointer::pool_peers(const Target& t) const {
  std::map<int, PoolPeers> peers;
  // targets_ stays as it is once the tree is paused; another copier's
  // no_pool is set before its plan is, and never cleared.
  for (const auto& [pid, other] : targets_) {
    if (&other != &t && other.no_pool) continue;
    for (const auto& [device, _] : t.pool_need) {
      auto need = other.pool_need.find(device);
      if (need == other.pool_need.end() || !need->second) continue;
      peers[device].bytes += need->second;
      peers[device].processes++;
    }
  }
  return peers;
}

bool Checkpointer::checksum_allows(const Target& t) {
  if (options_.cow_trust != agent::CopyTrust::kChecksum) return true;
  // A write speculation missed, seen by an earlier dump, will likely come
  // again: each such dump would be refused.
  if (t.status.cow_missed) {
    PHOS_WARN("process %d: no copy-on-write: an earlier dump of it found a write that speculation missed "
              "(cow_trust=checksum); the image is written while it is stopped",
              t.vpid);
    return false;
  }
  if (auto sums = engine_->can_sum(*t.save); !sums) {
    PHOS_WARN("process %d: no copy-on-write: cow_trust=checksum, but %s; the image is written while it is stopped",
              t.vpid, sums.error().message.c_str());
    return false;
  }
  return true;
}

bool Checkpointer::take_freeze_sums(Target& t) {
  if (options_.cow_trust != agent::CopyTrust::kChecksum) return true;
  // The process is drained and let go of its memory: it is as it stands
  // for the image. The pass runs beside the driver's lock and checkpoint.
  if (auto sums = engine_->take_freeze_sums(*t.save); !sums) {
    PHOS_WARN("process %d: no copy-on-write: the freeze's fingerprints failed (%s); the image is written while it "
              "is stopped",
              t.vpid, sums.error().message.c_str());
    engine_->drop_window(*t.save);
    t.manifest.statistics.cow_pool_bytes = 0;
    return false;
  }
  t.manifest.statistics.sum_pass_ns = t.save->sum_pass_ns;
  return true;
}

Result<bool> Checkpointer::open_window(pid_t pid, Target& t, AgentClient& c) {
  const Engine::CopyWindow& w = *t.save->window;
  // Copied while the process was stopped: nothing to protect.
  if (w.table.window() != copystate::Window::kOpen) return true;
  agent::OpenCopyWindowRequest q{.trust = options_.cow_trust, .timeout_ms = options_.cow_timeout_ms, .pools = w.pools};
  std::vector<int> fds{w.table.fd()};
  for (const UniqueFd& fd : w.pool_fds) fds.push_back(fd.get());
  const uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  auto opened = c.open_copy_window(q, fds);
  std::string why;
  if (!opened) {
    why = opened.error().message;
  } else if (q.trust == agent::CopyTrust::kValidated && !opened->validating) {
    // Every launch with a speculated set would wait for the whole copy:
    // no better than a stop, and less clear.
    // The window stays open in the agent until criu's exit, harmless: the
    // gate stays closed until the copy is done (closing it now would give
    // the table up under the engine).
    why = "cow_trust=validated, but no validator runs in it (start it with PHOS_VALIDATE=ptx, or set "
          "cow_trust=speculated)";
    t.agent_window = true;
  } else {
    t.agent_window = true;
    PHOS_INFO("process %d: copy window opened in %.1f ms (cow_trust=%s%s)", pid,
              double(clock_ns(CLOCK_MONOTONIC) - t0) / 1e6, std::string(image::copy_trust_name(q.trust)).c_str(),
              opened->validating ? ", validating" : "");
    return true;
  }
  // Without its window the process must not write: it runs again once its
  // memory is copied, as a stopped dump would.
  PHOS_WARN("process %d: no copy-on-write: %s; it stays stopped until its memory is copied", pid, why.c_str());
  t.protocol = CopyProtocol::kStopTheWorld;
  return false;
}

Result<void> Checkpointer::close_window(pid_t pid, Target& t, bool missed, agent::CloseCopyWindowReply* reply_out) {
  agent::CloseCopyWindowReply reply;
  auto closed = with_agent(pid, options_.agent_timeout_ms, [&](AgentClient& c) -> Result<void> {
    auto r = c.close_copy_window(missed, missed ? t.missed_chunks : std::vector<agent::AddressRange>{});
    if (!r) return r.error();
    reply = std::move(*r);
    return {};
  });
  if (!closed) return make_error("close its copy-on-write window: " + closed.error().message, closed.error().code);
  image::Statistics& s = t.manifest.statistics;
  s.cow_saved_bytes = reply.chunks_saved * t.manifest.chunk_size;
  s.copy_window = reply.counters;
  PHOS_INFO("process %d: copy-on-write window closed: %llu calls checked, %llu chunks (%.1f MiB) saved into the pool, "
            "%llu calls waited (%llu with an unknown write set) %.1f ms in all, %llu writes outside a validated set",
            pid, (unsigned long long)s.copy_window.calls_checked, (unsigned long long)reply.chunks_saved,
            double(s.cow_saved_bytes) / (1 << 20), (unsigned long long)s.copy_window.calls_waited,
            (unsigned long long)s.copy_window.unknown_waits, double(s.copy_window.wait_ns) / 1e6,
            (unsigned long long)reply.violations);
  if (!reply.longest_waits.empty() || !reply.most_saved.empty())
    PHOS_INFO("process %d: copy-on-write: %s; %s", pid, describe_longest_waits(reply.longest_waits).c_str(),
              describe_most_saved(reply.most_saved, t.manifest.chunk_size).c_str());
  if (reply_out) *reply_out = reply;
  if (reply.aborted)
    return make_error("the process gave up its copy-on-write window: " + reply.abort_reason, ECANCELED);
  if (reply.violations)
    return make_error((reply.violation.empty() ? std::string("a validated launch wrote outside its set")
                                               : reply.violation) +
                          " while its memory was being copied (" + std::to_string(reply.violations) +
                          " such writes): the image could hold memory written after the freeze",
                      EIO);
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
  tree_is_paused();  // a copier waiting for it goes on (or gives up, abandoned)
  let_write(t);
  if (t.copier.joinable()) t.copier.join();
  if (t.save && t.save->misses.count())
    t.missed_chunks = sum_check::missed_ranges(t.save->misses, t.manifest.chunk_size);
  t.save.reset();
  return t.copied;
}

Result<void> Checkpointer::check_ipc() {
  std::vector<IpcParty> parties;
  bool any = false;
  for (const auto& [pid, t] : targets_) {
    parties.push_back({.pid = pid, .vpid = t.vpid, .status = &t.status, .allocations = &t.allocations});
    any = any || shares_ipc(t.status, t.allocations);
  }
  if (!any) return {};
  // phos-keeper holds one process's memory on one GPU: shared memory would
  // be kept once per process that maps it.
  if (!options_.migrate_to.empty())
    return make_error("a migration of processes that share device memory through CUDA IPC is not supported yet; "
                      "dump and restore them instead",
                      ENOTSUP);
  PHOS_TRY(check_ipc_tree(parties));
  for (const auto& [pid, t] : targets_)
    for (const auto& a : ipc_mappings(t.allocations))
      PHOS_INFO("process %d: allocation #%llu of process %d (pid in its namespace) mapped at 0x%llx (%.1f MiB) through "
                "CUDA IPC: stored once, in its owner's image",
                pid, (unsigned long long)a.ipc->owner_allocation, a.ipc->owner_pid, (unsigned long long)a.address,
                double(a.size) / (1 << 20));
  return {};
}

void Checkpointer::tree_is_paused() {
  if (tree_paused_given_) return;
  tree_paused_given_ = true;
  tree_paused_promise_.set_value();
}

Result<bool> Checkpointer::checkpoint(pid_t pid) {
  auto it = targets_.find(pid);
  if (it == targets_.end()) return false;
  Target& t = it->second;
  if (!ipc_checked_) {
    // criu pauses every process before it checkpoints any.
    ipc_checked_ = check_ipc();
    if (!*ipc_checked_)
      for (auto& [p, other] : targets_) other.abandoned = true;  // no copy of shared memory starts
    tree_is_paused();
  }
  if (!*ipc_checked_) return ipc_checked_->error();
  // The driver checkpoint (a fixed cost) runs while the engine copies:
  // the process let go of its memory at PAUSE, so the two do not meet.
  if (t.taken & kDriverLocked) {
    if (!t.driver_checkpointed) driver_checkpoints();
    if (!*t.driver_checkpointed) return t.driver_checkpointed->error();
  }
  // Without device memory there is nothing to snapshot: the manifest waits
  // for criu's exit all the same, one rule for every leave-running dump.
  const bool has_memory = t.plan.valid();
  const CopyPlan plan = has_memory ? t.plan.get() : CopyPlan{};
  if (write_behind_ && (!has_memory || plan.behind())) {
    // The image is finished at criu's exit (complete_pending); until then
    // this manifest, without allocations (the copier, which fills them in,
    // waits for exit(DUMP)) and without a completion marker, makes a restore
    // refuse the image rather than ignore the process.
    t.write_behind = true;
    t.protocol = plan.protocol;
    // The copy starts once the process runs again: its staging is made
    // now, while criu dumps the CPU side.
    // (cow_start=pause: the copy may have started already.)
    if (plan.protocol == CopyProtocol::kSoftCopyOnWrite && options_.cow_start == PluginOptions::CowStart::kResume)
      engine_->prepare_rings(*t.save);
    PHOS_TRY(write_manifest(pid, t));
    PHOS_INFO("process %d: %s; the image is finished after the process runs again", pid,
              !has_memory ? "no device memory"
              : t.copy_on_write() ? "device memory copied while the process runs (copy-on-write)"
                                  : "device memory snapshotted");
  } else {
    const uint64_t w0 = clock_ns(CLOCK_MONOTONIC);
    PHOS_TRY(copy_done(t));
    t.copy_wait_ns = clock_ns(CLOCK_MONOTONIC) - w0;
    if (t.migrate) PHOS_TRY(keep_migration(pid, t));
    PHOS_TRY(write_manifest(pid, t));
  }
  t.checkpointed_at_ns = clock_ns(CLOCK_MONOTONIC);
  if (fault("stall-after-checkpoint")) {
    PHOS_WARN("fault injection (PHOS_FAULT): stalling CHECKPOINT_DEVICES of %d for 60 s", pid);
    ::sleep(60);
  }
  if (fault("slow-checkpoint-devices")) {
    PHOS_WARN("fault injection (PHOS_FAULT): CHECKPOINT_DEVICES of %d holds for 4 s", pid);
    ::sleep(4);
  }
  if (fault("fail-checkpoint-devices"))
    return make_error("fault injection (PHOS_FAULT): CHECKPOINT_DEVICES of process " + std::to_string(pid) + " fails",
                      EIO);
  return true;
}

Result<void> Checkpointer::use_parent(Target& t) {
  auto path = criu_prev_images_dir();
  if (!path && !options_.parent_image.empty()) path = options_.parent_image;
  if (!path || t.migrate) return {};  // a migration's memory is kept, not stored
  // A process the parent has no image of (new in the tree since) is dumped
  // whole; a parent that is not there or not whole fails the dump.
  UniqueFd probe(::openat(dirfd_, path->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  struct stat st {};
  if (probe.valid() && ::fstatat(probe.get(), image::manifest_file_name(t.vpid).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 &&
      errno == ENOENT) {
    PHOS_WARN("process %d: parent image %s has no %s: this image is not incremental", t.vpid, path->c_str(),
              image::manifest_file_name(t.vpid).c_str());
    return {};
  }
  UniqueFd dir;
  auto parent = image::open_parent_image(dirfd_, *path, t.vpid, dir);
  if (!parent)
    return make_error("process " + std::to_string(t.vpid) + ": incremental dump against " + *path + ": " +
                          parent.error().message,
                      parent.error().code);
  // A parent of before fingerprints cannot show a chunk unchanged by more
  // than a 32-bit CRC: every chunk is stored, and the image names no parent.
  auto index = image::ParentIndex::of(parent->manifest);
  if (!index) {
    PHOS_WARN("process %d: parent image %s is not used, this image is not incremental: %s", t.vpid, path->c_str(),
              index.error().message.c_str());
    return {};
  }
  t.manifest.parent = image::ParentImage{.path = *path,
                                         .manifest_size = parent->manifest_size,
                                         .manifest_crc32c = parent->manifest_crc32c,
                                         .created_unix_ns = parent->manifest.created_unix_ns};
  engine_->set_parent(*t.save, std::move(*index));
  PHOS_INFO("process %d: incremental dump against parent image %s (a chain of %zu)", t.vpid, path->c_str(),
            parent->chain.size());
  return {};
}

Result<void> Checkpointer::write_manifest(pid_t pid, Target& t) {
  image::Manifest& m = t.manifest;
  m.ipc_mappings = ipc_mappings(t.allocations);
  // The oldest version that holds it: a phos of before sparse images still
  // restores an image without zero chunks.
  m.format_version = image::format_version_for(m);
  m.writer_version = std::string(image::writer_version());
  m.pid = t.vpid;
  m.protocol = t.protocol;
  // Checksum trust acts on speculated sets: an older reader knows trust 2,
  // and ignores the validation beside it.
  const agent::CopyTrust trust =
      options_.cow_trust == agent::CopyTrust::kChecksum ? agent::CopyTrust::kSpeculated : options_.cow_trust;
  m.copy_trust = t.protocol != CopyProtocol::kStopTheWorld ? trust : agent::CopyTrust(0);
  m.validation = t.protocol != CopyProtocol::kStopTheWorld && t.validated ? image::Validation::kChecksum
                                                                          : image::Validation::kNone;
  m.created_unix_ns = clock_ns(CLOCK_REALTIME);
  m.statistics.total_ns = clock_ns(CLOCK_MONOTONIC) - t.paused_at_ns;
  auto written = image::write_manifest(dirfd_, m);
  if (!written) return written.error();
  t.manifest_file = std::move(*written);
  PHOS_INFO("process %d: wrote %s (%zu allocations, %.1f MiB, %.1f MiB stored, format version %u)", pid,
            image::manifest_file_name(t.vpid).c_str(), m.allocations.size(), double(m.statistics.raw_bytes) / (1 << 20),
            double(m.statistics.stored_bytes) / (1 << 20), m.format_version);
  return {};
}

void Checkpointer::driver_checkpoints() {
  std::vector<pid_t> pids;
  for (auto& [pid, t] : targets_) {
    if (!(t.taken & kDriverLocked) || t.driver_checkpointed) continue;
    taking(pid, t, kDriverCheckpointed);
    pids.push_back(pid);
  }
  // What the driver's checkpoint moves into each process's memory (its
  // device state once phos's memory is released: contexts, modules,
  // libraries' device memory), which criu then dumps with the CPU pages.
  std::vector<std::optional<uint64_t>> rss_before;
  for (pid_t pid : pids) rss_before.push_back(resident_bytes(pid));
  const uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  std::vector<bool> checkpointed;
  auto results = driver_checkpoint_all(pids, options_.driver_parallel, &checkpointed);
  const uint64_t took = clock_ns(CLOCK_MONOTONIC) - t0;
  for (size_t i = 0; i < pids.size(); i++) {
    auto rss_after = resident_bytes(pids[i]);
    if (results[i] && rss_before[i] && rss_after)
      PHOS_INFO("process %d: driver checkpoint %.1f ms; resident memory %.1f -> %.1f MiB (%+.1f MiB: the driver's device state)",
                pids[i], double(took) / 1e6, double(*rss_before[i]) / (1 << 20), double(*rss_after) / (1 << 20),
                (double(*rss_after) - double(*rss_before[i])) / (1 << 20));
    Target& t = targets_.at(pids[i]);
    t.driver_checkpointed = results[i];
    // Not checkpointed: still locked, an unlock gives it back. Checkpointed
    // but failed (its restore thread not stopped again): it needs the
    // driver's restore, the bit stays.
    if (!checkpointed[i]) t.taken &= ~uint32_t(kDriverCheckpointed);
    t.driver_checkpoint_ns = took;
  }
  if (pids.size() > 1)
    PHOS_INFO("driver checkpoint of %zu processes %s: %.1f ms", pids.size(),
              options_.driver_parallel ? "at once" : "one after another", double(took) / 1e6);
}

void Checkpointer::driver_restores(const std::vector<pid_t>& pids) {
  std::vector<DriverRestore> restores;
  for (pid_t pid : pids)
    if (targets_.at(pid).taken & kDriverCheckpointed) restores.push_back({pid, {}});
  if (restores.size() < 2) return;  // give_back() does one as it always did
  const uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  auto results = driver_restore_and_unlock_all(restores, options_.driver_parallel);
  for (size_t i = 0; i < restores.size(); i++) {
    Target& t = targets_.at(restores[i].pid);
    t.give_back_at_ns = t0;
    // Done: the give-back goes on from the remap. Failed: give_back() tries
    // again, and says why.
    if (results[i]) {
      t.taken &= ~uint32_t(kDriverCheckpointed | kDriverLocked);
      // Should criu die before give_back(), phos-keeper must not restore
      // (or unlock) the driver again.
      if (keeper_) (void)keeper_->state(restores[i].pid, t.taken);
    }
  }
  PHOS_INFO("driver restore of %zu processes %s: %.1f ms", restores.size(),
            options_.driver_parallel ? "at once" : "one after another",
            double(clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
}

// Gives a process that lives on back what the dump took, in reverse order.
void Checkpointer::give_back(pid_t pid, Target& t, bool wait_copy) {
  uint64_t t0 = t.give_back_at_ns ? t.give_back_at_ns : clock_ns(CLOCK_MONOTONIC);
  if (wait_copy) (void)copy_done(t);  // the engine's mapping goes before the process maps again
  std::function<Result<bool>(AgentClient&)> before_resume;
  bool held = false;  // copy-on-write fell back: the gate stays closed for the copy
  if (t.copy_on_write())
    before_resume = [&](AgentClient& c) -> Result<bool> {
      auto opened = open_window(pid, t, c);
      held = opened && !*opened;
      return opened;
    };
  GiveBackTimes parts;
  // A driver restore made with the other processes' (driver_restores())
  // counts as this one's, up to this process's turn (the give-backs before
  // it in this loop included).
  if (t.give_back_at_ns) parts.driver_ns = clock_ns(CLOCK_MONOTONIC) - t.give_back_at_ns;
  auto r = give_back_gpu_state(pid, t.taken, t.allocations, t.fds, options_.agent_timeout_ms, before_resume, &parts);
  if (r && held) {
    // Outside the agent's session: the copy may outlast its idle timeout.
    r = copy_done(t);
    auto resumed = with_agent(pid, options_.agent_timeout_ms, [](AgentClient& c) { return c.resume(); });
    if (r) r = resumed;
  }
  t.resumed_at_ns = clock_ns(CLOCK_MONOTONIC);
  t.manifest.statistics.stall_ns = t.resumed_at_ns - t.paused_at_ns;
  if (!r) {
    PHOS_ERR("process %d: could not give back its GPU state: %s", pid, r.error().message.c_str());
    t.not_given_back = r.error().message;
    return;
  }
  t.taken = 0;
  if (keeper_) (void)keeper_->state(pid, 0);
  // Where the stop went, so a user sees what to look at.
  auto ms = [](uint64_t a, uint64_t b) { return a && b > a ? double(b - a) / 1e6 : 0.0; };
  const uint64_t quiesced = t.paused_at_ns + t.manifest.statistics.quiesce_ns;
  char nccl[64] = "";
  if (t.nccl_release_ns)
    std::snprintf(nccl, sizeof(nccl), " (NCCL release %.1f ms)", double(t.nccl_release_ns) / 1e6);
  // PAUSE's steps after the quiesce, each from the last one taken.
  std::string steps;
  uint64_t from = quiesced;
  const char* listed = t.listed_ahead ? "listed (their fds exported ahead)" : "listed with their fds";
  const char* mapped = t.mapped_at_gate ? "mapped into criu" : "the copy's job (mapped ahead)";
  for (auto [at, what] : {std::pair{t.listed_at_ns, listed}, {t.kept_at_ns, "handed to phos-keeper"},
                          {t.mapped_at_ns, mapped}, {t.released_at_ns, "released by the process"},
                          {t.paused_done_ns, "the driver's lock"}}) {
    if (!at) continue;
    char part[64];
    std::snprintf(part, sizeof(part), "%s%s %.1f", steps.empty() ? "" : ", ", what, ms(from, at));
    steps += part;
    from = at;
  }
  PHOS_INFO("process %d: gate reopened after %.1f ms stopped: quiesce %.1f ms%s, allocations, release and the driver's lock %.1f ms (%s), "
            "criu's freeze %.1f ms, driver checkpoint %.1f ms, the rest of the copy %.1f ms, criu's CPU dump %.1f ms, "
            "give-back (driver restore, remap%s) %.1f ms: driver restore and unlock %.1f ms, the agent's remap %.1f "
            "ms, %sgate %.1f ms",
            pid, ms(t.paused_at_ns, t.resumed_at_ns), double(t.manifest.statistics.quiesce_ns) / 1e6, nccl,
            ms(quiesced, t.paused_done_ns), steps.c_str(),
            std::max(0.0, ms(t.paused_done_ns, t.checkpointed_at_ns) - double(t.driver_checkpoint_ns + t.copy_wait_ns) / 1e6),
            double(t.driver_checkpoint_ns) / 1e6, double(t.copy_wait_ns) / 1e6, ms(t.checkpointed_at_ns, t0),
            t.copy_on_write() ? ", copy window" : "", ms(t0, t.resumed_at_ns), double(parts.driver_ns) / 1e6,
            double(parts.remap_ns) / 1e6, t.copy_on_write() ? "copy window and " : "", double(parts.resume_ns) / 1e6);
}

Result<void> Checkpointer::plan_migration(pid_t pid, Target& t) {
  auto refuse = [&](const std::string& why) {
    return make_error("process " + std::to_string(pid) + ": migrate_to=" + options_.migrate_to + ": " + why, EINVAL);
  };
  if (criu_leaves_running())
    return refuse("criu leaves the process running (--leave-running), but a migration ends it (its copy runs on the "
                  "target)");
  if (migration_id_.empty()) {
    uint64_t id = 0;
    if (::getentropy(&id, sizeof(id)) != 0) return errno_error("migration: random name");
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016" PRIx64, id);
    migration_id_ = buf;
  }
  if (t.status.allocation_count == 0) {
    // No device memory to move: the image is kept all the same (its
    // restore finds the keeper as any migration's does).
    t.migrate = Engine::MigrationSink{{}, true};
    PHOS_INFO("process %d: migration %s: no device memory to move", pid, migration_id_.c_str());
    return {};
  }
  PHOS_TRY(start_engine());
  auto host = engine_->host_gpus();
  if (!host) return host.error();
  std::set<int> sources;
  for (auto [theirs, ours] : t.host_ordinal) sources.insert(ours);
  // An agent that names no UUIDs: its one GPU taken as the target's, as
  // before device maps.
  if (sources.empty() && !is_migration_map(options_.migrate_to))
    if (const GpuDevice* target = find_host_gpu(options_.migrate_to, *host)) sources.insert(int(target->ordinal));
  auto targets = migration_targets(options_.migrate_to, sources, *host);
  if (!targets) return refuse(targets.error().message);
  bool in_place = options_.migrate_copy == PluginOptions::MigrateCopy::kAuto;
  for (auto [source, target] : *targets) {
    in_place = in_place && source == target;
    t.migrate_targets[source] = (*host)[size_t(target)];
  }
  t.migrate = Engine::MigrationSink{*targets, in_place};
  // criu's contexts on the target GPUs now, while the process runs: made as
  // the gate closed, they were 117 ms of a 158 MiB migration's downtime of
  // 1.26 s once it had no first pass to make them before (recopy_min_mib).
  if (!in_place) {
    std::vector<int> target_gpus;
    for (auto [source, target] : *targets)
      if (source != target) target_gpus.push_back(target);
    engine_->warm_up(target_gpus);
  }
  for (auto [source, target] : *targets)
    PHOS_INFO("process %d: migration %s from GPU %d to GPU %d (%s)%s", pid, migration_id_.c_str(), source, target,
              format_gpu_uuid((*host)[size_t(target)].uuid).c_str(),
              in_place ? ": the same GPU, its memory stays in place" : "");
  return {};
}

Result<void> Checkpointer::check_migration(pid_t pid, const Target& t) {
  for (const auto& a : t.allocations)
    if (!t.migrate_targets.count(host_device(t.host_ordinal, a.device)))
      return make_error("process " + std::to_string(pid) + ": migration: allocation " + std::to_string(a.id) +
                            " is on GPU " + std::to_string(host_device(t.host_ordinal, a.device)) +
                            ", not where the migration was planned from (allocated while the dump began); dump it "
                            "again",
                        EAGAIN);
  return {};
}

Result<void> Checkpointer::keep_migration(pid_t pid, Target& t) {
  if (!keeper_)
    return make_error("process " + std::to_string(pid) + ": a migration needs phos-keeper to hold its GPU memory "
                      "between the dump and the restore, and it is not running", ESRCH);
  if (t.kept.size() != t.allocations.size())
    return make_error("process " + std::to_string(pid) + ": migration: " + std::to_string(t.kept.size()) +
                      " kept allocations for " + std::to_string(t.allocations.size()), EIO);
  if (auto r = keeper_->keep(pid, t.vpid, migration_id_, options_.migrate_keep_s, t.allocations, t.kept); !r)
    return make_error("process " + std::to_string(pid) + ": migration: phos-keeper: " + r.error().message, EIO);
  uint64_t bytes = 0;
  for (const auto& a : t.allocations) bytes += a.size;
  auto kept_on = [](const GpuDevice& d) { return GpuDevice{.uuid = d.uuid, .name = d.name}; };
  t.manifest.kept = image::KeptMemory{.migration = migration_id_,
                                      .device = t.migrate_targets.empty() ? GpuDevice{}
                                                                          : kept_on(t.migrate_targets.begin()->second),
                                      .in_place = t.migrate->in_place,
                                      .kept_bytes = bytes,
                                      .targets = {}};
  // Several GPUs: each image device (the process's ordinal) names its own.
  if (t.migrate_targets.size() > 1)
    for (const auto& d : t.manifest.devices)
      t.manifest.kept->targets[d.ordinal] = kept_on(t.migrate_targets.at(host_device(t.host_ordinal, d.ordinal)));
  t.kept.clear();  // the keeper has them
  return {};
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
  if (engine_warming_.valid()) engine_warming_.get();
  return start_engine_now();
}

void Checkpointer::warm_up_engine(std::vector<agent::StatusReply> ranks, const char* when, uint64_t stopped_bytes) {
  // engine_warming_ first: while it is valid its thread may be assigning
  // engine_, which this thread must not read meanwhile.
  if (engine_warming_.valid() || engine_) return;
  engine_warming_ = std::async(std::launch::async, [this, ranks = std::move(ranks), when, stopped_bytes] {
    if (fault("slow-engine-warm-up")) {
      PHOS_WARN("fault injection (PHOS_FAULT): criu's CUDA start-up beside the gate waits 300 ms");
      ::usleep(300'000);
    }
    const uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
    (void)CudaApi::get();  // timed apart: cuInit (start_engine_now() says why it failed)
    const uint64_t init_ns = clock_ns(CLOCK_MONOTONIC) - t0;
    if (auto r = start_engine_now(); !r) return;  // start_engine() says why
    auto host = engine_->host_gpus();
    if (!host) return;
    std::set<int> gpus;
    for (const auto& s : ranks) {
      auto ordinals = s.devices.empty() ? Result<std::map<uint32_t, int>>(make_error("no UUIDs", ENODEV))
                                        : host_ordinals(s.devices, *host);
      if (!ordinals) {  // an agent that names no GPUs (or unknown ones): all of them, as before
        for (size_t d = 0; d < host->size(); d++) gpus.insert(int(d));
        break;
      }
      for (auto [theirs, ours] : *ordinals) gpus.insert(ours);
    }
    engine_->warm_up(std::vector<int>(gpus.begin(), gpus.end()));
    PHOS_INFO("criu's CUDA contexts on %zu of the host's %zu GPU(s) made %s: %.1f ms (cuInit %.1f ms)", gpus.size(),
              host->size(), when, double(clock_ns(CLOCK_MONOTONIC) - t0) / 1e6, double(init_ns) / 1e6);
    // The copy's staging too, on a thread of its own: a rank lists nothing
    // ahead (pause), so nothing else makes it before the gate.
    if (stopped_bytes)
      engine_->prepare_rings(gpus, "the stopped copy", engine_->workers_for_stopped(stopped_bytes), false);
    else
      engine_->prepare_rings(gpus, "the processes with device memory");
  });
}

std::vector<pid_t> Checkpointer::not_paused_yet(std::vector<pid_t> tree) const {
  // criu has seized (frozen) the processes it paused already: their agents
  // cannot answer.
  std::erase_if(tree, [&](pid_t p) {
    auto tracer = tracer_of(p, p);
    return targets_.count(p) > 0 || (tracer && *tracer == ::getpid());
  });
  return tree;
}

std::vector<agent::StatusReply> Checkpointer::tree_statuses(pid_t paused, bool* all_answered) {
  std::vector<agent::StatusReply> out;
  if (all_answered) *all_answered = true;
  for (pid_t p : not_paused_yet(criu_tree_pids())) {
    if (p == paused) continue;
    auto client = AgentClient::connect(p, options_.agent_timeout_ms);
    if (!client) continue;  // no agent: nothing of phos's
    auto s = client->status();
    (void)client->goodbye();
    if (s)
      out.push_back(std::move(*s));
    else if (all_answered)
      *all_answered = false;
  }
  return out;
}

std::vector<agent::StatusReply> Checkpointer::statuses_with_memory(pid_t paused) {
  auto out = tree_statuses(paused);
  std::erase_if(out, [](const agent::StatusReply& s) { return s.allocation_count == 0; });
  return out;
}

Result<void> Checkpointer::start_engine_now() {
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

Result<void> Checkpointer::hold_nccl_job(pid_t pid, const agent::NcclCommunicatorStatus& c) {
  std::vector<pid_t> tree = criu_tree_pids();
  if (tree.empty())
    return make_error("process " + std::to_string(pid) + " has an NCCL communicator with ranks in other processes, " +
                      "and criu's command line names no tree (-t) to find them in (criu swrk/RPC)", ENOTSUP);
  // criu goes on pausing the other processes after a refusal: the job's
  // other ranks are refused at once, the same way.
  if (auto failed = failed_nccl_jobs_.find(c.job_id); failed != failed_nccl_jobs_.end())
    return make_error("process " + std::to_string(pid) + ": " + failed->second, EPERM);
  auto refuse = [&](const Error& e) -> Result<void> {
    failed_nccl_jobs_[c.job_id] = e.message;
    return make_error("process " + std::to_string(pid) + ": " + e.message, e.code);
  };
  // (A rank among the processes paused already would have been held then.)
  tree = not_paused_yet(std::move(tree));
  std::vector<agent::StatusReply> statuses;
  auto ranks = find_nccl_job(tree, c.job_id, c.nranks, options_.agent_timeout_ms, &statuses);
  if (!ranks) return refuse(ranks.error());
  warm_up_engine(std::move(statuses), "while the job's ranks were held");
  uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
  auto held = phos::plugin::hold_nccl_job(*ranks, c.job_id, options_.agent_timeout_ms,
                                          std::chrono::milliseconds(options_.quiesce_timeout_ms), true);
  if (!held) return refuse(held.error());
  std::string pids;
  for (pid_t p : held->pids) pids += (pids.empty() ? "" : " ") + std::to_string(p);
  PHOS_INFO("NCCL communicator %016" PRIx64 ": its %zu ranks (pids %s) held before call %" PRIu64
            " in %.1f ms, their release pending",
            c.job_id, held->pids.size(), pids.c_str(), held->at_call, double(clock_ns(CLOCK_MONOTONIC) - t0) / 1e6);
  nccl_jobs_.push_back(std::move(*held));
  return {};
}

// A failed dump of a held job: where some ranks let go of their
// communicators (those paused, given back below, make them again from a new
// id), the others must meet them: a rank that let go and was not paused (a
// quiesce that failed after its release) is resumed; one that did not closes
// and opens its gate (its quiesce releases, its resume makes again). Then
// every stop is lifted.
void Checkpointer::abandon_nccl_job(const NcclJobHeld& job) {
  std::map<pid_t, bool> released;  // the ranks not paused: whether they let go
  bool some_released = false;
  for (pid_t p : job.pids) {
    if (targets_.count(p)) {
      some_released = true;
      continue;
    }
    if (!process_alive(p)) continue;
    (void)with_agent(p, options_.agent_timeout_ms, [&](AgentClient& c) -> Result<void> {
      auto s = c.status();
      if (!s) return s.error();
      const auto* comm = job_communicator(*s, job.job_id);
      released[p] = comm && comm->released;
      some_released = some_released || released[p];
      return {};
    });
  }
  for (const auto& [p, let_go] : released) {
    if (!some_released) break;
    auto r = with_agent(p, options_.agent_timeout_ms, [&, let_go = let_go](AgentClient& c) -> Result<void> {
      if (!let_go)
        if (auto q = c.quiesce(options_.quiesce_timeout_ms); !q) return q.error();
      return c.resume();
    });
    if (!r)
      PHOS_WARN("NCCL communicator %016" PRIx64 ": process %d could not release and make again its communicator "
                "(%s): the other ranks wait for it at the rendezvous",
                job.job_id, p, r.error().message.c_str());
  }
  for (const auto& why : let_nccl_job_go(job, options_.agent_timeout_ms))
    PHOS_WARN("NCCL communicator %016" PRIx64 ": %s", job.job_id, why.c_str());
}

Result<void> Checkpointer::check_job_rank(pid_t pid, const agent::NcclCommunicatorStatus& c) const {
  if (c.held && c.stop_at) return {};
  return make_error("process " + std::to_string(pid) + " (rank " + std::to_string(c.rank) + " of NCCL communicator " +
                        run_hex(c.job_id) + ") is not held at a stop: under " + kJobEnv +
                        " the job's step holds every rank before criu runs (phosctl job dump)",
                    EPERM);
}

bool Checkpointer::job_verdict(bool dump_succeeded) {
  const std::string host = "host " + std::to_string(job_->host);
  auto store = net::TcpStoreClient::connect(job_->coordinator.host, job_->coordinator.port,
                                            net::deadline_in(std::chrono::seconds(10)));
  if (!store) {
    PHOS_ERR("job run %s: the coordinator at %s: %s; this host's dump is abandoned, its processes run on",
             run_hex(job_->run).c_str(), job_->coordinator.text().c_str(), store.error().message.c_str());
    return false;
  }
  const JobKeys keys(job_->run);
  if (dump_succeeded && criu_leaves_running()) {
    if (auto voted = put_text(*store, keys.dumped(job_->host), "ok"); !voted) {
      PHOS_ERR("job run %s: %s: its vote: %s; this host's dump is abandoned, its processes run on",
               run_hex(job_->run).c_str(), host.c_str(), voted.error().message.c_str());
      return false;
    }
    PHOS_INFO("job run %s: %s dumped (its vote given here: a leave-running dump runs no action script)",
              run_hex(job_->run).c_str(), host.c_str());
  }
  auto out = dump_succeeded ? wait_outcome(*store, keys, net::deadline_in(job_timeout()))
                            : propose_outcome(*store, keys, "abort: " + host + ": criu's dump failed (its log says why)");
  // As phos-job-vote does: no outcome in time is this host's abort, unless
  // one was decided meanwhile (the first proposal wins).
  if (!out && dump_succeeded)
    out = propose_outcome(*store, keys, "abort: " + host + ": no outcome from the coordinator in " +
                                            std::to_string(job_timeout().count()) + " s");
  if (!out) {
    PHOS_ERR("job run %s: no outcome from the coordinator (%s); this host's dump is abandoned, its processes run on",
             run_hex(job_->run).c_str(), out.error().message.c_str());
    return false;
  }
  if (out->commit)
    PHOS_INFO("job run %s: every host dumped; the job's dump commits", run_hex(job_->run).c_str());
  else
    PHOS_WARN("job run %s: the job's dump is aborted (%s): every process is given back and runs on",
              run_hex(job_->run).c_str(), out->why.c_str());
  return out->commit;
}

// A process whose give-back failed (its agent could not answer while the
// rest of the process was stopped) is in the image as it was then: restored,
// its agent would wait for the same thing, and the restore with it. Such an
// image is not completed (a restore refuses it); the process itself is
// given back by phos-keeper once criu lets it run.
std::string Checkpointer::not_given_back_text(const Target& t) {
  return "its GPU state was not given back (" + t.not_given_back +
         "); the image holds it in the same state, so a restore would wait for the same thing: not completed";
}

void Checkpointer::refuse_image(pid_t pid, const Target& t) {
  PHOS_ERR("process %d: %s", pid, not_given_back_text(t).c_str());
  if (auto r = image::remove_completion_marker(dirfd_, t.vpid); !r) PHOS_ERR("process %d: %s", pid, r.error().message.c_str());
}

bool Checkpointer::finish(bool dump_succeeded) {
  bool pending = false, handed_over = false;
  if (!dump_succeeded)
    for (auto& [pid, t] : targets_) t.abandoned = true;
  tree_is_paused();
  if (job_) {
    const bool dumped = dump_succeeded;
    dump_succeeded = job_verdict(dump_succeeded);
    job_aborted_here_ = dumped && !dump_succeeded && criu_leaves_running();
  }
  if (!dump_succeeded)
    for (const auto& job : nccl_jobs_) abandon_nccl_job(job);
  nccl_jobs_.clear();
  // No process runs again before every copier has decided: a copy-on-write
  // copier first copies the memory other processes map through CUDA IPC,
  // and they must not write it meanwhile (CHECKPOINT_DEVICES waited for
  // each plan already where the dump got that far).
  for (auto& [pid, t] : targets_)
    if (t.plan.valid()) t.plan.wait();
  if (dump_succeeded) {
    std::vector<pid_t> given_back_now;  // as the loop below decides
    for (auto& [pid, t] : targets_)
      if (process_alive(pid) && (t.write_behind || !keeper_ || criu_leaves_running())) given_back_now.push_back(pid);
    driver_restores(given_back_now);
  }
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
    // skips it), nor a copy-on-write copy (its window is given up), so the
    // process does not wait for a useless image.
    if (!dump_succeeded) {
      t.abandoned = true;
      if (t.save && t.save->window) t.save->window->table.close(copystate::Window::kAborted);
    }
    if (dump_succeeded && !t.manifest_file.empty()) {
      if (auto r = image::write_completion_marker(dirfd_, t.vpid, t.manifest_file); !r)
        PHOS_ERR("process %d: completion marker: %s", pid, r.error().message.c_str());
      // criu ends the process next: its memory, with phos-keeper, outlives
      // criu for the restore.
      if (t.migrate && keeper_) {
        if (auto r = keeper_->keep_committed(pid); !r)
          PHOS_ERR("process %d: phos-keeper did not take the migration's memory: %s", pid, r.error().message.c_str());
        else
          PHOS_INFO("process %d: its GPU memory stays with phos-keeper (migration %s) until criu restore takes it", pid,
                    migration_id_.c_str());
      }
    } else if (auto r = image::remove_completion_marker(dirfd_, t.vpid); !r) {
      PHOS_ERR("process %d: %s", pid, r.error().message.c_str());
    }
    // Without --leave-running on its command line criu kills the process
    // after this: the give-back (criu's time otherwise) is phos-keeper's,
    // once criu has exited, for a process that lived on after all (the
    // option came through criu swrk, or a config file). Without a keeper,
    // or after a failed dump, it is given back now.
    if (dump_succeeded && keeper_ && !criu_leaves_running() && process_alive(pid)) {
      (void)copy_done(t);
      handed_over = true;
      PHOS_INFO("process %d: criu ends it after the dump; its GPU state is given back only if it outlives criu "
                "(phos-keeper)", pid);
    } else if (process_alive(pid)) {
      give_back(pid, t);
      if (!t.not_given_back.empty() && dump_succeeded) refuse_image(pid, t);
    } else {
      (void)copy_done(t);
    }
  }
  // A process whose give-back failed runs on with what the dump took:
  // phos-keeper gives it back once criu has let the process go (and the
  // thread its agent waited for with it).
  for (auto& [pid, t] : targets_)
    if (!t.not_given_back.empty() && keeper_ && process_alive(pid)) handed_over = true;
  if (dump_succeeded && criu_leaves_running()) yield_cpus_to_processes();
  // Only the write-behind targets stay (complete_pending), without fds.
  std::erase_if(targets_, [](const auto& entry) { return !entry.second.write_behind || !entry.second.fds.empty(); });
  if (!pending) targets_.clear();
  if (keeper_ && handed_over) {
    keeper_->hand_over();
  } else if (keeper_) {
    if (auto r = keeper_->done(); !r) PHOS_WARN("phos-keeper: %s", r.error().message.c_str());
  }
  keeper_.reset();
  return pending;
}

// The processes run again; what criu still does for them (the copies
// behind them, its pages written after the resume) yields them the CPUs.
void Checkpointer::yield_cpus_to_processes() {
  if (options_.behind_nice <= 0) return;
  auto lowered = lower_own_priority(options_.behind_nice);
  if (!lowered) {
    PHOS_WARN("behind_nice=%d: %s; criu's threads compete with the processes at their priority", options_.behind_nice,
              lowered.error().message.c_str());
    return;
  }
  PHOS_INFO("criu's %zu threads at nice %d while they finish behind the running processes (behind_nice)", *lowered,
            options_.behind_nice);
}

Result<void> Checkpointer::complete_pending() {
  Result<void> first;
  for (auto& [pid, t] : targets_) {
    if (!t.write_behind) continue;
    uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
    Result<void> r = copy_done(t);
    if (t.copy_on_write()) {
      t.manifest.statistics.cow_window_ns = clock_ns(CLOCK_MONOTONIC) - t.resumed_at_ns;
      // A copy that differs from the freeze (EBADMSG, the engine's check):
      // the agent is told, and the refusal names the kernels it trusted.
      const bool missed = !r.ok() && r.error().code == EBADMSG;
      agent::CloseCopyWindowReply reply;
      auto closed = close_window(pid, t, missed, &reply);
      if (missed) {
        r = make_error(sum_check::refusal(r.error().message, reply.speculated_kernels, reply.speculated_kernel_count,
                                          reply.suspects),
                       EBADMSG);
      } else if (!closed && (r.ok() || r.error().code == ECANCELED)) {
        // The window's account replaces the engine's "the process gave the
        // window up": it names the kernel, or why.
        r = closed.error();
      }
    } else if (t.agent_window) {
      // Opened, then not used (copied while the process was stopped).
      if (auto closed = close_window(pid, t); !closed)
        PHOS_WARN("process %d: %s", pid, closed.error().message.c_str());
    }
    if (r && fault("fail-write-behind")) r = make_error("fault injection (PHOS_FAULT): the write-behind fails", EIO);
    if (r && !t.not_given_back.empty()) r = make_error(not_given_back_text(t), EDEADLK);
    if (r) r = write_manifest(pid, t);
    if (r) r = image::write_completion_marker(dirfd_, t.vpid, t.manifest_file);
    if (!r && r.error().code == EBADMSG) {
      PHOS_ERR("process %d: %s", pid, r.error().message.c_str());
      if (first.ok()) first = r;
      continue;
    }
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
