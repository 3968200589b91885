// `phosctl job dump|restore`: one command for the per-host dumps and
// restores of a job whose ranks run on several hosts. The driver serves the
// coordination store (job_store.h) outside every dumped tree, starts each
// host's step (job_step.h) through the user's template, and decides each
// stage for all hosts: the call every rank is held at, when criu runs, and
// whether the job's dump commits (every host dumped) or aborts (any host
// failed: each host's criu then leaves its processes running, and every
// rank makes its communicator again with its peers).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "phos/support/socket_io.h"

namespace phos::plugin {

struct DriverOptions {
  int hosts = 0;
  // How a host's step runs: a shell command with {i} (the host's index)
  // and {cmd} (the step's command line), e.g. "ssh node{i} {cmd}" or
  // "ip netns exec h{i} {cmd}"; "-": the steps are printed, for node
  // agents to run, and the driver waits for them.
  std::string via;
  std::map<int, pid_t> pids;  // a dump: each host's tree root, as that host sees it
  std::string dir;            // each host's image directory ({i}: the index)
  std::string lib;            // criu --lib on the hosts
  std::string criu = "criu";  // criu on the hosts
  std::string phosctl;        // phosctl on the hosts (default: this one's path)
  std::string vote;           // phos-job-vote on the hosts (default: beside phosctl)
  net::HostPort listen;       // the coordinator's address as the hosts reach it (port 0: any)
  bool leave_running = false;
  std::chrono::seconds timeout{120};  // the longest any host may stay silent at a stage
  std::vector<std::string> criu_args;
};

// 0 where every host's dump committed and its images are whole.
int run_job_dump(const DriverOptions& o);
// 0 where every host restored.
int run_job_restore(const DriverOptions& o);

}  // namespace phos::plugin
