// phos-keeper: the plugin's helper outside criu during a dump or a restore
// (see keeper_link.h and images/proto/keeper.proto). At a dump it holds a
// second reference to each paused process's device memory; when criu goes
// away without saying Done (killed, crashed; or a dump that kills its
// processes, whose give-back the plugin hands over), it waits until criu's
// ptrace hold on each process is gone and gives each process that lives on
// back what the dump took. At a restore it ends each process criu left
// without its GPU state. A migration's memory (kept_memory.h) it keeps past
// the dump, served until a restore takes it. It logs into phos-keeper.log in
// the image directory.
//
// usage (by the plugin only): phos-keeper [--detach] [--agent-timeout-ms N]
//   fd 3: the link to the plugin; fd 4: the image directory
#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "phos/plugin/give_back.h"
#include "phos/plugin/kept_memory.h"
#include "phos/plugin/log.h"
#include "phos/images/image_dir.h"
#include "phos/images/keeper_protocol.h"
#include "phos/plugin/proc.h"

namespace {

using namespace phos;
using namespace phos::plugin;

constexpr int kLinkFd = 3;
constexpr int kImageDirFd = 4;
constexpr int kDetachWaitMs = 30000;
constexpr int kTreeScanMs = 20;

struct Held {
  std::vector<agent::Allocation> allocations;
  std::vector<UniqueFd> fds;
  uint32_t taken = 0;
};

struct KeeperState {
  std::map<pid_t, Held> processes;
  std::vector<pid_t> order;  // as first heard of
  std::vector<pid_t> restoring;  // a restore's processes, not yet given their GPU state
  // A restore: criu's pid, the processes seen in its tree (by start time,
  // so that a later process that got the pid is left alone), and those
  // that have their GPU state.
  pid_t criu = 0;
  bool tree_known = false;  // criu reached RESUME_DEVICES_LATE: it forked all it will
  std::map<pid_t, uint64_t> forked;
  std::set<pid_t> restored;
  // A migration: each process's kept memory (Keep), committed once the
  // dump succeeded (KeepCommitted).
  std::vector<KeptProcess> kept;
};

void apply(KeeperState& k, const keeper::Hold& hold, std::vector<UniqueFd>& fds) {
  pid_t pid = hold.pid;
  if (!k.processes.count(pid)) k.order.push_back(pid);
  Held& h = k.processes[pid];
  for (size_t i = 0; i < hold.allocations.size(); i++) {
    h.allocations.push_back(hold.allocations[i]);
    if (i < fds.size()) h.fds.push_back(std::move(fds[i]));
  }
}

void apply(KeeperState& k, const keeper::State& state, std::vector<UniqueFd>&) {
  pid_t pid = state.pid;
  if (!k.processes.count(pid)) k.order.push_back(pid);
  k.processes[pid].taken = state.taken;
}

void apply(KeeperState&, const keeper::Done&, std::vector<UniqueFd>&) {}

void apply(KeeperState& k, const keeper::Keep& keep, std::vector<UniqueFd>& fds) {
  // From here on this keeper may hold the only copy of a process's GPU
  // data: SIGTERM must not end it before that copy is written out.
  if (k.kept.empty()) block_termination();
  auto it = std::find_if(k.kept.begin(), k.kept.end(), [&](const KeptProcess& p) { return p.pid == keep.pid; });
  if (it == k.kept.end()) {
    k.kept.push_back(KeptProcess{keep.pid, keep.vpid, keep.migration, keep.keep_s, {}, {}, false});
    it = std::prev(k.kept.end());
  }
  for (size_t i = 0; i < keep.allocations.size() && i < fds.size(); i++) {
    it->allocations.push_back(keep.allocations[i]);
    it->fds.push_back(std::move(fds[i]));
  }
}

void apply(KeeperState& k, const keeper::KeepCommitted& c, std::vector<UniqueFd>&) {
  for (auto& p : k.kept)
    if (p.pid == c.pid) p.committed = true;
}

// Messages of a restore's link to kept memory, not of this one.
void apply(KeeperState&, const keeper::TakeKept&, std::vector<UniqueFd>&) {}
void apply(KeeperState&, const keeper::Kept&, std::vector<UniqueFd>&) {}
void apply(KeeperState&, const keeper::Taken&, std::vector<UniqueFd>&) {}

// After the dump: the migrations' memory served until taken, where the
// dump committed it and its process did not live on (one given back runs
// with its own memory: a restore of it must not run beside it).
void keep_migrations(KeeperState& k, const std::set<pid_t>& lived_on) {
  std::erase_if(k.kept, [&](const KeptProcess& p) {
    if (!p.committed || !lived_on.count(p.pid)) return false;
    PHOS_WARN("process %d lives on after its migration's dump; its kept memory is let go, and the image refused (no "
              "completion marker)",
              p.pid);
    if (auto r = image::remove_completion_marker(kImageDirFd, p.vpid); !r)
      PHOS_ERR("process %d: %s", p.pid, r.error().message.c_str());
    return true;
  });
  if (k.kept.empty()) return;
  k.processes.clear();  // the source's memory: only what is kept stays
  serve_kept_memory(k.kept, kImageDirFd);
}

// Every process below criu now, recorded with its start time.
void scan_restore_tree(KeeperState& k) {
  std::vector<pid_t> todo = children_of(k.criu);
  std::set<pid_t> seen;
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    if (p == ::getpid() || !seen.insert(p).second) continue;
    if (auto started = start_time_of(p)) k.forked[p] = *started;  // the latest holder of the pid
    for (pid_t c : children_of(p)) todo.push_back(c);
  }
}

