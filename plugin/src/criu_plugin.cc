// phos_plugin.so: the CRIU plugin. GPL-2.0-or-later (it builds against
// CRIU's criu-plugin.h).
//
// Only the glue to CRIU lives here: hooks take C arguments, return 0, -ENOTSUP
// for processes that are not ours (so other plugins, CRIU's cuda plugin too,
// handle them) or a negative errno; no exception crosses into CRIU.
// criu-plugin.h is a C header without extern "C" of its own.
extern "C" {
#include <criu/criu-plugin.h>
}

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <memory>

#include "dump/checkpoint.h"
#include "phos/images/agent_messages.h"
#include "phos/plugin/job_env.h"
#include "phos/plugin/proc.h"
#include "phos/plugin/log.h"
#include "phos/plugin/options.h"
#include "phos/support/clock.h"
#include "restore/restore.h"

namespace {

using phos::plugin::Checkpointer;
using phos::plugin::PluginOptions;
using phos::plugin::Restorer;

// 32768 descriptors: the page pipes of about 16 GB of CPU pages at 1 MiB a
// pipe, in a table of 256 KiB.
constexpr int kCriuFdTable = 32768;
// The pipe size that lets criu's page pipes reach their own bound (819
// pages, rounded up by the kernel to 1024).
constexpr size_t kCriuPipeSize = 4u << 20;

int g_stage = -1;
std::unique_ptr<Checkpointer> g_checkpointer;
std::unique_ptr<Restorer> g_restorer;

template <class Fn>
int guarded(const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    PHOS_ERR("%s: %s", what, e.what());
  } catch (...) {
    PHOS_ERR("%s: unknown exception", what);
  }
  return -EINVAL;
}

int hook_result(const char* what, int pid, const phos::Result<bool>& r) {
  if (!r) {
    PHOS_ERR("%s(%d): %s", what, pid, r.error().message.c_str());
    return r.error().code > 0 ? -r.error().code : -EINVAL;
  }
  return *r ? 0 : -ENOTSUP;
}

// criu's page pipes take descriptors by the thousand once the tasks are
// frozen; phos's threads make each growth of criu's table wait for an RCU
// grace period (proc.h): grown once, here. And where fs.pipe-max-size holds
// those pipes back, the log says so.
void prepare_criu_for_dump() {
  const uint64_t t0 = phos::monotonic_ns();
  if (auto size = phos::plugin::reserve_fd_table(kCriuFdTable); size)
    PHOS_INFO("criu's descriptor table sized for %zu descriptors (its page pipes) in %.1f ms", *size,
              double(phos::monotonic_ns() - t0) / 1e6);
  else
    PHOS_INFO("criu's descriptor table not sized ahead: %s", size.error().message.c_str());
  if (auto bound = phos::plugin::pipe_size_bound(); bound && *bound < kCriuPipeSize)
    PHOS_INFO("criu's page pipes are held to %zu KiB by fs.pipe-max-size (criu lacks CAP_SYS_RESOURCE); "
              "%zu there lets them grow to criu's own 3.2 MiB (README, \"The host: criu's page pipes\")",
              *bound >> 10, kCriuPipeSize);
}

int phos_init(int stage) {
  return guarded("init", [&] {
    g_stage = stage;
    // One host's criu of a job across hosts (phosctl job): a malformed
    // PHOS_JOB refuses the whole run, before anything is taken.
    if (const auto& job = phos::plugin::job_run_of_process(); !job) {
      PHOS_ERR("%s", job.error().message.c_str());
      return -1;
    } else if (*job) {
      PHOS_INFO("one host's part of a job across hosts: %s=%s", phos::plugin::kJobEnv, (*job)->text().c_str());
    }
    PluginOptions options = PluginOptions::load();
    // criu's CUDA state (the engine's contexts and staging) is torn down by
    // the driver as criu's files close at its exit, 90-140 ms that its
    // caller waited for: a child takes that wait (proc.h).
    if (stage == CR_PLUGIN_STAGE__DUMP || stage == CR_PLUGIN_STAGE__RESTORE) phos::plugin::hold_files_at_exit("/dev/nvidia");
    if (stage == CR_PLUGIN_STAGE__DUMP) {
      prepare_criu_for_dump();
      g_checkpointer = std::make_unique<Checkpointer>(criu_get_image_dir(), options);
    } else if (stage == CR_PLUGIN_STAGE__RESTORE) {
      g_restorer = std::make_unique<Restorer>(criu_get_image_dir(), options);
      if (auto r = g_restorer->load(); !r) {
        PHOS_ERR("cannot restore: %s", r.error().message.c_str());
        return -1;
      }
    }
    static const char* const stages[] = {"dump", "pre-dump", "restore"};
    PHOS_INFO("plugin %s initialized for %s", PHOS_VERSION, stage >= 0 && stage < 3 ? stages[stage] : "?");
    return 0;
  });
}

