#include "phos/plugin/job_driver.h"
#include "phos/support/text.h"

#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "phos/plugin/job_command.h"
#include "phos/plugin/job_env.h"
#include "phos/plugin/job_record.h"
#include "phos/plugin/job_store.h"
#include "phos/plugin/nccl_job.h"
#include "phos/support/clock.h"
#include "phos/support/tcp_store_server.h"

namespace phos::plugin {
namespace {

uint64_t draw_run() {
  uint64_t n = 0;
  while (::getrandom(&n, sizeof(n), 0) != ssize_t(sizeof(n)) || n == 0) {
  }
  return n;
}

// One host's ranks as its step reports them: "JOB NRANKS RANK:CALLS...".
struct HostRanks {
  uint64_t job_id = 0;
  int nranks = 0;
  std::vector<int> ranks;
};
Result<HostRanks> parse_host_ranks(int host, const std::string& text) {
  std::istringstream in(text);
  std::string job;
  HostRanks h;
  if (!(in >> job >> h.nranks)) return make_error("host " + std::to_string(host) + " reported '" + text + "'", EPROTO);
  auto id = parse_run_hex(job);
  if (!id) return make_error("host " + std::to_string(host) + ": " + id.error().message, EPROTO);
  h.job_id = *id;
  for (std::string pair; in >> pair;) h.ranks.push_back(std::atoi(pair.c_str()));
  return h;
}

class Driver {
 public:
  explicit Driver(const DriverOptions& o) : o_(o), run_(draw_run()), keys_(run_) {}
  int dump();
  int restore();

