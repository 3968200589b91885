#include "keeper/keeper_link.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>

#include "phos/plugin/log.h"
#include "phos/images/keeper_protocol.h"

extern char** environ;

namespace phos::plugin {
namespace {

// Where this code was loaded from (the plugin's .so, or a program).
std::string own_directory() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || !info.dli_fname) return {};
  char real[PATH_MAX];
  if (!::realpath(info.dli_fname, real)) return {};
  std::string path(real);
  return path.substr(0, path.rfind('/'));
}

}  // namespace

Result<std::string> KeeperLink::executable() {
  if (const char* env = std::getenv("PHOS_KEEPER"); env && *env) return std::string(env);
  std::string dir = own_directory();
  if (dir.empty()) return make_error("cannot tell where the phos plugin was loaded from", ENOENT);
  std::string path = dir + "/phos-keeper";
  if (::access(path.c_str(), X_OK) != 0) return errno_error("phos-keeper not found at " + path);
  return path;
}

Result<KeeperLink> KeeperLink::start(int image_dirfd, int agent_timeout_ms) {
  auto exe = executable();
  if (!exe) return exe.error();
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return errno_error("socketpair for phos-keeper");
  UniqueFd ours(pair[0]), theirs(pair[1]);

  // The keeper gets its socket as fd 3 and the image directory as fd 4;
  // dup2 onto a different number clears close-on-exec.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  UniqueFd sock_high(::fcntl(theirs.get(), F_DUPFD_CLOEXEC, 10));
  UniqueFd dir_high(::fcntl(image_dirfd, F_DUPFD_CLOEXEC, 10));
  if (!sock_high.valid() || !dir_high.valid()) return errno_error("dup for phos-keeper");
  posix_spawn_file_actions_adddup2(&actions, sock_high.get(), 3);
  posix_spawn_file_actions_adddup2(&actions, dir_high.get(), 4);
  // Its own session: a signal to criu's process group (^C) must not reach it.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  std::string timeout = std::to_string(agent_timeout_ms);
  char* argv[] = {const_cast<char*>(exe->c_str()), const_cast<char*>("--detach"), const_cast<char*>("--agent-timeout-ms"),
                  timeout.data(), nullptr};
  pid_t child = 0;
  int err = ::posix_spawn(&child, exe->c_str(), &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) return errno_error("start " + *exe, err);
  // With --detach the keeper forks and this child exits at once: the keeper
  // is no child of criu, which must not reap it or wait for it.
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return make_error(*exe + " did not start (status " + std::to_string(status) + ")");
  PHOS_INFO("phos-keeper started");
  return KeeperLink(std::move(ours));
}

Result<void> KeeperLink::hold(pid_t pid, const std::vector<agent::Allocation>& allocs,
                              const std::vector<UniqueFd>& fds) {
  return keeper::send_allocations(sock_.get(), allocs, fds, [&](std::vector<agent::Allocation> slice, bool) {
    return keeper::Message(keeper::Hold{.pid = pid, .allocations = std::move(slice)});
  });
}

Result<void> KeeperLink::keep(pid_t pid, pid_t vpid, const std::string& migration, uint32_t keep_s,
                              const std::vector<agent::Allocation>& allocs, const std::vector<UniqueFd>& fds) {
  return keeper::send_allocations(sock_.get(), allocs, fds, [&](std::vector<agent::Allocation> slice, bool) {
    return keeper::Message(keeper::Keep{
        .pid = pid, .migration = migration, .allocations = std::move(slice), .vpid = vpid, .keep_s = keep_s});
  });
}

Result<void> KeeperLink::keep_committed(pid_t pid) {
  return keeper::send_message(sock_.get(), keeper::KeepCommitted{pid});
}

Result<void> KeeperLink::state(pid_t pid, uint32_t taken) {
  return keeper::send_message(sock_.get(), keeper::State{.pid = pid, .taken = taken});
}

Result<void> KeeperLink::restoring(pid_t pid, bool restored) {
  return keeper::send_message(sock_.get(), keeper::Restoring{.pid = pid, .restored = restored});
}

Result<void> KeeperLink::restore_started() {
  return keeper::send_message(sock_.get(), keeper::RestoreStarted{int32_t(::getpid())});
}

Result<void> KeeperLink::done() {
  auto r = keeper::send_message(sock_.get(), keeper::Done{});
  sock_.reset();
  return r;
}

}  // namespace phos::plugin
