// phosctl periodic and phosctl supervise: a job checkpointed periodically
// into a series of image directories (periodic.h), each dump by criu with
// --leave-running; supervise also starts the job (or adopts a running one)
// and restores it from its last complete image each time it dies.
//
// One loop serves both: it polls (every 20 ms) for its children's ends
// (the job's, criu's) and for a GPU image still being finished after criu
// exited, so a job that dies during a dump is seen at once.
// It is a child subreaper: a job criu restored with -d becomes its child
// once criu exits, and its end is seen like the first job's.
#include "phosctl_supervise.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "phos/images/image_dir.h"
#include "phos/plugin/job_command.h"
#include "phos/plugin/periodic.h"
#include "phos/plugin/proc.h"
#include "phos/support/clock.h"
#include "phos/support/unique_fd.h"
#include "phosctl_args.h"

namespace {

using phos::plugin::SeriesImage;

constexpr const char* kUsage =
    "usage: phosctl periodic PID --dir ROOT --lib LIBDIR (--interval D | --mtbf D) [OPTIONS]\n"
    "       phosctl supervise (--pid PID | -- COMMAND...) --dir ROOT --lib LIBDIR (--interval D | --mtbf D)\n"
    "                         [--max-restarts N] [--gpu-map MAP] [OPTIONS]\n"
    "  periodic: checkpoint the running process PID (criu dump --leave-running) every interval, each image in\n"
    "  a directory of its own under ROOT (000001, 000002, ...), complete once phos-series-complete is in it.\n"
    "  supervise: the same for a job it starts (COMMAND, in a session of its own, its input and output\n"
    "  /dev/null) or adopts (--pid); when the job dies (a signal, or an exit status other than 0) it is\n"
    "  restored from its last complete image (criu restore -d), at most N times (--max-restarts, default 3).\n"
    "  --interval D       a fixed interval (D: 90s, 10m, 6h, 1.5d, 250ms or seconds)\n"
    "  --mtbf D           the job's mean time between failures: the interval is Young/Daly's from it and the\n"
    "                     cost of the first checkpoint, measured (printed with the formula and its inputs)\n"
    "  --first D          the first checkpoint after D (default: the interval; 10s with --mtbf)\n"
    "  --keep N           keep the last N complete images (default 3); older ones go once a newer one is\n"
    "                     complete, never one a kept incremental image needs\n"
    "  --incremental      each image against the one before (phos's parent_image: only changed GPU chunks\n"
    "                     stored), a full image every --full-every F dumps (default 4)\n"
    "  --count N          stop after N complete checkpoints (the job runs on)\n"
    "  --criu CRIU        criu's path (default: criu on PATH)\n"
    "  --criu-arg ARG     an argument for every criu dump and restore (repeat for more)\n"
    "  --dump-env N=V     set in criu's environment for dumps (phos's options: PHOS_*)\n"
    "  --gpu-map MAP      restores put the job on these GPUs (PHOS_GPU_MAP, e.g. 0=1)\n"
    "  --stop-grace D     asked to stop (SIGTERM, SIGINT), the job gets SIGTERM, then SIGKILL after D\n"
    "                     (default 10s)\n";

int usage(const std::string& why) {
  std::fprintf(stderr, "phosctl: %s\n%s", why.c_str(), kUsage);
  return 2;
}

struct Options {
  bool supervise = false;
  pid_t pid = 0;                      // adopted
  std::vector<std::string> command;   // started
  std::string root, lib, criu = "criu", gpu_map;
  std::vector<std::string> criu_args, dump_env;
  std::optional<double> interval_s, mtbf_s, first_s;
  double stop_grace_s = 10;
  size_t keep = 3;
  bool incremental = false;
  unsigned full_every = 4;
  unsigned max_restarts = 3;
  uint64_t count = 0;  // 0: no end
};

// The options; an error message, empty where they are right.
std::string parse(const std::vector<std::string>& args, Options& o) {
  std::string err;
  auto a = phosctl::parse_args(args, {"--incremental"}, o.supervise ? 0 : 1, err);
  if (!a) return err;
  o.command = a->rest;
  long n = 0;
  if (!a->positional.empty()) {
    if (!phosctl::number(a->positional[0], 1, INT32_MAX, n)) return "'" + a->positional[0] + "' is not a pid";
    o.pid = pid_t(n);
  }
  for (const auto& [name, v] : a->values) {
    auto duration = [&](std::optional<double>& out) -> std::string {
      auto d = phos::plugin::parse_duration(v);
      if (!d) return name + ": " + d.error().message;
      out = *d;
      return {};
    };
    std::optional<double> grace;
    if (name == "--incremental") o.incremental = true;
    else if (name == "--dir") o.root = v;
    else if (name == "--lib") o.lib = v;
    else if (name == "--criu") o.criu = v;
    else if (name == "--criu-arg") o.criu_args.push_back(v);
    else if (name == "--dump-env" && v.find('=') != std::string::npos) o.dump_env.push_back(v);
    else if (name == "--gpu-map") o.gpu_map = v;
    else if (name == "--interval") err = duration(o.interval_s);
    else if (name == "--mtbf") err = duration(o.mtbf_s);
    else if (name == "--first") err = duration(o.first_s);
    else if (name == "--stop-grace") err = duration(grace);
    else if (name == "--keep" && phosctl::number(v, 1, LONG_MAX, n)) o.keep = size_t(n);
    else if (name == "--full-every" && phosctl::number(v, 1, 999, n)) o.full_every = unsigned(n);
    else if (name == "--max-restarts" && phosctl::number(v, 0, 99999, n)) o.max_restarts = unsigned(n);
    else if (name == "--count" && phosctl::number(v, 0, LONG_MAX, n)) o.count = uint64_t(n);
    else if (name == "--pid" && o.supervise && phosctl::number(v, 1, INT32_MAX, n)) o.pid = pid_t(n);
    else return "bad option " + name + " " + v;
    if (!err.empty()) return err;
    if (grace) o.stop_grace_s = *grace;
  }
  if (o.root.empty() || o.lib.empty()) return "--dir and --lib are needed";
  if (o.interval_s.has_value() == o.mtbf_s.has_value()) return "one of --interval and --mtbf is needed";
  if (o.interval_s && *o.interval_s <= 0) return "--interval must be more than 0";
  if (o.mtbf_s && *o.mtbf_s <= 0) return "--mtbf must be more than 0";
  if (o.supervise && (o.pid != 0) == !o.command.empty()) return "supervise takes --pid PID or -- COMMAND, one of them";
  if (!o.supervise && (!o.pid || !o.command.empty())) return "periodic takes the pid of a running process";
  return {};
}

double now_s() { return double(phos::realtime_ns()) / 1e9; }

volatile sig_atomic_t g_stop = 0;
void on_stop(int) { g_stop = 1; }

std::string death_text(int status) {
  char buf[128];
  if (WIFSIGNALED(status))
    std::snprintf(buf, sizeof(buf), "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else
    std::snprintf(buf, sizeof(buf), "exited with status %d", WEXITSTATUS(status));
  return buf;
}

// The job, started in a session of its own (criu dumps a session leader's
// tree without --shell-job), its input and output /dev/null (criu would
// refuse a pipe to us, and a regular file that grew), no other fd.
phos::Result<pid_t> start_job(const std::vector<std::string>& command) {
  pid_t child = ::fork();
  if (child < 0) return phos::make_error(std::string("fork: ") + std::strerror(errno), errno);
  if (child == 0) {
    ::setsid();
    int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, 0), ::dup2(null, 1), ::dup2(null, 2);
      if (null > 2) ::close(null);
    }
    // Nothing of ours beyond them: criu would have to carry it (a file of
    // another mount namespace it cannot even name).
    ::close_range(3, ~0U, 0);
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    _exit(127);
  }
  return child;
}

