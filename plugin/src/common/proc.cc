#include "phos/plugin/proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include "phos/support/unique_fd.h"

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

// The text after "KEY:" on its line of a /proc status file.
Result<std::string> status_field(const std::string& path, const std::string& key) {
  auto status = read_text(path);
  if (!status) return status.error();
  auto at = status->find("\n" + key + ":");
  if (at == std::string::npos) return make_error("no " + key + " in " + path, ENODATA);
  at += key.size() + 2;
  return status->substr(at, status->find('\n', at) - at);
}

constexpr unsigned long kSoAcceptCon = 0x10000;  // __SO_ACCEPTCON: listening

}  // namespace

Result<pid_t> ns_pid(pid_t pid) {
  auto nspid = status_field("/proc/" + std::to_string(pid) + "/status", "NSpid");
  if (!nspid) return nspid.error();
  std::istringstream fields(*nspid);
  pid_t v = 0, last = 0;
  while (fields >> v) last = v;
  if (last > 0) return last;
  return make_error("/proc/" + std::to_string(pid) + "/status has no NSpid");
}

std::vector<pid_t> thread_ids(pid_t pid) {
  std::vector<pid_t> out;
  auto tids = list_dir("/proc/" + std::to_string(pid) + "/task");
  if (!tids) return out;
  for (const std::string& tid : *tids) out.push_back(pid_t(std::stol(tid)));
  return out;
}

Result<size_t> lower_own_priority(int nice) {
  auto tids = list_dir("/proc/self/task");
  if (!tids) return tids.error();
  size_t changed = 0;
  for (const std::string& name : *tids) {
    const id_t tid = id_t(std::stol(name));
    errno = 0;
    const int now = ::getpriority(PRIO_PROCESS, tid);
    if (now == -1 && errno == ESRCH) continue;  // ended meanwhile
    if (now == -1 && errno) return errno_error("getpriority of thread " + name);
    if (now >= nice) continue;
    if (::setpriority(PRIO_PROCESS, tid, nice) != 0) {
      if (errno == ESRCH) continue;
      return errno_error("setpriority of thread " + name + " to nice " + std::to_string(nice));
    }
    changed++;
  }
  return changed;
}

Result<size_t> reserve_fd_table(int fds) {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return errno_error("getrlimit(RLIMIT_NOFILE)");
  if (limit.rlim_cur != RLIM_INFINITY && rlim_t(fds) > limit.rlim_cur) fds = int(limit.rlim_cur);
  // A descriptor at the top makes the kernel size the table for it; closed,
  // it leaves the table as it is.
  UniqueFd base(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!base.valid()) return errno_error("open /dev/null");
  if (!UniqueFd(::fcntl(base.get(), F_DUPFD_CLOEXEC, fds - 1)).valid())
    return errno_error("dup a descriptor to " + std::to_string(fds - 1));
  auto size = status_field("/proc/self/status", "FDSize");
  if (!size) return size.error();
  return size_t(std::stoul(*size));
}

std::optional<size_t> pipe_size_bound() {
  auto caps = status_field("/proc/self/status", "CapEff");
  if (!caps) return std::nullopt;
  constexpr int kCapSysResource = 24;
  if ((std::stoull(*caps, nullptr, 16) >> kCapSysResource) & 1) return std::nullopt;
  auto max = read_text("/proc/sys/fs/pipe-max-size");
  if (!max) return std::nullopt;
  return size_t(std::stoull(*max));
}

std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::string task = "/proc/" + std::to_string(pid) + "/task";
  auto tids = list_dir(task);
  if (!tids) return out;
  for (const std::string& tid : *tids) {
    auto text = read_text(task + "/" + tid + "/children");
    if (!text) continue;
    std::istringstream in(*text);
    pid_t child = 0;
    while (in >> child) out.push_back(child);
  }
  return out;
}

std::optional<uint64_t> start_time_of(pid_t pid) {
  auto stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return std::nullopt;
  // After the command name (in parentheses, which may hold anything):
  // fields 3 on; the start time is field 22.
  auto close = stat->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream in(stat->substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (in >> field); i++)
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  return std::nullopt;
}

std::optional<uint64_t> resident_bytes(pid_t pid) {
  auto rss = status_field("/proc/" + std::to_string(pid) + "/status", "VmRSS");
  if (!rss) return std::nullopt;
  return std::strtoull(rss->c_str(), nullptr, 10) * 1024;  // "VmRSS:   123 kB"
}