void apply(KeeperState& k, const keeper::Restoring& r, std::vector<UniqueFd>&) {
  std::erase(k.restoring, pid_t(r.pid));
  if (!r.restored) k.restoring.push_back(r.pid);
  if (r.restored) k.restored.insert(r.pid);
  if (!r.restored && !k.forked.count(r.pid))
    if (auto started = start_time_of(r.pid)) k.forked[r.pid] = *started;
  // RESUME_DEVICES_LATE comes after criu forked the whole tree (at the
  // restore's start): no scan from here on, so that what the restored
  // processes fork once criu lets them go is never taken for criu's.
  if (k.criu) k.tree_known = true;
}

void apply(KeeperState& k, const keeper::RestoreStarted& r, std::vector<UniqueFd>&) { k.criu = r.criu_pid; }

// Waits until nothing traces `pid` any more (criu's seize ends with criu).
bool wait_untraced(pid_t pid) {
  for (int waited = 0; waited < kDetachWaitMs; waited += 10) {
    auto tracer = tracer_of(pid, pid);
    if (!tracer || *tracer == 0) return true;
    ::usleep(10000);
  }
  return false;
}

void log_to_image_dir() {
  int log_fd = ::openat(kImageDirFd, "phos-keeper.log", O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (log_fd >= 0) {
    ::dup2(log_fd, 2);
    ::close(log_fd);
  }
  set_stderr_level(LogLevel::kInfo);
}

// A restore's criu died before the processes had their GPU state: each is
// left in criu's restorer, and would run on with its gate closed for good.
// Ended once criu's hold is gone, so that the next restore finds its pid
// free (its device memory was criu's, gone with criu).
// Those criu forked and had not yet brought to RESUME_DEVICES_LATE count
// too: criu gone, each resumes where it was, without its GPU state.
void end_half_restored(const KeeperState& k) {
  std::vector<pid_t> left = k.restoring;
  for (const auto& [pid, started] : k.forked)
    if (!k.restored.count(pid) && std::find(left.begin(), left.end(), pid) == left.end() &&
        start_time_of(pid) == started)
      left.push_back(pid);
  PHOS_WARN("criu went away during a restore; ending the %zu process(es) it left without their GPU state",
            left.size());
  for (pid_t pid : left) {
    if (!process_alive(pid)) continue;
    // The process recorded, held by a pidfd from here to the kill: a pid
    // taken by another process meanwhile is left alone.
    auto recorded = k.forked.find(pid);
    UniqueFd handle(int(::syscall(SYS_pidfd_open, pid, 0)));
    if (recorded != k.forked.end() && start_time_of(pid) != recorded->second) {
      PHOS_INFO("process %d: another process has its pid now; left alone", pid);
      continue;
    }
    if (!wait_untraced(pid)) PHOS_WARN("process %d is still traced after %d ms", pid, kDetachWaitMs);
    int killed = handle.valid() ? int(::syscall(SYS_pidfd_send_signal, handle.get(), SIGKILL, nullptr, 0))
                                : ::kill(pid, SIGKILL);
    if (killed == 0)
      PHOS_INFO("process %d: ended (restored without its GPU state)", pid);
    else
      PHOS_ERR("process %d: cannot end it: %s", pid, std::strerror(errno));
  }
}

// Returns the processes that live on with their own memory (given back).
std::set<pid_t> recover(KeeperState& k, int agent_timeout_ms) {
  std::set<pid_t> lived_on;
  PHOS_WARN("criu went away without Done; giving what the dump took back to those of %zu process(es) that live on",
            k.order.size());
  for (auto it = k.order.rbegin(); it != k.order.rend(); ++it) {
    pid_t pid = *it;
    Held& h = k.processes[pid];
    if (h.taken == 0) {  // given back by the plugin already
      if (process_alive(pid)) lived_on.insert(pid);
      continue;
    }
    if (!process_alive(pid)) {
      PHOS_INFO("process %d is gone; nothing to give back", pid);
      continue;
    }
    if (!wait_untraced(pid)) PHOS_WARN("process %d is still traced after %d ms; trying anyway", pid, kDetachWaitMs);
    if (!process_alive(pid) || kill_pending(pid)) {
      PHOS_INFO("process %d ended with criu; nothing to give back", pid);
      continue;
    }
    auto r = give_back_gpu_state(pid, h.taken, h.allocations, h.fds, agent_timeout_ms);
    if (r) {
      PHOS_INFO("process %d: given back what the dump took (steps 0x%x); it runs on", pid, h.taken);
      lived_on.insert(pid);  // its own memory again: a migration's copy of it is let go
    } else
      PHOS_ERR("process %d: could not give back everything: %s", pid, r.error().message.c_str());
  }
  return lived_on;
}

}  // namespace