// The GPU images in DIR, each opened once (with its parents): whether all
// are complete (the reason where one is not) and the longest stall their
// manifests report (a leave-running dump's cost to the job; 0 where none
// says, a process without GPU state).
struct GpuImages {
  std::optional<std::string> incomplete;
  double stall_s = 0;
};
GpuImages gpu_images(const std::string& dir) {
  GpuImages out;
  phos::UniqueFd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dirfd.valid()) return out.incomplete = dir + ": " + std::strerror(errno), out;
  auto pids = phos::image::list_process_images(dirfd.get());
  if (!pids) return out.incomplete = pids.error().message, out;
  uint64_t stall = 0;
  for (int32_t vpid : *pids) {
    auto img = phos::image::open_process_image(dirfd.get(), vpid, false);
    if (!img) return out.incomplete = img.error().message, out;
    if (!img->complete)
      return out.incomplete = "process " + std::to_string(vpid) + "'s GPU image: " + img->incomplete_reason, out;
    stall = std::max(stall, img->manifest.statistics.stall_ns);
  }
  out.stall_s = double(stall) / 1e9;
  return out;
}

class Supervisor {
 public:
  explicit Supervisor(Options o) : o_(std::move(o)) {}
  int run();

 private:
  // ---- the series
  void prune();
  std::optional<std::string> parent_for_next();
  void start_dump();
  void dump_ended(int status);
  // criu exited 0 but a GPU image is still being finished (a helper): the
  // loop polls it (finish_dump), 10 minutes at most.
  void poll_image();
  void finish_dump(const GpuImages& images);
  void dump_failed(std::string why);
  bool dump_in_flight() const { return criu_ || image_since_ > 0; }
  // The job died during a dump: criu (3 s, then killed) and the image being
  // finished (3 s, then failed) are settled first.
  void settle_dump();
  // Asked to stop: SIGTERM to the job and criu, SIGKILL after the grace.
  void stop(double& stop_at);
  void schedule(double after_s) { next_dump_at_ = now_s() + after_s; }
  // The next checkpoint after the interval; before one is chosen (--mtbf
  // measures it on the first), after --first or 10 s.
  void schedule_next() { schedule(interval_s_ > 0 ? interval_s_ : o_.first_s.value_or(10)); }
  // ---- the job
  int job_died(int status, bool status_known);
  bool restore(const SeriesImage& img);