// The images written behind the processes, finished; false when one
// failed (logged).
bool complete_images() {
  return guarded("exit", [&] {
    auto r = g_checkpointer->complete_pending();
    g_checkpointer.reset();
    if (r) return 0;
    PHOS_ERR("the dump failed after the processes ran again: %s", r.error().message.c_str());
    return -1;
  }) == 0;
}

// At criu's exit, after it let the processes go. A failure turns criu's exit
// status into one (criu reported success before the GPU data was written),
// so a script sees it. The plugin is linked -z nodelete, so it stays loaded
// after criu's dlclose for this to run.
void complete_at_exit() {
  if (!complete_images()) _exit(1);
}

// A failure criu cannot learn from a plugin, so would exit 0 for: a restore
// whose GPU state failed after criu created the processes (they were
// killed), or a job's leave-running dump the job aborted after criu dumped
// here (criu knows nothing of the job, job_step.h).
void fail_at_exit() { _exit(1); }

void phos_exit(int stage, int ret) {
  bool pending = false;
  guarded("exit", [&] {
    // On-demand restore: the fill ends here, the processes running.
    if (stage == CR_PLUGIN_STAGE__RESTORE && g_restorer) g_restorer->finish();
    if (stage == CR_PLUGIN_STAGE__RESTORE && g_restorer && g_restorer->failed() && ret == 0) {
      PHOS_ERR("the restore failed: a process's GPU state could not be restored (see above); it was killed");
      std::atexit(fail_at_exit);
    }
    if (stage == CR_PLUGIN_STAGE__DUMP && g_checkpointer) {
      pending = g_checkpointer->finish(ret == 0);
      if (g_checkpointer->job_aborted_here()) {
        PHOS_ERR("the job's dump was aborted: this host's images are not the job's; criu exits with status 1");
        std::atexit(fail_at_exit);
      }
    }
    return 0;
  });
  if (pending) {
    if (std::atexit(complete_at_exit) == 0) return;
    // No exit handler: the images are finished now, inside criu's fini; a
    // failure is logged only.
    PHOS_WARN("cannot run at criu's exit; the images are written now");
    (void)complete_images();
  }
  g_checkpointer.reset();
  g_restorer.reset();
}

// criu pre-dump (iterative migration) copies a process's memory while it
// runs; a process under phos has its GPU memory mapped from the driver, which
// criu's pre-dump cannot handle ("Can't handle non-regular mapping"). It is
// refused here, before criu stops it, with the reason; the process runs on.
int refuse_pre_dump(int pid) {
  auto agent = phos::plugin::find_listening_socket(pid, phos::agent::kSocketPrefix);
  if (!agent || !agent->has_value()) return -ENOTSUP;  // not ours: other plugins decide
  PHOS_ERR("process %d runs under phos: criu pre-dump of its GPU state is not supported; use criu dump (with "
           "--leave-running its device memory is written while it runs on)",
           pid);
  return -EPERM;
}

int phos_pause_devices(int pid) {
  if (g_stage == CR_PLUGIN_STAGE__PRE_DUMP) return guarded("pause_devices", [&] { return refuse_pre_dump(pid); });
  if (!g_checkpointer) return -ENOTSUP;
  return guarded("pause_devices", [&] { return hook_result("pause_devices", pid, g_checkpointer->pause(pid)); });
}

int phos_checkpoint_devices(int pid) {
  if (!g_checkpointer) return -ENOTSUP;
  return guarded("checkpoint_devices",
                 [&] { return hook_result("checkpoint_devices", pid, g_checkpointer->checkpoint(pid)); });
}

int phos_resume_devices_late(int pid) {
  if (!g_restorer) return -ENOTSUP;
  return guarded("resume_devices_late",
                 [&] { return hook_result("resume_devices_late", pid, g_restorer->resume_late(pid)); });
}

}  // namespace

// Like CR_PLUGIN_REGISTER, but max_hooks counts only the hooks phos uses, so
// the same build loads in every CRIU from 4.0 on (CRIU refuses descriptors
// with more hooks than it knows).
extern "C" {
__attribute__((visibility("default"))) cr_plugin_desc_t CR_PLUGIN_DESC = {
    "phos", phos_init, phos_exit, CRIU_PLUGIN_VERSION, CR_PLUGIN_HOOK__CHECKPOINT_DEVICES + 1, {},
};
}

__attribute__((constructor)) static void phos_register_hooks() {
  CR_PLUGIN_DESC.hooks[CR_PLUGIN_HOOK__PAUSE_DEVICES] = reinterpret_cast<void*>(phos_pause_devices);
  CR_PLUGIN_DESC.hooks[CR_PLUGIN_HOOK__CHECKPOINT_DEVICES] = reinterpret_cast<void*>(phos_checkpoint_devices);
  CR_PLUGIN_DESC.hooks[CR_PLUGIN_HOOK__RESUME_DEVICES_LATE] = reinterpret_cast<void*>(phos_resume_devices_late);
}