Result<pid_t> tracer_of(pid_t pid, pid_t tid) {
  auto tracer = status_field("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/status", "TracerPid");
  if (!tracer) return tracer.error();
  return pid_t(std::stol(*tracer));
}

Result<pid_t> find_thread(pid_t pid, const std::string& name) {
  std::string base = "/proc/" + std::to_string(pid) + "/task";
  auto tids = list_dir(base);
  if (!tids) return tids.error();
  for (const auto& t : *tids) {
    const pid_t tid = pid_t(std::stoi(t));
    if (thread_name(pid, tid) == name) return tid;
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

int wait_pid_free(pid_t pid, int limit_ms, int* exited_ms) {
  const std::string dir = "/proc/" + std::to_string(pid);
  constexpr int kStepMs = 2;
  int waited = 0, exited = -1;
  for (; waited < limit_ms && ::access(dir.c_str(), F_OK) == 0; waited += kStepMs) {
    if (exited < 0 && !process_alive(pid)) exited = waited;
    ::usleep(kStepMs * 1000);
  }
  if (exited_ms) *exited_ms = exited < 0 ? waited : exited;
  return waited;
}

namespace {
// The state letter of a stat file (after the name, which may hold spaces
// and parentheses); 0 where it cannot be read.
char state_in_stat(const std::string& path) {
  auto stat = read_text(path);
  if (!stat) return 0;
  auto close_paren = stat->rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= stat->size()) return 0;
  return (*stat)[close_paren + 2];
}
}  // namespace

bool process_alive(pid_t pid) {
  const char state = state_in_stat("/proc/" + std::to_string(pid) + "/stat");
  return state && state != 'Z' && state != 'X';
}

char thread_state(pid_t pid, pid_t tid) {
  return state_in_stat("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat");
}

std::string thread_name(pid_t pid, pid_t tid) {
  auto comm = read_text("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/comm");
  return comm ? comm->substr(0, comm->find('\n')) : std::string();
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

namespace {

// What criu's command line says: its words that are not options (the
// command among them: a long option's value may be the next word, so which
// word is the command is not known), its long options (without their
// values) and its short option letters.
struct CriuArgs {
  std::vector<std::string> words;
  std::vector<std::string> long_options;
  std::string short_flags;
  // A long option given in full or cut to at least `shortest` characters
  // (getopt_long takes any unambiguous prefix).
  bool said(const std::string& word) const { return std::find(words.begin(), words.end(), word) != words.end(); }
  bool has(const std::string& option, size_t shortest) const {
    for (const auto& name : long_options)
      if (name.size() >= shortest && option.rfind(name, 0) == 0) return true;
    return false;
  }
};

CriuArgs parse_criu_args(const std::vector<std::string>& argv) {
  // criu's short options (criu/config.c): these take an argument, which is
  // the rest of the word or the next word; v and x take an optional one,
  // always the rest of the word.
  const std::string needs_argument = "tDorJWLM", optional_argument = "vx";
  CriuArgs out;
  for (size_t i = 1; i < argv.size(); i++) {
    const std::string& a = argv[i];
    if (a == "--") break;
    if (a.rfind("--", 0) == 0) {
      out.long_options.push_back(a.substr(0, a.find('=')));
      continue;
    }
    if (a.size() > 1 && a[0] == '-') {
      for (size_t k = 1; k < a.size(); k++) {
        out.short_flags += a[k];
        if (optional_argument.find(a[k]) != std::string::npos) break;
        if (needs_argument.find(a[k]) != std::string::npos) {
          if (k + 1 == a.size()) i++;  // the next word is its argument
          break;
        }
      }
      continue;
    }
    out.words.push_back(a);
  }
  return out;
}

Result<std::vector<std::string>> own_argv() {
  auto text = read_text("/proc/self/cmdline");
  if (!text) return text.error();
  std::vector<std::string> argv;
  size_t start = 0;
  for (size_t i = 0; i < text->size(); i++) {
    if ((*text)[i] != '\0') continue;
    argv.push_back(text->substr(start, i - start));
    start = i + 1;
  }
  return argv;
}

}  // namespace

bool argv_leaves_running(const std::vector<std::string>& argv) {
  CriuArgs a = parse_criu_args(argv);
  // "--leave-r" is the shortest that getopt_long does not confuse with
  // --leave-stopped.
  const bool leave = a.has("--leave-running", 9) || a.short_flags.find('R') != std::string::npos;
  return a.said("dump") && leave;
}

bool argv_restores_lazily(const std::vector<std::string>& argv) {
  CriuArgs a = parse_criu_args(argv);
  // "--lazy-p": --lazy-migrate is the other --lazy- option.
  return a.said("restore") && a.has("--lazy-pages", 8);
}

std::optional<std::string> argv_prev_images_dir(const std::vector<std::string>& argv) {
  if (!parse_criu_args(argv).said("dump")) return std::nullopt;
  const std::string option = "--prev-images-dir";
  for (size_t i = 1; i < argv.size(); i++) {
    const std::string& a = argv[i];
    if (a == "--") break;
    if (a == option) return i + 1 < argv.size() ? std::optional(argv[i + 1]) : std::nullopt;
    if (a.rfind(option + "=", 0) == 0) return a.substr(option.size() + 1);
  }
  return std::nullopt;
}

std::optional<std::string> criu_prev_images_dir() {
  auto argv = own_argv();
  return argv ? argv_prev_images_dir(*argv) : std::nullopt;
}

std::optional<pid_t> argv_tree_root(const std::vector<std::string>& argv) {
  auto number = [](const std::string& s) -> std::optional<pid_t> {
    char* end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end || v <= 0 || v > INT32_MAX) return std::nullopt;
    return pid_t(v);
  };
  for (size_t i = 1; i < argv.size(); i++) {
    const std::string& a = argv[i];
    if (a == "--") break;
    if (a == "-t" || a == "--tree") return i + 1 < argv.size() ? number(argv[i + 1]) : std::nullopt;
    if (a.rfind("--tree=", 0) == 0) return number(a.substr(7));
    if (a.rfind("-t", 0) == 0 && a.size() > 2 && a[1] == 't') return number(a.substr(2));
  }
  return std::nullopt;
}

std::vector<pid_t> criu_tree_pids() {
  auto argv = own_argv();
  auto root = argv ? argv_tree_root(*argv) : std::nullopt;
  if (!root) return {};
  return tree_pids(*root);
}

std::vector<pid_t> tree_pids(pid_t root) {
  std::vector<pid_t> out{root};
  for (size_t i = 0; i < out.size(); i++)
    for (pid_t c : children_of(out[i])) out.push_back(c);
  return out;
}

std::vector<int> open_files_named(const std::string& prefix, std::vector<int>* all) {
  std::vector<int> named;
  auto fds = list_dir("/proc/self/fd");
  if (!fds) return named;
  // (The listing's own descriptor, closed since, reads as no link.)
  for (const std::string& name : *fds) {
    const int fd = std::atoi(name.c_str());
    if (all) all->push_back(fd);
    char link[PATH_MAX];
    const ssize_t n = ::readlink(("/proc/self/fd/" + name).c_str(), link, sizeof(link) - 1);
    if (n > 0 && std::string_view(link, size_t(n)).substr(0, prefix.size()) == prefix) named.push_back(fd);
  }
  std::sort(named.begin(), named.end());
  if (all) std::sort(all->begin(), all->end());
  return named;
}

pid_t hand_files_to_holder(const std::string& prefix) {
  std::vector<int> all;
  const std::vector<int> keep = open_files_named(prefix, &all);
  if (keep.empty()) return 0;
  int gone[2];
  if (::pipe2(gone, O_CLOEXEC) != 0) return -1;
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(gone[0]);
    ::close(gone[1]);
    return -1;
  }
  if (child == 0) {
    // Only async-signal-safe calls: the parent may have had other threads.
    // Nothing but the named files and the pipe's read end stays open, so
    // that no one waits on this child for anything else (a caller reading
    // criu's output to its end).
    for (int fd : all)
      if (fd != gone[0] && !std::binary_search(keep.begin(), keep.end(), fd)) ::close(fd);
    ::close(gone[1]);
    ::setsid();
    char byte;
    while (::read(gone[0], &byte, 1) < 0 && errno == EINTR) {
    }
    ::_exit(0);  // the files close here, the driver's teardown with them
  }
  ::close(gone[0]);  // the write end closes with this process: the child's cue
  return child;
}

namespace {
std::string held_prefix;
pid_t holder_owner = 0;
void hold_at_exit() {
  if (::getpid() == holder_owner) (void)hand_files_to_holder(held_prefix);
}
}  // namespace

void hold_files_at_exit(const std::string& prefix) {
  if (holder_owner) return;
  held_prefix = prefix;
  holder_owner = ::getpid();
  std::atexit(hold_at_exit);
}

bool criu_leaves_running() {
  auto argv = own_argv();
  return argv && argv_leaves_running(*argv);
}

bool criu_restores_lazily() {
  auto argv = own_argv();
  return argv && argv_restores_lazily(*argv);
}

}  // namespace phos::plugin