  Options o_;
  pid_t job_ = 0;
  bool job_is_child_ = false;
  uint64_t next_seq_ = 1, complete_ = 0;
  double next_dump_at_ = 0, interval_s_ = 0;
  bool interval_chosen_ = false;
  // The dump in flight.
  pid_t criu_ = 0;
  uint64_t dump_seq_ = 0;
  std::optional<std::string> dump_parent_;
  double dump_started_ = 0, dump_took_ = 0, job_died_at_ = 0;
  double image_since_ = 0, image_checked_ = 0;  // the GPU image polled since (0: not waiting)
  int job_status_ = 0;
  unsigned restarts_ = 0;
};

void Supervisor::prune() {
  auto series = phos::plugin::list_series(o_.root);
  if (!series) {
    std::fprintf(stderr, "phosctl: %s\n", series.error().message.c_str());
    return;
  }
  for (const auto& name : phos::plugin::series_to_remove(*series, o_.keep)) {
    if (auto r = phos::plugin::remove_series_dir(o_.root, name); !r)
      std::fprintf(stderr, "phosctl: %s\n", r.error().message.c_str());
    else
      std::printf("periodic: removed %s/%s (kept: the last %zu complete images and their parents)\n",
                  o_.root.c_str(), name.c_str(), o_.keep);
  }
}

// The newest complete image, where its chain is shorter than full_every.
std::optional<std::string> Supervisor::parent_for_next() {
  if (!o_.incremental) return std::nullopt;
  auto series = phos::plugin::list_series(o_.root);
  if (!series) return std::nullopt;
  auto latest = phos::plugin::latest_complete(*series);
  if (!latest) return std::nullopt;
  if (phos::plugin::series_chain(*series, *latest).size() >= o_.full_every) return std::nullopt;
  return latest->name;
}

