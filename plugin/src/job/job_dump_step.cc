// One host's part of a job's dump (job_step.h).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "phos/images/unique_fd.h"
#include "phos/support/clock.h"
#include "phos/support/text.h"
#include "phos/plugin/agent_client.h"
#include "phos/plugin/job_command.h"
#include "phos/plugin/job_record.h"
#include "phos/plugin/job_step.h"
#include "phos/plugin/job_store.h"
#include "phos/plugin/nccl_job.h"
#include "phos/plugin/proc.h"
#include "phos/plugin/stop_renewer.h"
#include "common/fault.h"

namespace phos::plugin {
namespace {

class DumpStep {
 public:
  explicit DumpStep(const StepOptions& o) : o_(o), keys_(o.job.run) {}
  Result<void> run();

 private:
  void say(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  Result<void> connect();
  Result<void> find_ranks();
  Result<void> hold();
  Result<bool> hold_round(int round);
  Result<void> held();
  // The value of `key` once set; ECANCELED where the driver gave the dump
  // up first.
  Result<std::string> await(const std::string& key);
  Result<void> put(const std::string& key, const std::string& value) { return put_text(*store_, key, value); }
  Result<int> dump();
  JobOutcome outcome_after(int criu_status);
  void abandon();
  void let_go();
  Result<void> commit(int criu_status);

  const StepOptions& o_;
  JobKeys keys_;
  std::optional<net::TcpStoreClient> store_;
  NcclJobRanks ranks_;
  std::vector<pid_t> pids_;  // this host's ranks, in rank order
  uint64_t at_call_ = 0;
  bool stops_armed_ = false;
  // Keeps the stops' leases while this step lives, until criu runs.
  std::optional<StopRenewer> renewer_;
};

void DumpStep::say(const char* fmt, ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "phos job %s host %d: %s\n", run_hex(o_.job.run).c_str(), o_.job.host, text);
}

Result<void> DumpStep::connect() {
  auto c = net::TcpStoreClient::connect(o_.job.coordinator.host, o_.job.coordinator.port, net::deadline_in(o_.timeout));
  if (!c) return make_error("the coordinator: " + c.error().message, c.error().code);
  store_.emplace(std::move(*c));
  return {};
}

Result<std::string> DumpStep::await(const std::string& key) {
  auto got = wait_any(*store_, {key, keys_.abort()}, net::deadline_in(o_.timeout));
  if (!got) return make_error("waiting for the other hosts: " + got.error().message, got.error().code);
  if (got->first == 1) return make_error("the job's dump was given up: " + got->second, ECANCELED);
  return got->second;
}

Result<void> DumpStep::find_ranks() {
  auto jobs = nccl_jobs_among(tree_pids(o_.root), o_.agent_timeout_ms);
  if (!jobs) return jobs.error();
  if (jobs->empty())
    return make_error("no rank of an NCCL job (a communicator with ranks in other processes, under phos's agent) "
                      "in the tree of process " + std::to_string(o_.root),
                      ESRCH);
  if (jobs->size() > 1)
    return make_error(std::to_string(jobs->size()) + " NCCL jobs in the tree of process " +
                          std::to_string(o_.root) + "; a job's dump holds one",
                      ENOTSUP);
  ranks_ = jobs->front();
  std::string text = run_hex(ranks_.job_id) + " " + std::to_string(ranks_.nranks);
  for (const auto& [rank, pid] : ranks_.ranks) {
    pids_.push_back(pid);
    append_item(text, " ", std::to_string(rank) + ":" + std::to_string(ranks_.calls[rank]));
  }
  say("%zu rank(s) of NCCL communicator %s here (of %d)", pids_.size(), run_hex(ranks_.job_id).c_str(),
      ranks_.nranks);
  renewer_.emplace(pids_, ranks_.job_id, o_.lease, o_.agent_timeout_ms,
                   [this](const std::string& why) { say("%s", why.c_str()); });
  return put(keys_.ranks(o_.job.host), text);
}

// One round: every host's ranks armed at the planned call, or lifted.
// true once the driver says every host's are (hold).
Result<bool> DumpStep::hold_round(int round) {
  const int i = o_.job.host;
  auto furthest = furthest_call(pids_, ranks_.job_id, o_.agent_timeout_ms);
  if (!furthest) return furthest.error();
  PHOS_TRY(put(keys_.calls(i, round), std::to_string(*furthest)));
  auto plan = await(keys_.plan(round));
  if (!plan) return plan.error();
  const uint64_t at = std::strtoull(plan->c_str(), nullptr, 10);
  auto armed = arm_stops(pids_, ranks_.job_id, at, o_.agent_timeout_ms, renewer_->lease_ms());
  stops_armed_ = true;
  if (!armed) return armed.error();
  renewer_->renew_at(at);
  PHOS_TRY(put(keys_.armed(i, round), *armed ? "ok" : "past"));
  auto verdict = await(keys_.verdict(round));
  if (!verdict) return verdict.error();
  if (*verdict == "hold") {
    at_call_ = at;
    return true;
  }
  // A rank somewhere was past it: every host lifts, and tries further on.
  renewer_->renew_at(std::nullopt);
  auto lifted = arm_stops(pids_, ranks_.job_id, std::nullopt, o_.agent_timeout_ms);
  if (!lifted) return lifted.error();
  return false;
}

Result<void> DumpStep::hold() {
  for (int round = 0; round < kHoldRounds; round++) {
    auto done = hold_round(round);
    if (!done) return done.error();
    if (*done) return held();
  }
  return make_error("the ranks ran past every stop tried", EAGAIN);
}

Result<void> DumpStep::held() {
  auto at = wait_held(pids_, ranks_.job_id, at_call_, o_.agent_timeout_ms, o_.hold_wait);
  if (!at) return at.error();
  at_call_ = *at;
  renewer_->renew_at(at_call_);
  PHOS_TRY(pend_releases(pids_, ranks_.job_id, o_.agent_timeout_ms));
  say("its ranks held before call %" PRIu64 ", their release pending; their stops leased for %u ms, renewed every "
      "%lld ms until criu runs",
      at_call_, renewer_->lease_ms(), static_cast<long long>(StopRenewer::interval(o_.lease).count()));
  if (fault("stall-step-before-ready")) {
    say("fault injection (PHOS_FAULT): stalling for 60 s before saying its ranks are held");
    ::sleep(60);
  }
  return put(keys_.ready(o_.job.host), "ok " + std::to_string(at_call_));
}

Result<int> DumpStep::dump() {
  // A record an earlier dump left in this directory must not stand for
  // this one if this one fails after the job committed (its pages written
  // behind, after a leave-running vote): only commit() writes it again.
  if (::unlink((o_.dir + "/" + kJobRecordName).c_str()) != 0 && errno != ENOENT)
    return errno_error("remove the earlier " + std::string(kJobRecordName) + " in " + o_.dir);
  std::vector<std::string> argv = {o_.criu, "dump", "-t", std::to_string(o_.root), "-D", o_.dir, "--lib", o_.lib,
                                   "-o", "dump.log", "-v4"};
  // A stopped dump votes at criu's post-dump, before criu kills the tree. A
  // leave-running one votes in the plugin's fini (its tree runs on either
  // way): with no action script, criu resumes the tree once its pages are
  // copied (contrib/criu 0005) instead of once they are written.
  if (o_.leave_running)
    argv.push_back("--leave-running");
  else
    argv.insert(argv.end(), {"--action-script", o_.vote});
  argv.insert(argv.end(), o_.criu_args.begin(), o_.criu_args.end());
  say("running %s", shell_line(argv).c_str());
  const uint64_t t0 = monotonic_ns();
  auto rc = run_command(argv, {std::string(kJobEnv) + "=" + o_.job.text(),
                               std::string(kJobTimeoutEnv) + "=" + std::to_string(o_.timeout.count())});
  if (!rc) return rc.error();
  say("criu exited with status %d in %.1f ms", *rc, double(monotonic_ns() - t0) / 1e6);
  return *rc;
}

// The job's outcome once this host's criu has exited: an abort proposed
// where it failed; an abort too where the outcome cannot be learnt (the
// processes then run on, here as wherever criu aborted).
JobOutcome DumpStep::outcome_after(int criu_status) {
  if (criu_status != 0) {
    const std::string why = "host " + std::to_string(o_.job.host) + ": criu dump exited with status " +
                            std::to_string(criu_status) + " (" + o_.dir + "/dump.log)";
    if (auto won = propose_outcome(*store_, keys_, "abort: " + why); won) return *won;
    return JobOutcome{false, why};
  }
  auto out = wait_outcome(*store_, keys_, net::deadline_in(o_.timeout));
  if (!out) return JobOutcome{false, "the job's outcome could not be learnt: " + out.error().message};
  return *out;
}

// An aborted dump: a rank criu never paused is still held, its release
// pending; it releases and makes its communicator again under the run, as
// the ranks criu gave back do, so that all meet. Then every stop is lifted.
void DumpStep::abandon() {
  if (renewer_) renewer_->stop();
  for (pid_t p : pids_) {
    if (!process_alive(p)) continue;
    auto r = with_agent(p, o_.agent_timeout_ms, [&](AgentClient& c) -> Result<void> {
      auto s = c.status();
      if (!s) return s.error();
      const auto* comm = job_communicator(*s, ranks_.job_id);
      if (!comm || comm->released || !comm->stop_at) return {};  // given back by criu's plugin
      if (auto q = c.quiesce(o_.quiesce_timeout_ms); !q) return q.error();
      return c.resume(o_.job.run);
    });
    if (!r)
      say("process %d could not release and make again its communicator (%s): the other ranks wait for it", int(p),
          r.error().message.c_str());
  }
  let_go();
}

void DumpStep::let_go() {
  if (renewer_) renewer_->stop();  // none arms a stop again after it is lifted
  if (!stops_armed_) return;
  for (const auto& why : let_nccl_job_go(NcclJobHeld{ranks_.job_id, at_call_, pids_}, o_.agent_timeout_ms))
    say("%s", why.c_str());
}

Result<void> DumpStep::commit(int criu_status) {
  if (criu_status != 0)
    return make_error("criu exited with status " + std::to_string(criu_status) +
                          " after the job committed (its images written behind failed): this host's images are "
                          "incomplete",
                      EIO);
  UniqueFd dirfd(::open(o_.dir.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  if (!dirfd.valid()) return errno_error("open " + o_.dir);
  JobRecord rec{o_.job.run, o_.job.host, o_.job.hosts, ranks_.job_id, ranks_.nranks, at_call_, {}};
  for (const auto& [rank, pid] : ranks_.ranks) rec.ranks.push_back(rank);
  return write_job_record(dirfd.get(), rec);
}

Result<void> DumpStep::run() {
  PHOS_TRY(connect());
  auto before_go = [&]() -> Result<void> {
    PHOS_TRY(find_ranks());
    PHOS_TRY(hold());
    auto go = await(keys_.go());
    if (!go) return go.error();
    return {};
  }();
  if (!before_go) {
    // Nothing was released: lifting the stops lets every rank go on.
    if (before_go.error().code != ECANCELED) (void)put(keys_.failed(o_.job.host), before_go.error().message);
    let_go();
    return before_go.error();
  }
  // Another host may have failed since go: then no criu runs here.
  if (auto decided = store_->check({keys_.outcome()}); decided && *decided) {
    auto out = wait_outcome(*store_, keys_, net::deadline_in(o_.timeout));
    if (out && !out->commit) {
      abandon();
      (void)put(keys_.complete(o_.job.host), "error: aborted: " + out->why);
      return make_error("the job's dump was aborted before criu ran here (" + out->why + "); every rank here goes on",
                        ECANCELED);
    }
  }
  // The renewals end here: criu freezes the ranks once it has paused them,
  // and its pause's quiesce takes each stop over within this last lease,
  // the job's timeout (stop_renewer.h; the lease where that is longer).
  const std::chrono::milliseconds last_lease = o_.timeout;
  auto renewed = renewer_->finish(last_lease);
  if (renewed)
    say("its ranks' stops renewed %" PRIu64 " time(s); no more renewals, the last one leased for %lld ms (the "
        "job's timeout): criu's pause takes them over",
        renewer_->renewals(), static_cast<long long>(last_lease.count()));
  auto status = renewed ? dump() : Result<int>(renewed.error());
  if (!status) {
    (void)propose_outcome(*store_, keys_, "abort: host " + std::to_string(o_.job.host) + ": " + status.error().message);
    abandon();
    return status.error();
  }
  const JobOutcome outcome = outcome_after(*status);
  if (!outcome.commit) {
    abandon();
    (void)put(keys_.complete(o_.job.host), "error: aborted: " + outcome.why);
    return make_error("the job's dump was aborted (" + outcome.why + "); every rank here goes on", ECANCELED);
  }
  auto done = commit(*status);
  (void)put(keys_.complete(o_.job.host), done ? "ok" : "error: " + done.error().message);
  if (!done) return done.error();
  say("dumped into %s (the job committed)", o_.dir.c_str());
  return {};
}

}  // namespace

int run_dump_step(const StepOptions& o) {
  auto r = DumpStep(o).run();
  if (r) return 0;
  std::fprintf(stderr, "phos job %s host %d: the dump failed: %s\n", run_hex(o.job.run).c_str(), o.job.host,
               r.error().message.c_str());
  return 1;
}

}  // namespace phos::plugin