 private:
  void say(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  Result<void> serve();
  // Starts (or prints) every host's step; `step` builds host i's command.
  Result<void> start_steps(const std::function<std::vector<std::string>(int)>& step);
  std::vector<std::string> common_step_args(const char* kind, int host) const;
  // Every host's value of key(i), once all are set; an error naming the
  // first host that failed (its `failed` key, or its step gone) or those
  // still silent after the timeout.
  Result<std::vector<std::string>> gather(const std::function<std::string(int)>& key, const char* stage);
  // The step of host i exited (reaped, its status kept) while not done.
  std::optional<int> step_exit(int host);
  Result<void> check_ranks(const std::vector<std::string>& reports);
  Result<uint64_t> hold_rounds();
  Result<uint64_t> ready_call();
  // Before go: every step told to lift its stops and leave.
  int give_up(const Error& e);
  // After go: the outcome, once every host dumped (commit) or one failed.
  JobOutcome decide();
  Result<void> all_complete();
  int wait_steps();

  const DriverOptions& o_;
  const uint64_t run_;
  const JobKeys keys_;
  std::unique_ptr<net::TcpStoreServer> server_;
  std::optional<net::TcpStoreClient> store_;
  std::string coordinator_;
  std::map<int, pid_t> steps_;  // host -> its step's process (none with --via -)
  std::map<int, int> exited_;   // host -> its step's exit status, once reaped
  HostRanks job_;
};

void Driver::say(const char* fmt, ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  std::printf("phos job %s: %s\n", run_hex(run_).c_str(), text);
  std::fflush(stdout);
}

Result<void> Driver::serve() {
  if (o_.listen.host.empty() || o_.listen.host == "0.0.0.0" || o_.listen.host == "::")
    return make_error("--listen must name an address every host reaches the coordinator at, not '" +
                          o_.listen.host + "'",
                      EINVAL);
  auto s = net::TcpStoreServer::start(o_.listen.host, o_.listen.port);
  if (!s) return make_error("the coordination store: " + s.error().message, s.error().code);
  server_ = std::move(*s);
  coordinator_ = net::HostPort{o_.listen.host, server_->port()}.text();
  auto c = net::TcpStoreClient::connect(o_.listen.host, server_->port(), net::deadline_in(std::chrono::seconds(10)));
  if (!c) return c.error();
  store_.emplace(std::move(*c));
  return {};
}

std::vector<std::string> Driver::common_step_args(const char* kind, int host) const {
  const std::string phosctl = o_.phosctl.empty() ? own_path() : o_.phosctl;
  return {phosctl, "job", kind, "--run", run_hex(run_), "--host", std::to_string(host), "--hosts",
          std::to_string(o_.hosts), "--coordinator", coordinator_, "--dir", expand_template(o_.dir, host, ""),
          "--lib", o_.lib, "--criu", o_.criu, "--timeout", std::to_string(o_.timeout.count())};
}

Result<void> Driver::start_steps(const std::function<std::vector<std::string>(int)>& step) {
  for (int i = 0; i < o_.hosts; i++) {
    const std::string cmd = shell_line(step(i));
    if (o_.via == "-") {
      std::printf("host %d: %s\n", i, cmd.c_str());
      continue;
    }
    const std::string line = expand_template(o_.via, i, cmd);
    auto pid = start_command({"/bin/sh", "-c", line}, {});
    if (!pid) return make_error("host " + std::to_string(i) + "'s step: " + pid.error().message, pid.error().code);
    steps_[i] = *pid;
  }
  std::fflush(stdout);
  return {};
}

std::optional<int> Driver::step_exit(int host) {
  if (auto e = exited_.find(host); e != exited_.end()) return e->second;
  auto it = steps_.find(host);
  if (it == steps_.end()) return std::nullopt;
  int status = 0;
  if (::waitpid(it->second, &status, WNOHANG) != it->second) return std::nullopt;
  exited_[host] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return exited_[host];
}

Result<std::vector<std::string>> Driver::gather(const std::function<std::string(int)>& key, const char* stage) {
  std::vector<std::optional<std::string>> got(size_t(o_.hosts));
  const auto until = net::deadline_in(o_.timeout);
  for (;;) {
    bool all = true;
    for (int i = 0; i < o_.hosts; i++) {
      if (got[size_t(i)]) continue;
      auto there = store_->check({key(i)});
      if (!there) return there.error();
      if (*there) {
        auto v = wait_text(*store_, key(i), net::deadline_in(std::chrono::seconds(10)));
        if (!v) return v.error();
        got[size_t(i)] = *v;
        continue;
      }
      all = false;
      if (auto failed = store_->check({keys_.failed(i)}); failed && *failed) {
        auto why = wait_text(*store_, keys_.failed(i), net::deadline_in(std::chrono::seconds(10)));
        return make_error("host " + std::to_string(i) + ": " + (why ? *why : why.error().message), ECANCELED);
      }
      if (auto status = step_exit(i)) {
        // It may have said it just before it exited.
        if (auto late = store_->check({key(i)}); late && *late) continue;
        return make_error("host " + std::to_string(i) + "'s step exited with status " + std::to_string(*status) +
                              " before " + stage,
                          ECHILD);
      }
    }
    if (all) break;
    if (net::Clock::now() >= until) {
      std::string silent;
      for (int i = 0; i < o_.hosts; i++)
        if (!got[size_t(i)]) append_item(silent, ", ", std::to_string(i));
      return make_error("host(s) " + silent + " said nothing at " + stage + " in " +
                            std::to_string(o_.timeout.count()) + " s",
                        ETIMEDOUT);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<std::string> out;
  for (auto& g : got) out.push_back(std::move(*g));
  return out;
}

// Every host's ranks: of one communicator, each rank on one host, none
// missing.
Result<void> Driver::check_ranks(const std::vector<std::string>& reports) {
  std::map<int, int> where;
  for (int i = 0; i < o_.hosts; i++) {
    auto h = parse_host_ranks(i, reports[size_t(i)]);
    if (!h) return h.error();
    if (i == 0) job_ = *h;
    if (h->job_id != job_.job_id || h->nranks != job_.nranks)
      return make_error("host " + std::to_string(i) + "'s ranks are of NCCL communicator " + run_hex(h->job_id) +
                            " (" + std::to_string(h->nranks) + " ranks), host 0's of " + run_hex(job_.job_id) +
                            " (" + std::to_string(job_.nranks) + ")",
                        EINVAL);
    for (int r : h->ranks)
      if (auto [it, fresh] = where.emplace(r, i); !fresh)
        return make_error("rank " + std::to_string(r) + " is on host " + std::to_string(it->second) + " and host " +
                              std::to_string(i),
                          EINVAL);
  }
  std::string missing;
  for (int r = 0; r < job_.nranks; r++)
    if (!where.count(r)) append_item(missing, ", ", std::to_string(r));
  if (!missing.empty())
    return make_error("rank(s) " + missing + " of NCCL communicator " + run_hex(job_.job_id) + " (" +
                          std::to_string(job_.nranks) + " ranks) on no host's tree",
                      ESRCH);
  return {};
}

// Rounds until every host's ranks are armed at one call: the furthest
// rank's count plus a margin growing each round (as one host's hold).
Result<uint64_t> Driver::hold_rounds() {
  for (int round = 0; round < kHoldRounds; round++) {
    auto calls = gather([&](int i) { return keys_.calls(i, round); }, "the count of calls");
    if (!calls) return calls.error();
    uint64_t furthest = 0;
    for (const auto& c : *calls) furthest = std::max<uint64_t>(furthest, std::strtoull(c.c_str(), nullptr, 10));
    const uint64_t at = furthest + hold_margin(round);
    PHOS_TRY(put_text(*store_, keys_.plan(round), std::to_string(at)));
    auto armed = gather([&](int i) { return keys_.armed(i, round); }, "arming the stops");
    if (!armed) return armed.error();
    const bool all = std::all_of(armed->begin(), armed->end(), [](const std::string& a) { return a == "ok"; });
    PHOS_TRY(put_text(*store_, keys_.verdict(round), all ? "hold" : "again"));
    if (all) return at;
  }
  return make_error("the ranks ran past every stop tried", EAGAIN);
}

Result<uint64_t> Driver::ready_call() {
  auto ready = gather([&](int i) { return keys_.ready(i); }, "holding the ranks");
  if (!ready) return ready.error();
  std::optional<uint64_t> call;
  for (int i = 0; i < o_.hosts; i++) {
    const std::string& r = (*ready)[size_t(i)];
    if (r.rfind("ok ", 0) != 0) return make_error("host " + std::to_string(i) + ": " + r, EIO);
    const uint64_t c = std::strtoull(r.c_str() + 3, nullptr, 10);
    if (call && *call != c)
      return make_error("host " + std::to_string(i) + "'s ranks are held before call " + std::to_string(c) +
                            ", host 0's before " + std::to_string(*call),
                        EIO);
    call = c;
  }
  return *call;
}

int Driver::give_up(const Error& e) {
  say("the job's dump is given up before any rank let go: %s", e.message.c_str());
  if (store_) (void)put_text(*store_, keys_.abort(), e.message);
  (void)wait_steps();
  say("every host lifted its stops; every rank goes on");
  return 1;
}

JobOutcome Driver::decide() {
  const auto until = net::deadline_in(o_.timeout);
  std::set<int> dumped;
  for (;;) {
    if (auto decided = store_->check({keys_.outcome()}); decided && *decided) break;
    for (int i = 0; i < o_.hosts; i++) {
      if (dumped.count(i)) continue;
      if (auto there = store_->check({keys_.dumped(i)}); there && *there) {
        dumped.insert(i);
      } else if (auto status = step_exit(i)) {
        (void)propose_outcome(*store_, keys_, "abort: host " + std::to_string(i) + "'s step exited with status " +
                                                  std::to_string(*status) + " before its dump");
      }
    }
    if (int(dumped.size()) == o_.hosts) {
      (void)propose_outcome(*store_, keys_, "commit");
      break;
    }
    if (net::Clock::now() >= until) {
      (void)propose_outcome(*store_, keys_, "abort: not every host dumped in " + std::to_string(o_.timeout.count()) + " s");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto out = wait_outcome(*store_, keys_, net::deadline_in(std::chrono::seconds(10)));
  if (!out) return JobOutcome{false, out.error().message};
  return *out;
}

Result<void> Driver::all_complete() {
  auto complete = gather([&](int i) { return keys_.complete(i); }, "writing its images");
  if (!complete) return complete.error();
  for (int i = 0; i < o_.hosts; i++)
    if ((*complete)[size_t(i)] != "ok") return make_error("host " + std::to_string(i) + ": " + (*complete)[size_t(i)], EIO);
  return {};
}

int Driver::wait_steps() {
  int worst = 0;
  for (const auto& [host, pid] : steps_) {
    auto status = exited_.count(host) ? exited_[host] : wait_command(pid);
    exited_[host] = status;
    worst = std::max(worst, status);
  }
  return worst;
}

int Driver::dump() {
  if (auto r = serve(); !r) return say("%s", r.error().message.c_str()), 1;
  say("coordinating %d hosts at %s", o_.hosts, coordinator_.c_str());
  const uint64_t t0 = monotonic_ns();
  auto started = start_steps([&](int i) {
    auto argv = common_step_args("host-dump", i);
    const std::string vote = o_.vote.empty() ? beside_self("phos-job-vote") : o_.vote;
    argv.insert(argv.end(), {"--pid", std::to_string(o_.pids.at(i)), "--vote", vote});
    if (o_.leave_running) argv.push_back("--leave-running");
    if (!o_.criu_args.empty()) argv.push_back("--");
    argv.insert(argv.end(), o_.criu_args.begin(), o_.criu_args.end());
    return argv;
  });
  if (!started) return give_up(started.error());
  auto reports = gather([&](int i) { return keys_.ranks(i); }, "finding its ranks");
  if (!reports) return give_up(reports.error());
  if (auto r = check_ranks(*reports); !r) return give_up(r.error());
  auto at = hold_rounds();
  if (!at) return give_up(at.error());
  auto held = ready_call();
  if (!held) return give_up(held.error());
  const uint64_t t_held = monotonic_ns();
  say("all %d ranks of NCCL communicator %s held before call %" PRIu64 " on %d hosts in %.1f ms; each host's criu "
      "runs",
      job_.nranks, run_hex(job_.job_id).c_str(), *held, o_.hosts, double(t_held - t0) / 1e6);
  if (auto r = put_text(*store_, keys_.go(), "go"); !r) return give_up(r.error());
  const JobOutcome outcome = decide();
  if (!outcome.commit) {
    say("the job's dump is aborted on every host: %s; every rank goes on", outcome.why.c_str());
    (void)wait_steps();
    return 1;
  }
  auto complete = all_complete();
  const int steps = wait_steps();
  if (!complete || steps != 0) {
    say("the job's dump committed, but not every host's images are whole: %s",
        complete ? ("a step exited with status " + std::to_string(steps)).c_str() : complete.error().message.c_str());
    return 1;
  }
  say("the job's dump committed: %d hosts, %d ranks held before call %" PRIu64 "; %.1f ms in all", o_.hosts,
      job_.nranks, *held, double(monotonic_ns() - t0) / 1e6);
  return 0;
}

int Driver::restore() {
  if (auto r = serve(); !r) return say("%s", r.error().message.c_str()), 1;
  say("coordinating the restore of %d hosts at %s", o_.hosts, coordinator_.c_str());
  const uint64_t t0 = monotonic_ns();
  auto started = start_steps([&](int i) {
    auto argv = common_step_args("host-restore", i);
    if (!o_.criu_args.empty()) argv.push_back("--");
    argv.insert(argv.end(), o_.criu_args.begin(), o_.criu_args.end());
    return argv;
  });
  auto records = started ? gather([&](int i) { return keys_.record(i); }, "reading its record")
                         : Result<std::vector<std::string>>(started.error());
  Result<void> checked = records ? Result<void>() : Result<void>(records.error());
  if (records) {
    std::vector<JobRecord> parsed;
    for (const auto& text : *records) {
      auto r = parse_job_record(text);
      if (!r) {
        checked = r.error();
        break;
      }
      parsed.push_back(*r);
    }
    if (checked) checked = check_job_records(parsed, o_.hosts);
  }
  if (!checked) {
    say("the restore is refused before any host restores: %s", checked.error().message.c_str());
    if (store_) (void)put_text(*store_, keys_.abort(), checked.error().message);
    (void)wait_steps();
    return 1;
  }
  if (auto r = put_text(*store_, keys_.go(), "go"); !r) return say("%s", r.error().message.c_str()), 1;
  auto restored = gather([&](int i) { return keys_.restored(i); }, "restoring");
  std::string failed = restored ? "" : restored.error().message;
  if (restored)
    for (int i = 0; i < o_.hosts && failed.empty(); i++)
      if ((*restored)[size_t(i)].rfind("ok ", 0) != 0) failed = "host " + std::to_string(i) + ": " + (*restored)[size_t(i)];
  auto out = propose_outcome(*store_, keys_, failed.empty() ? "commit" : "abort: " + failed);
  const int steps = wait_steps();
  if (!out || !out->commit || steps != 0) {
    say("the job's restore failed: %s; what the other hosts restored was killed again",
        out ? (out->commit ? ("a step exited with status " + std::to_string(steps)).c_str() : out->why.c_str())
            : out.error().message.c_str());
    return 1;
  }
  say("the job is restored on %d hosts in %.1f ms (resume run %s)", o_.hosts, double(monotonic_ns() - t0) / 1e6,
      run_hex(run_).c_str());
  return 0;
}

}  // namespace

int run_job_dump(const DriverOptions& o) { return Driver(o).dump(); }
int run_job_restore(const DriverOptions& o) { return Driver(o).restore(); }

}  // namespace phos::plugin