void Supervisor::start_dump() {
  dump_seq_ = next_seq_++;
  const std::string name = phos::plugin::series_name(dump_seq_), dir = o_.root + "/" + name;
  if (::mkdir(dir.c_str(), 0700) != 0) {
    std::fprintf(stderr, "phosctl: checkpoint %" PRIu64 ": %s: %s\n", dump_seq_, dir.c_str(), std::strerror(errno));
    schedule(interval_s_ > 0 ? interval_s_ : 1);
    return;
  }
  dump_parent_ = parent_for_next();
  std::vector<std::string> argv = {o_.criu, "dump", "-t", std::to_string(job_), "-D", dir, "--lib", o_.lib,
                                   "--leave-running", "-o", "dump.log", "-v4"};
  argv.insert(argv.end(), o_.criu_args.begin(), o_.criu_args.end());
  std::vector<std::string> env = o_.dump_env;
  if (dump_parent_) env.push_back("PHOS_PARENT_IMAGE=../" + *dump_parent_);
  auto pid = phos::plugin::start_command(argv, env);
  if (!pid) {
    std::fprintf(stderr, "phosctl: checkpoint %" PRIu64 ": %s\n", dump_seq_, pid.error().message.c_str());
    schedule(interval_s_ > 0 ? interval_s_ : 1);
    return;
  }
  criu_ = *pid;
  dump_started_ = now_s();
  std::printf("periodic: checkpoint %" PRIu64 ": dumping process %d into %s%s\n", dump_seq_, int(job_), dir.c_str(),
              dump_parent_ ? (" (incremental, against ../" + *dump_parent_ + ")").c_str() : "");
}

void Supervisor::dump_ended(int status) {
  criu_ = 0;
  dump_took_ = now_s() - dump_started_;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return dump_failed("criu " + death_text(status));
  // A write-behind image is finished at criu's exit; one that a helper
  // finishes is polled by the loop, which watches the job meanwhile.
  const std::string dir = o_.root + "/" + phos::plugin::series_name(dump_seq_);
  GpuImages images = gpu_images(dir);
  if (!images.incomplete) return finish_dump(images);
  image_since_ = image_checked_ = now_s();
  std::printf("periodic: checkpoint %" PRIu64 ": criu exited; its GPU image is not complete yet (%s): waiting for "
              "it\n", dump_seq_, images.incomplete->c_str());
}

void Supervisor::poll_image() {
  if (!image_since_ || now_s() - image_checked_ < 0.1) return;
  image_checked_ = now_s();
  GpuImages images = gpu_images(o_.root + "/" + phos::plugin::series_name(dump_seq_));
  if (!images.incomplete) {
    image_since_ = 0;
    return finish_dump(images);
  }
  if (now_s() - image_since_ < 600) return;
  image_since_ = 0;
  dump_failed("its GPU image is not complete after 10 minutes: " + *images.incomplete);
}

// The error criu failed on, from LOG, cut to 300 bytes: phos's own
// ("phos: Error: ...") where there is one, else criu's first "Error
// (file:line): ..." line but its closing "Dumping FAILED." and a refused
// RLIMIT_NOFILE (logged as an error, which criu carries on past). Empty
// where there is none (criu killed before it said why).
std::string criu_error(const std::string& log) {
  auto cut = [](std::string line) { return line.size() > 300 ? line.substr(0, 300) + "..." : line; };
  std::ifstream in(log);
  std::string first, last_resort;
  for (std::string line; std::getline(in, line);) {
    if (size_t at = line.find("phos: Error: "); at != std::string::npos) return cut(line.substr(at));
    const size_t at = line.find("Error (");
    if (at == std::string::npos || line.find("RLIMIT_NOFILE") != std::string::npos) continue;
    if (line.find("Dumping FAILED") != std::string::npos) {
      last_resort = cut(line.substr(at));
      continue;
    }
    if (first.empty()) first = cut(line.substr(at));
  }
  return first.empty() ? last_resort : first;
}