int main(int argc, char** argv) {
  bool detach = false;
  int agent_timeout_ms = 10000;
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--detach") == 0) {
      detach = true;
    } else if (std::strcmp(argv[i], "--agent-timeout-ms") == 0 && i + 1 < argc) {
      agent_timeout_ms = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--detach] [--agent-timeout-ms N] (started by the phos plugin)\n", argv[0]);
      return 2;
    }
  }
  if (::fcntl(kLinkFd, F_GETFD) < 0 || ::fcntl(kImageDirFd, F_GETFD) < 0) {
    std::fprintf(stderr, "%s: expects its link on fd 3 and the image directory on fd 4\n", argv[0]);
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  if (detach) {
    pid_t child = ::fork();
    if (child < 0) return 1;
    if (child > 0) ::_exit(0);
  }
  KeeperState k;
  for (;;) {
    // During a restore, criu's tree is looked at between messages: what it
    // forked must be known before criu can die.
    if (k.criu && !k.tree_known) {
      struct pollfd link = {kLinkFd, POLLIN, 0};
      if (::poll(&link, 1, kTreeScanMs) == 0) {
        scan_restore_tree(k);
        continue;
      }
    }
    auto received = keeper::recv_message(kLinkFd, -1);
    if (!received) break;  // criu is gone (end of stream without Done), or sent what does not decode
    std::visit([&](const auto& m) { apply(k, m, received->fds); }, received->message);
    if (std::holds_alternative<keeper::Done>(received->message)) {
      if (k.kept.empty()) return 0;
      // Done: the plugin gave back (or found gone) every process itself.
      std::set<pid_t> alive;
      for (const auto& p : k.kept)
        if (process_alive(p.pid)) alive.insert(p.pid);
      log_to_image_dir();
      keep_migrations(k, alive);
      return 0;
    }
  }
  log_to_image_dir();
  bool restore = !k.restoring.empty() || !k.forked.empty();
  if (restore) end_half_restored(k);
  std::set<pid_t> lived_on;
  if (!k.order.empty() || !restore) lived_on = recover(k, agent_timeout_ms);
  keep_migrations(k, lived_on);
  return 0;
}
