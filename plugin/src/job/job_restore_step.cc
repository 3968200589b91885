// One host's part of a job's restore (job_step.h).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "phos/images/image_dir.h"
#include "phos/support/clock.h"
#include "phos/images/unique_fd.h"
#include "phos/plugin/job_command.h"
#include "phos/plugin/job_record.h"
#include "phos/plugin/job_step.h"
#include "phos/plugin/job_store.h"
#include "phos/plugin/proc.h"

namespace phos::plugin {
namespace {

constexpr const char* kPidFile = "phos-job-restored.pid";

class RestoreStep {
 public:
  explicit RestoreStep(const StepOptions& o) : o_(o), keys_(o.job.run) {}
  Result<void> run();

 private:
  void say(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  Result<void> publish_record();
  Result<pid_t> restore();
  void kill_restored(pid_t root);

  const StepOptions& o_;
  JobKeys keys_;
  std::optional<net::TcpStoreClient> store_;
};

void RestoreStep::say(const char* fmt, ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "phos job %s host %d: %s\n", run_hex(o_.job.run).c_str(), o_.job.host, text);
}

// This host's record, checked against its place in the job, for the
// driver to check against the others'.
Result<void> RestoreStep::publish_record() {
  UniqueFd dirfd(::open(o_.dir.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  if (!dirfd.valid()) return errno_error("open " + o_.dir);
  auto rec = read_job_record(dirfd.get());
  if (!rec) return make_error(o_.dir + ": " + rec.error().message, rec.error().code);
  if (!*rec)
    return make_error(o_.dir + " has no " + std::string(kJobRecordName) +
                          " record: not a complete checkpoint of a job across hosts (phosctl job dump writes it "
                          "once every host's dump committed)",
                      ENOENT);
  if ((*rec)->host != o_.job.host || (*rec)->hosts != o_.job.hosts)
    return make_error(o_.dir + " holds host " + std::to_string((*rec)->host) + " of " +
                          std::to_string((*rec)->hosts) + ", not host " + std::to_string(o_.job.host) + " of " +
                          std::to_string(o_.job.hosts),
                      EINVAL);
  return put_text(*store_, keys_.record(o_.job.host), format_job_record(**rec));
}

Result<pid_t> RestoreStep::restore() {
  std::vector<std::string> argv = {o_.criu, "restore", "-D", o_.dir, "--lib", o_.lib, "-d",
                                   "-o", "restore.log", "-v4", "--pidfile", kPidFile};
  argv.insert(argv.end(), o_.criu_args.begin(), o_.criu_args.end());
  say("running %s", shell_line(argv).c_str());
  const uint64_t t0 = monotonic_ns();
  auto rc = run_command(argv, {std::string(kJobEnv) + "=" + o_.job.text()});
  if (!rc) return rc.error();
  say("criu exited with status %d in %.1f ms", *rc, double(monotonic_ns() - t0) / 1e6);
  if (*rc != 0)
    return make_error("criu restore exited with status " + std::to_string(*rc) + " (" + o_.dir + "/restore.log)",
                      EIO);
  auto root = read_pid_file(o_.dir, kPidFile);
  if (!root) return make_error("the restored root's pid: " + root.error().message, root.error().code);
  return *root;
}

// Another host's restore failed: this host's ranks would wait out their
// rendezvous for peers that never come.
void RestoreStep::kill_restored(pid_t root) {
  std::vector<pid_t> tree = tree_pids(root);
  for (auto it = tree.rbegin(); it != tree.rend(); ++it)
    if (::kill(*it, SIGKILL) != 0) say("kill %d: %s", int(*it), std::strerror(errno));
  say("killed the %zu restored process(es) under %d", tree.size(), int(root));
}

Result<void> RestoreStep::run() {
  auto c = net::TcpStoreClient::connect(o_.job.coordinator.host, o_.job.coordinator.port, net::deadline_in(o_.timeout));
  if (!c) return make_error("the coordinator: " + c.error().message, c.error().code);
  store_.emplace(std::move(*c));
  if (auto r = publish_record(); !r) {
    (void)put_text(*store_, keys_.failed(o_.job.host), r.error().message);
    return r.error();
  }
  auto go = wait_any(*store_, {keys_.go(), keys_.abort()}, net::deadline_in(o_.timeout));
  if (!go) return make_error("waiting for the other hosts: " + go.error().message, go.error().code);
  if (go->first == 1) return make_error("the job's restore was given up: " + go->second, ECANCELED);
  auto root = restore();
  (void)put_text(*store_, keys_.restored(o_.job.host),
                 root ? "ok " + std::to_string(*root) : "error: " + root.error().message);
  if (!root) {
    (void)propose_outcome(*store_, keys_, "abort: host " + std::to_string(o_.job.host) + ": " + root.error().message);
    return root.error();
  }
  auto out = wait_outcome(*store_, keys_, net::deadline_in(o_.timeout));
  if (!out || !out->commit) {
    kill_restored(*root);
    return make_error("the job's restore was aborted: " + (out ? out->why : out.error().message), ECANCELED);
  }
  say("restored (root process %d)", int(*root));
  return {};
}

}  // namespace

int run_restore_step(const StepOptions& o) {
  auto r = RestoreStep(o).run();
  if (r) return 0;
  std::fprintf(stderr, "phos job %s host %d: the restore failed: %s\n", run_hex(o.job.run).c_str(), o.job.host,
               r.error().message.c_str());
  return 1;
}

}  // namespace phos::plugin
