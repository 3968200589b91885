// One host's part of a checkpoint or a restore of a job across hosts
// (`phosctl job host-dump|host-restore`, started by `phosctl job
// dump|restore` through the user's template, or by a node agent). Each
// talks to its own host's ranks and criu, and to the other hosts through
// the driver's coordination store only (job_store.h).
//
// A dump step: finds its ranks (the tree under --pid), holds them at the
// call the driver plans, round by round, with every other host's (every
// rank's stop armed at one call K before any release); makes their release
// pending; and once every host is ready, runs criu with PHOS_JOB and the
// vote (phos-job-vote, criu's action script; a leave-running dump's vote is
// the plugin's, in its fini: Checkpointer::job_verdict, where criu's pages
// are copied but may not be written yet: a host whose writes then fail
// reports its part incomplete and writes no job record, and the job's
// restore refuses the set). The job's dump commits only
// once every host's criu has dumped; a host whose dump fails aborts it on
// every host, every rank carrying on (given back, or released and made
// again under the dump run, so that all meet). A restore step: publishes
// its host's record, runs criu restore with PHOS_JOB (the resume run) once
// the driver has checked every host's, and kills what it restored where
// another host's restore failed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "phos/plugin/job_env.h"

namespace phos::plugin {

struct StepOptions {
  JobRun job;               // the run, this host's index, the host count, the coordinator
  pid_t root = 0;           // a dump: the root of this host's tree (criu -t)
  std::string dir;          // this host's image directory
  std::string lib;          // criu --lib
  std::string criu = "criu";
  std::string vote;         // a stopped dump: criu's action script (phos-job-vote)
  bool leave_running = false;
  std::vector<std::string> criu_args;
  std::chrono::seconds timeout{120};  // the longest wait on the other hosts, at each step
  int agent_timeout_ms = 10000;
  uint32_t quiesce_timeout_ms = 10000;  // an aborted dump's release of a rank criu never paused
  std::chrono::milliseconds hold_wait{10000};  // the ranks reaching the planned call
  // A dump: the lease on each rank's stop (job_lease_ms, stop_renewer.h):
  // a rank whose stop this step stops renewing (killed before criu runs)
  // goes on after this long.
  std::chrono::milliseconds lease{10000};
};

// 0 where the job's dump committed and this host's images are whole; 1
// otherwise (said why on stderr).
int run_dump_step(const StepOptions& o);
// 0 where every host restored; 1 otherwise (what this host restored is
// killed again).
int run_restore_step(const StepOptions& o);

}  // namespace phos::plugin