void Supervisor::dump_failed(std::string why) {
  const double took = dump_took_;
  const std::string dir = o_.root + "/" + phos::plugin::series_name(dump_seq_);
  // Its directory goes (prune); its log stays, as ROOT/last-failed-dump.log.
  const std::string kept_log = o_.root + "/last-failed-dump.log";
  if (::rename((dir + "/dump.log").c_str(), kept_log.c_str()) == 0) {
    // Said here: a series that fails the same way again and again should
    // show why without its log (the GPU suite's lost one).
    if (std::string error = criu_error(kept_log); !error.empty()) why += " (" + error + ")";
    why += ", kept as " + kept_log;
  }
  std::printf("periodic: checkpoint %" PRIu64 " failed after %.2f s: %s%s; the last complete image stays\n",
              dump_seq_, took, why.c_str(),
              job_died_at_ > 0 || !phos::plugin::process_alive(job_) ? " (the job died during it)" : "");
  prune();  // the failed one goes; the complete ones stay
  schedule_next();
}

void Supervisor::finish_dump(const GpuImages& images) {
  const double took = dump_took_;
  const std::string name = phos::plugin::series_name(dump_seq_), dir = o_.root + "/" + name;
  const double stall = images.stall_s, cost = stall > 0 ? stall : took;
  std::vector<std::string> lines = {"seq=" + std::to_string(dump_seq_), "dump_s=" + std::to_string(took),
                                    "stall_s=" + std::to_string(stall)};
  if (dump_parent_) lines.push_back("parent=" + *dump_parent_);
  if (auto m = phos::plugin::mark_complete(dir, lines); !m) {
    std::fprintf(stderr, "phosctl: checkpoint %" PRIu64 ": %s\n", dump_seq_, m.error().message.c_str());
    prune();
    schedule_next();
    return;
  }
  complete_++;
  std::printf("periodic: checkpoint %" PRIu64 " complete in %s: dump %.3f s, %s\n", dump_seq_, dir.c_str(), took,
              stall > 0 ? ("the job stopped " + std::to_string(stall) + " s (phos's manifests)").c_str()
                        : "the job's stall not known (no GPU image): the dump's time is taken as its cost");
  if (!interval_chosen_) {
    interval_chosen_ = true;
    if (o_.interval_s) {
      interval_s_ = *o_.interval_s;
      std::printf("periodic: interval %.3f s, fixed (--interval)\n", interval_s_);
    } else {
      auto choice = phos::plugin::young_daly(cost, *o_.mtbf_s);
      interval_s_ = choice ? choice->interval_s : *o_.mtbf_s;
      std::printf("periodic: %s; the cost measured on checkpoint %" PRIu64 " (%s)\n",
                  choice ? choice->explanation.c_str() : choice.error().message.c_str(), dump_seq_,
                  stall > 0 ? "the job's stall" : "the dump's time");
    }
    // A dump cannot start before the one before has ended.
    if (interval_s_ < took) {
      std::printf("periodic: the interval raised to the dump's own time, %.3f s\n", took);
      interval_s_ = took;
    }
  }
  prune();
  schedule(interval_s_);
}

