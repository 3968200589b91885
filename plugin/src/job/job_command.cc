#include "phos/plugin/job_command.h"
#include "phos/images/image_dir.h"
#include "phos/images/unique_fd.h"
#include "phos/support/text.h"

#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace phos::plugin {

std::string shell_quote(const std::string& word) {
  const bool bare = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                            "0123456789@%+=:,./_-") == std::string::npos;
  if (bare) return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string shell_line(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) append_item(out, " ", shell_quote(a));
  return out;
}

std::string expand_template(const std::string& text, int host, const std::string& cmd) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 3, "{i}") == 0) {
      out += std::to_string(host);
      i += 3;
    } else if (text.compare(i, 5, "{cmd}") == 0) {
      out += cmd;
      i += 5;
    } else {
      out += text[i++];
    }
  }
  return out;
}

Result<pid_t> start_command(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
  if (argv.empty()) return make_error("no command to run", EINVAL);
  std::vector<std::string> env_text(extra_env);
  for (char** e = environ; *e; e++) {
    std::string var(*e);
    bool replaced = false;
    for (const auto& x : extra_env) replaced = replaced || var.rfind(x.substr(0, x.find('=') + 1), 0) == 0;
    if (!replaced) env_text.push_back(var);
  }
  std::vector<char*> env, args;
  for (auto& e : env_text) env.push_back(e.data());
  env.push_back(nullptr);
  std::vector<std::string> argv_copy(argv);
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t child = 0;
  if (int err = ::posix_spawnp(&child, args[0], nullptr, nullptr, args.data(), env.data()); err != 0)
    return errno_error("cannot run " + argv[0], err);
  return child;
}

int wait_command(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

Result<int> run_command(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
  auto pid = start_command(argv, extra_env);
  if (!pid) return pid.error();
  return wait_command(*pid);
}

std::string own_path() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return {};
  return std::string(buf, size_t(n));
}

Result<pid_t> read_pid_file(const std::string& dir, const std::string& name) {
  UniqueFd dirfd(::open(dir.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  if (!dirfd.valid()) return errno_error("open " + dir);
  auto text = image::read_small_file(dirfd.get(), name, 64);
  if (!text) return make_error(dir + "/" + name + ": " + text.error().message, text.error().code);
  const std::string s(reinterpret_cast<const char*>(text->data()), text->size());
  char* end = nullptr;
  errno = 0;
  const long pid = std::strtol(s.c_str(), &end, 10);
  const bool trailing = s.find_first_not_of(" \n", size_t(end - s.c_str())) != std::string::npos;
  if (errno || end == s.c_str() || pid <= 0 || pid > INT32_MAX || trailing)
    return make_error(dir + "/" + name + " names no process ('" + s + "')", EINVAL);
  return pid_t(pid);
}

std::string beside_self(const std::string& name) {
  const std::string self = own_path();
  const size_t slash = self.rfind('/');
  return slash == std::string::npos ? name : self.substr(0, slash + 1) + name;
}

}  // namespace phos::plugin
