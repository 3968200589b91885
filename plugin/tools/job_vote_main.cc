// phos-job-vote: criu's action script for one host's dump of a job across
// hosts (phosctl job, job_step.h). At post-dump (every image of this host
// written, the tree still frozen) it tells the coordinator this host
// dumped and waits for the job's outcome: 0 lets criu finish (kill the
// tree, or let it go with --leave-running); 1 makes criu fail the dump and
// leave the tree running, as every other host's does when one failed.
// Any other action: 0. criu runs it with no arguments (--action-script
// takes a path), its environment carrying PHOS_JOB.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "phos/plugin/job_env.h"
#include "phos/plugin/job_store.h"
#include "phos/support/tcp_store_client.h"

using namespace phos::plugin;

int main() {
  const char* action = std::getenv("CRTOOLS_SCRIPT_ACTION");
  if (!action || std::strcmp(action, "post-dump") != 0) return 0;
  const auto& job = job_run_of_process();
  if (!job) return std::fprintf(stderr, "phos-job-vote: %s\n", job.error().message.c_str()), 1;
  if (!*job) return std::fprintf(stderr, "phos-job-vote: no %s: not one host's dump of a job; nothing to vote\n", kJobEnv), 0;
  const JobRun& j = **job;
  const std::string host = "host " + std::to_string(j.host);
  auto store = phos::net::TcpStoreClient::connect(j.coordinator.host, j.coordinator.port,
                                                  phos::net::deadline_in(std::chrono::seconds(10)));
  if (!store) {
    std::fprintf(stderr, "phos-job-vote: %s: the coordinator: %s; this host's dump fails, its tree runs on\n",
                 host.c_str(), store.error().message.c_str());
    return 1;
  }
  const JobKeys keys(j.run);
  if (auto r = put_text(*store, keys.dumped(j.host), "ok"); !r) {
    std::fprintf(stderr, "phos-job-vote: %s: %s\n", host.c_str(), r.error().message.c_str());
    return 1;
  }
  auto out = wait_outcome(*store, keys, phos::net::deadline_in(job_timeout()));
  if (!out) out = propose_outcome(*store, keys, "abort: " + host + ": no outcome from the coordinator in " +
                                                    std::to_string(job_timeout().count()) + " s");
  if (!out) {
    std::fprintf(stderr, "phos-job-vote: %s: %s; this host's dump fails\n", host.c_str(), out.error().message.c_str());
    return 1;
  }
  std::fprintf(stderr, "phos-job-vote: %s: the job's dump %s%s\n", host.c_str(), out->commit ? "commits" : "is aborted: ",
               out->why.c_str());
  return out->commit ? 0 : 1;
}