bool Supervisor::restore(const SeriesImage& img) {
  const std::string dir = o_.root + "/" + img.name;
  // The job's pid must be free (criu restores it): ours are reaped at once;
  // an adopted job's parent reaps it.
  (void)phos::plugin::wait_pid_free(job_, 10000);
  ::unlink((dir + "/restored.pid").c_str());
  std::vector<std::string> argv = {o_.criu, "restore", "-D", dir, "--lib", o_.lib, "-d",
                                   "-o", "restore.log", "-v4", "--pidfile", "restored.pid"};
  argv.insert(argv.end(), o_.criu_args.begin(), o_.criu_args.end());
  std::vector<std::string> env;
  if (!o_.gpu_map.empty()) env.push_back("PHOS_GPU_MAP=" + o_.gpu_map);
  const double t0 = now_s();
  auto rc = phos::plugin::run_command(argv, env);
  const double took = now_s() - t0;
  if (!rc || *rc != 0) {
    std::printf("supervise: the restore from %s failed (%s; %s/restore.log says why)\n", dir.c_str(),
                rc ? ("criu exited with status " + std::to_string(*rc)).c_str() : rc.error().message.c_str(),
                dir.c_str());
    return false;
  }
  auto pid = phos::plugin::read_pid_file(dir, "restored.pid");
  if (!pid) {
    std::printf("supervise: criu restored from %s but wrote no pid: %s\n", dir.c_str(), pid.error().message.c_str());
    return false;
  }
  job_ = *pid;
  job_is_child_ = true;  // criu -d exited: the restored job is ours (subreaper)
  std::printf("supervise: restart %u of %u: restored from %s in %.3f s%s%s, now process %d\n", restarts_,
              o_.max_restarts, dir.c_str(), took, o_.gpu_map.empty() ? "" : ", GPU map ",
              o_.gpu_map.c_str(), int(*pid));
  return true;
}

// The job has died (status -1: unknown, not our child); 0 where it was
// restored, else the supervisor's exit status.
int Supervisor::job_died(int status, bool known) {
  const std::string how = known ? death_text(status) : "gone (not our child: its exit status is unknown)";
  if (known && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    std::printf("supervise: process %d finished (status 0) after %u restarts\n", int(job_), restarts_);
    return 0;
  }
  if (g_stop) {
    std::printf("supervise: process %d %s after the supervisor was asked to stop\n", int(job_), how.c_str());
    return 1;
  }
  std::printf("supervise: process %d %s\n", int(job_), how.c_str());
  if (!o_.supervise) return 1;
  if (restarts_ >= o_.max_restarts) {
    std::printf("supervise: giving up: the job died %u times, the limit being %u restarts (--max-restarts); "
                "the last death: %s\n", restarts_ + 1, o_.max_restarts, how.c_str());
    return 1;
  }
  auto series = phos::plugin::list_series(o_.root);
  if (!series) {
    std::printf("supervise: giving up: %s\n", series.error().message.c_str());
    return 1;
  }
  // The newest complete image; where it does not restore, the one before.
  restarts_++;
  unsigned tried = 0;
  bool restored = false;
  for (auto it = series->rbegin(); it != series->rend() && !restored; ++it) {
    if (!it->complete) continue;
    tried++;
    restored = restore(*it);
  }
  if (tried == 0) {
    std::printf("supervise: giving up: no complete image in %s to restore the job from\n", o_.root.c_str());
    return 1;
  }
  if (!restored) {
    std::printf("supervise: giving up: none of the %u complete images in %s restores (each one's restore.log says "
                "why)\n", tried, o_.root.c_str());
    return 1;
  }
  schedule_next();
  return -1;
}

// Whether `pid` (a child) ended within `ms`, polled every 20 ms; its status in *status.
bool reap_within(pid_t pid, int ms, int* status) {
  for (int waited = 0; waited < ms; waited += 20) {
    if (::waitpid(pid, status, WNOHANG) == pid) return true;
    ::usleep(20000);
  }
  return false;
}

void Supervisor::settle_dump() {
  int status = 0;
  job_died_at_ = now_s();
  // A dump in flight fails without its process; criu may be held (a
  // stalled plugin): 3 s, then it is ended.
  if (criu_ && reap_within(criu_, 3000, &status)) dump_ended(status);
  if (criu_) {
    std::printf("periodic: checkpoint %" PRIu64 ": criu still runs 3 s after its process died: killed\n", dump_seq_);
    ::kill(criu_, SIGKILL);
    ::waitpid(criu_, &status, 0);
    dump_ended(status);
  }
  // An image finished by a helper does not need the job; 3 s for it, then
  // the job comes back from the image before.
  for (int i = 0; i < 30 && image_since_; i++) {
    image_checked_ = 0;
    poll_image();
    if (image_since_) ::usleep(100000);
  }
  if (image_since_) {
    image_since_ = 0;
    dump_failed("its GPU image was not complete 3 s after the job died");
  }
  job_died_at_ = 0;
}

