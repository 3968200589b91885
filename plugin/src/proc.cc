#include "phos/plugin/proc.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

namespace phos::plugin {
namespace {

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return errno_error("open " + path, errno ? errno : ENOENT);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<std::vector<std::string>> list_dir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (!d) return errno_error("open " + path);
  std::vector<std::string> names;
  while (struct dirent* de = ::readdir(d)) {
    if (de->d_name[0] != '.') names.emplace_back(de->d_name);
  }
  ::closedir(d);
  return names;
}

constexpr unsigned long kSoAcceptCon = 0x10000;  // __SO_ACCEPTCON: listening

}  // namespace

Result<pid_t> ns_pid(pid_t pid) {
  auto status = read_text("/proc/" + std::to_string(pid) + "/status");
  if (!status) return status.error();
  std::istringstream in(*status);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    pid_t v = 0, last = 0;
    while (fields >> v) last = v;
    if (last > 0) return last;
  }
  return make_error("/proc/" + std::to_string(pid) + "/status has no NSpid line");
}

Result<pid_t> tracer_of(pid_t pid, pid_t tid) {
  auto status = read_text("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/status");
  if (!status) return status.error();
  auto at = status->find("\nTracerPid:");
  if (at == std::string::npos) return make_error("no TracerPid in the status of thread " + std::to_string(tid));
  return pid_t(std::stol(status->substr(at + 11)));
}

Result<pid_t> find_thread(pid_t pid, const std::string& name) {
  std::string base = "/proc/" + std::to_string(pid) + "/task";
  auto tids = list_dir(base);
  if (!tids) return tids.error();
  for (const auto& t : *tids) {
    auto comm = read_text(base + "/" + t + "/comm");
    if (comm && comm->substr(0, comm->find('\n')) == name) return pid_t(std::stoi(t));
  }
  return make_error("process " + std::to_string(pid) + " has no thread named " + name, ESRCH);
}

bool kill_pending(pid_t pid) {
  auto status = read_text("/proc/" + std::to_string(pid) + "/status");
  if (!status) return true;
  for (const char* field : {"\nSigPnd:", "\nShdPnd:"}) {
    size_t at = status->find(field);
    if (at == std::string::npos) continue;
    unsigned long long pending = std::strtoull(status->c_str() + at + std::strlen(field), nullptr, 16);
    if (pending & (1ull << (SIGKILL - 1))) return true;
  }
  return false;
}

bool process_alive(pid_t pid) {
  auto stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  auto close_paren = stat->rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= stat->size()) return false;
  char state = (*stat)[close_paren + 2];
  return state != 'Z' && state != 'X';
}

Result<std::optional<std::string>> find_listening_socket(pid_t pid, const std::string& prefix) {
  std::string base = "/proc/" + std::to_string(pid);
  auto fds = list_dir(base + "/fd");
  if (!fds) return fds.error();
  std::set<unsigned long> inodes;
  for (const auto& fd : *fds) {
    char target[128];
    ssize_t n = ::readlink((base + "/fd/" + fd).c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    unsigned long ino = 0;
    if (std::sscanf(target, "socket:[%lu]", &ino) == 1) inodes.insert(ino);
  }
  auto table = read_text(base + "/net/unix");
  if (!table) return table.error();
  std::istringstream in(*table);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    // Num RefCount Protocol Flags Type St Inode [Path]
    std::istringstream f(line);
    std::string num, refs, proto, flags, type, st, path;
    unsigned long ino = 0;
    if (!(f >> num >> refs >> proto >> flags >> type >> st >> ino >> path)) continue;
    if (!inodes.count(ino) || path.size() < 2 || path[0] != '@') continue;
    if (!(std::stoul(flags, nullptr, 16) & kSoAcceptCon)) continue;
    std::string name = path.substr(1);
    if (name.rfind(prefix, 0) == 0) return std::optional<std::string>(name);
  }
  return std::optional<std::string>();
}

bool maps_library(pid_t pid, const std::string& name) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(name) != std::string::npos) return true;
  return false;
}

bool argv_leaves_running(const std::vector<std::string>& argv) {
  // criu's short options (criu/config.c): these take an argument, which is
  // the rest of the word or the next word; v and x take an optional one,
  // always the rest of the word.
  const std::string needs_argument = "tDorJWLM", optional_argument = "vx";
  const std::string leave_running = "--leave-running";
  bool dump = false, leave = false;
  for (size_t i = 1; i < argv.size(); i++) {
    const std::string& a = argv[i];
    if (a == "--") break;
    if (a.rfind("--", 0) == 0) {
      std::string name = a.substr(0, a.find('='));
      // "--leave-r" is the shortest that getopt_long does not confuse with
      // --leave-stopped.
      if (name.size() >= 9 && leave_running.rfind(name, 0) == 0) leave = true;
      continue;
    }
    if (a.size() > 1 && a[0] == '-') {
      for (size_t k = 1; k < a.size(); k++) {
        if (a[k] == 'R') leave = true;
        if (optional_argument.find(a[k]) != std::string::npos) break;
        if (needs_argument.find(a[k]) != std::string::npos) {
          if (k + 1 == a.size()) i++;  // the next word is its argument
          break;
        }
      }
      continue;
    }
    if (a == "dump") dump = true;
  }
  return dump && leave;
}

bool criu_leaves_running() {
  auto text = read_text("/proc/self/cmdline");
  if (!text) return false;
  std::vector<std::string> argv;
  size_t start = 0;
  for (size_t i = 0; i < text->size(); i++) {
    if ((*text)[i] != '\0') continue;
    argv.push_back(text->substr(start, i - start));
    start = i + 1;
  }
  return argv_leaves_running(argv);
}

}  // namespace phos::plugin