void Supervisor::stop(double& stop_at) {
  if (!stop_at) {
    stop_at = now_s();
    std::printf("supervise: asked to stop: SIGTERM to process %d, no more restarts (SIGKILL after %.1f s)\n",
                int(job_), o_.stop_grace_s);
    if (criu_) ::kill(criu_, SIGTERM);
    ::kill(job_, SIGTERM);
    return;
  }
  if (stop_at < 0 || now_s() - stop_at < o_.stop_grace_s) return;
  stop_at = -1;  // once
  std::printf("supervise: process %d still runs %.1f s after SIGTERM: SIGKILL\n", int(job_), o_.stop_grace_s);
  if (criu_) ::kill(criu_, SIGKILL);
  ::kill(job_, SIGKILL);
}

int Supervisor::run() {
  ::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (::mkdir(o_.root.c_str(), 0700) != 0 && errno != EEXIST)
    return std::fprintf(stderr, "phosctl: %s: %s\n", o_.root.c_str(), std::strerror(errno)), 1;
  if (auto series = phos::plugin::list_series(o_.root)) {
    if (!series->empty()) next_seq_ = series->back().seq + 1;  // a series goes on where it stopped
  } else {
    return std::fprintf(stderr, "phosctl: %s\n", series.error().message.c_str()), 1;
  }
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
    std::fprintf(stderr, "phosctl: prctl(PR_SET_CHILD_SUBREAPER): %s; a restored job's end is seen through /proc\n",
                 std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  if (!o_.command.empty()) {
    auto started = start_job(o_.command);
    if (!started) return std::fprintf(stderr, "phosctl: %s\n", started.error().message.c_str()), 1;
    job_ = *started;
    job_is_child_ = true;
    std::printf("supervise: started process %d: %s\n", int(job_), phos::plugin::shell_line(o_.command).c_str());
  } else {
    job_ = o_.pid;
    if (!phos::plugin::process_alive(job_)) return std::fprintf(stderr, "phosctl: no process %d\n", int(job_)), 1;
  }
  if (o_.interval_s) interval_s_ = *o_.interval_s;
  schedule(o_.first_s.value_or(o_.interval_s.value_or(10)));
  double stop_at = 0;  // asked to stop, SIGTERM sent then
  while (true) {
    int status = 0;
    pid_t p;
    bool died = false, reaped = false;
    while ((p = ::waitpid(-1, &status, WNOHANG)) > 0) {
      if (p == criu_) dump_ended(status);
      else if (p == job_ && job_is_child_) reaped = true, job_status_ = status;
    }
    // A job that dies while criu traces it is a zombie criu is told of
    // first: seen through /proc, reaped once criu lets it go.
    died = reaped || !phos::plugin::process_alive(job_);
    if (died) {
      if (dump_in_flight()) settle_dump();
      if (!reaped && job_is_child_) {
        // Ours: its status comes once no tracer holds it (10 s at most).
        reaped = reap_within(job_, 10000, &job_status_);
      }
      int rc = job_died(job_status_, reaped);
      if (rc >= 0) return rc;
      continue;
    }
    if (g_stop) stop(stop_at);
    poll_image();
    if (o_.count && complete_ >= o_.count && !dump_in_flight()) {
      std::printf("periodic: %" PRIu64 " checkpoints complete (--count); process %d runs on\n", complete_,
                  int(job_));
      return 0;
    }
    if (!stop_at && !dump_in_flight() && now_s() >= next_dump_at_) start_dump();
    ::usleep(20000);
  }
}

}  // namespace

int cmd_periodic(const std::vector<std::string>& args, bool supervise) {
  Options o;
  o.supervise = supervise;
  std::string err = parse(args, o);
  if (!err.empty()) return usage(err);
  return Supervisor(std::move(o)).run();
}
