#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <thread>

#include "phos/plugin/proc.h"

using namespace phos::plugin;

TEST_CASE("proc: ns_pid of a process in this namespace is its pid", "[proc]") {
  auto p = ns_pid(::getpid());
  REQUIRE(p.ok());
  CHECK(*p == ::getpid());
}

TEST_CASE("proc: finds a thread by name", "[proc]") {
  std::atomic<pid_t> tid{0};
  std::atomic<bool> stop{false};
  std::thread t([&] {
    prctl(PR_SET_NAME, "phos-unit-find");
    tid = ::gettid();
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (!tid) std::this_thread::yield();
  auto found = find_thread(::getpid(), "phos-unit-find");
  stop = true;
  t.join();
  REQUIRE(found.ok());
  CHECK(*found == tid);
  auto missing = find_thread(::getpid(), "no-such-thread");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().code == ESRCH);
}

TEST_CASE("proc: a zombie and a reaped process are not alive", "[proc]") {
  CHECK(process_alive(::getpid()));
  pid_t child = ::fork();
  if (child == 0) _exit(0);
  for (int i = 0; i < 200 && process_alive(child); i++) ::usleep(5000);
  CHECK_FALSE(process_alive(child));  // a zombie until reaped
  ::waitpid(child, nullptr, 0);
  CHECK_FALSE(process_alive(child));
}

TEST_CASE("proc: a running process has no kill pending", "[proc]") {
  CHECK_FALSE(kill_pending(::getpid()));
  pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    _exit(0);
  }
  CHECK_FALSE(kill_pending(child));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

TEST_CASE("proc: a process that is gone counts as killed", "[proc]") {
  pid_t child = ::fork();
  if (child == 0) _exit(0);
  ::waitpid(child, nullptr, 0);
  CHECK(kill_pending(child));
}

TEST_CASE("proc: a process without an agent has no agent socket", "[proc]") {
  auto found = find_listening_socket(::getpid(), "phos-agent.");
  REQUIRE(found.ok());
  CHECK_FALSE(found->has_value());
}

TEST_CASE("proc: a criu dump with -R or --leave-running leaves the processes running", "[proc]") {
  using V = std::vector<std::string>;
  CHECK(argv_leaves_running(V{"criu", "dump", "-t", "5", "-D", "img", "--leave-running"}));
  CHECK(argv_leaves_running(V{"criu", "dump", "-R", "-t", "5"}));
  CHECK(argv_leaves_running(V{"criu", "-R", "dump", "-t", "5"}));   // getopt takes options anywhere
  CHECK(argv_leaves_running(V{"criu", "dump", "-jR", "-t", "5"}));  // a cluster of short options
  CHECK(argv_leaves_running(V{"criu", "dump", "--leave-r", "-t5"}));  // an unambiguous abbreviation
  CHECK(argv_leaves_running(V{"/usr/sbin/criu", "dump", "--tree=5", "--leave-running", "--images-dir", "img"}));
}

TEST_CASE("proc: other criu command lines do not say the processes run on", "[proc]") {
  using V = std::vector<std::string>;
  CHECK_FALSE(argv_leaves_running(V{"criu", "dump", "-t", "5", "-D", "img"}));
  CHECK_FALSE(argv_leaves_running(V{"criu", "restore", "-R", "-D", "img"}));
  CHECK_FALSE(argv_leaves_running(V{"criu", "pre-dump", "-t", "5", "--leave-running"}));
  CHECK_FALSE(argv_leaves_running(V{"criu", "swrk", "3"}));  // RPC: the options are not on the line
  CHECK_FALSE(argv_leaves_running(V{"criu", "dump", "--leave-stopped", "-t", "5"}));
  CHECK_FALSE(argv_leaves_running(V{"criu", "dump", "--leave", "-t", "5"}));  // ambiguous for getopt
  CHECK_FALSE(argv_leaves_running(V{"criu", "dump", "-D", "-R", "-t", "5"}));  // -R is -D's argument here
  CHECK_FALSE(argv_leaves_running(V{"criu", "dump", "-oR.log", "-t", "5"}));  // and -o's here
  CHECK_FALSE(argv_leaves_running(V{"criu", "dump", "-v4R", "-t", "5"}));     // and -v's
  CHECK_FALSE(argv_leaves_running(V{"criu", "dump", "-t", "5", "--", "-R"}));
  CHECK_FALSE(argv_leaves_running(V{}));
}

TEST_CASE("proc: a criu restore with --lazy-pages restores lazily", "[proc]") {
  using V = std::vector<std::string>;
  CHECK(argv_restores_lazily(V{"criu", "restore", "-D", "img", "--lazy-pages"}));
  CHECK(argv_restores_lazily(V{"criu", "--lazy-pages", "restore", "-d"}));
  CHECK(argv_restores_lazily(V{"criu", "restore", "--lazy-p", "-D", "img"}));  // an unambiguous abbreviation
  CHECK(argv_restores_lazily(V{"criu", "restore", "--images-dir", "img", "--lazy-pages"}));
}

TEST_CASE("proc: other criu command lines do not restore lazily", "[proc]") {
  using V = std::vector<std::string>;
  CHECK_FALSE(argv_restores_lazily(V{"criu", "restore", "-D", "img", "-d"}));
  CHECK_FALSE(argv_restores_lazily(V{"criu", "dump", "-t", "5", "--lazy-pages"}));
  CHECK_FALSE(argv_restores_lazily(V{"criu", "restore", "--lazy-migrate"}));
  CHECK_FALSE(argv_restores_lazily(V{"criu", "restore", "--lazy", "-D", "img"}));  // ambiguous for getopt
  CHECK_FALSE(argv_restores_lazily(V{"criu", "restore", "-D", "img", "--", "--lazy-pages"}));
  CHECK_FALSE(argv_restores_lazily(V{"criu", "lazy-pages", "-D", "img"}));
  CHECK_FALSE(argv_restores_lazily(V{}));
}

TEST_CASE("proc: this test program is not a criu that leaves processes running", "[proc]") {
  CHECK_FALSE(criu_leaves_running());
}

TEST_CASE("proc: children_of lists a forked child; none for a leaf or a process that is gone", "[proc]") {
  pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  REQUIRE(child > 0);
  std::atomic<pid_t> from_thread{0};
  std::thread t([&] {
    pid_t c = ::fork();
    if (c == 0) {
      ::pause();
      ::_exit(0);
    }
    from_thread = c;
  });
  t.join();
  std::vector<pid_t> seen = children_of(::getpid());
  // A thread's children are in its own task's list; once the thread is
  // gone they move to another thread of the process: not checked here.
  CHECK(std::find(seen.begin(), seen.end(), child) != seen.end());
  CHECK(children_of(child).empty());
  ::kill(child, SIGKILL);
  ::kill(from_thread, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::waitpid(from_thread, nullptr, 0);
  CHECK(children_of(999999999).empty());
}

TEST_CASE("proc: start_time_of tells a process from a later one", "[proc]") {
  auto self = start_time_of(::getpid());
  REQUIRE(self.has_value());
  pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  REQUIRE(child > 0);
  auto later = start_time_of(child);
  REQUIRE(later.has_value());
  CHECK(*later >= *self);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  CHECK_FALSE(start_time_of(child).has_value());
}

TEST_CASE("proc: the dumped tree's root from criu's command line", "[proc]") {
  using phos::plugin::argv_tree_root;
  CHECK(argv_tree_root({"criu", "dump", "-t", "42", "-D", "img"}) == 42);
  CHECK(argv_tree_root({"criu", "dump", "-t42"}) == 42);
  CHECK(argv_tree_root({"criu", "dump", "--tree", "7"}) == 7);
  CHECK(argv_tree_root({"criu", "dump", "--tree=9", "-R"}) == 9);
  CHECK_FALSE(argv_tree_root({"criu", "swrk", "3"}));
  CHECK_FALSE(argv_tree_root({"criu", "dump", "-t"}));
  CHECK_FALSE(argv_tree_root({"criu", "dump", "-t", "x1"}));
  CHECK_FALSE(argv_tree_root({"criu", "dump", "-D", "img", "--", "-t", "5"}));
}

TEST_CASE("proc: resident memory grows with pages touched, nothing for a process gone", "[proc]") {
  using phos::plugin::resident_bytes;
  auto before = resident_bytes(::getpid());
  REQUIRE(before.has_value());
  CHECK(*before > 0);
  constexpr size_t kBytes = 64 << 20;
  std::unique_ptr<char[]> block(new char[kBytes]);
  for (size_t i = 0; i < kBytes; i += 4096) block[i] = char(i);
  auto after = resident_bytes(::getpid());
  REQUIRE(after.has_value());
  CHECK(*after >= *before + kBytes / 2);
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  CHECK_FALSE(resident_bytes(child).has_value());
}

TEST_CASE("criu argv: --prev-images-dir of a dump, as criu takes it", "[proc][parent]") {
  using V = std::vector<std::string>;
  CHECK(argv_prev_images_dir(V{"criu", "dump", "-t", "5", "-D", "img2", "--prev-images-dir", "../img1"}) == "../img1");
  CHECK(argv_prev_images_dir(V{"criu", "dump", "--prev-images-dir=../p", "-t", "5"}) == "../p");
  CHECK_FALSE(argv_prev_images_dir(V{"criu", "dump", "-t", "5", "-D", "img"}));
  CHECK_FALSE(argv_prev_images_dir(V{"criu", "restore", "-D", "img", "--prev-images-dir", "../p"}));
  CHECK_FALSE(argv_prev_images_dir(V{"criu", "dump", "--prev-images-dir"}));  // no argument: criu refuses it
}

TEST_CASE("proc: wait_pid_free waits for the exit and the reaping, and says when each came", "[proc]") {
  pid_t child = ::fork();
  if (child == 0) {
    ::usleep(150000);
    _exit(0);
  }
  std::thread reaper([child] {
    ::usleep(400000);
    ::waitpid(child, nullptr, 0);
  });
  int exited_ms = -1;
  const int free_ms = wait_pid_free(child, 5000, &exited_ms);
  reaper.join();
  CHECK(exited_ms >= 100);
  CHECK(exited_ms < free_ms);
  CHECK(free_ms >= 300);
  CHECK(free_ms < 5000);
}

TEST_CASE("proc: wait_pid_free gives up at its limit while the pid is taken", "[proc]") {
  int exited_ms = -1;
  CHECK(wait_pid_free(::getpid(), 60, &exited_ms) >= 60);
  CHECK(exited_ms >= 60);  // never seen exited
}

// In a child: the nice values are the process's own for good.
TEST_CASE("proc: lower_own_priority lowers every thread, keeps a lower one, and new threads inherit it", "[proc]") {
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int code = 0;
    std::atomic<pid_t> low{0}, plain{0};
    std::atomic<bool> stop{false};
    std::thread lowest([&] {
      ::setpriority(PRIO_PROCESS, 0, 15);
      low = ::gettid();
      while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    std::thread other([&] {
      plain = ::gettid();
      while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    while (!low || !plain) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto changed = lower_own_priority(7);
    if (!changed || *changed != 2) code |= 1;                 // this thread and `other`
    if (::getpriority(PRIO_PROCESS, 0) != 7) code |= 2;       // this thread
    if (::getpriority(PRIO_PROCESS, plain) != 7) code |= 4;
    if (::getpriority(PRIO_PROCESS, low) != 15) code |= 8;    // already lower: kept
    int inherited = -100;
    std::thread later([&] { inherited = ::getpriority(PRIO_PROCESS, 0); });
    later.join();
    if (inherited != 7) code |= 16;
    stop = true;
    lowest.join();
    other.join();
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

namespace {
// This process's descriptors: the entries of /proc/self/fd, less the one
// listing them.
size_t open_fds() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (d && ::readdir(d)) n++;
  if (d) ::closedir(d);
  return n - 3;  // ".", ".." and the directory's own
}
}  // namespace

TEST_CASE("proc: reserve_fd_table grows the table once, leaves no descriptor, and keeps to RLIMIT_NOFILE", "[proc]") {
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int code = 0;
    struct rlimit lim {};
    ::getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 8192);
    ::setrlimit(RLIMIT_NOFILE, &lim);
    const size_t before = open_fds();
    auto size = reserve_fd_table(4096);
    if (!size || *size < 4096) code |= 1;
    if (open_fds() != before) code |= 2;  // the descriptor that grew it is closed
    // A descriptor near the top now lands in the table as it is.
    const int null_fd = ::open("/dev/null", O_RDONLY);
    int high = ::fcntl(null_fd, F_DUPFD, 4000);
    ::close(null_fd);
    auto again = reserve_fd_table(64);
    if (high < 0 || !again || *again != *size) code |= 4;
    if (high >= 0) ::close(high);
    // Above the limit: bounded by it, not refused.
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 6000);
    ::setrlimit(RLIMIT_NOFILE, &lim);
    auto bounded = reserve_fd_table(1 << 20);
    if (!bounded || *bounded < 6000) code |= 8;
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("proc: pipe_size_bound is fs.pipe-max-size without CAP_SYS_RESOURCE, none with it", "[proc]") {
  std::ifstream status("/proc/self/status");
  std::string line;
  unsigned long long eff = 0;
  while (std::getline(status, line))
    if (line.rfind("CapEff:", 0) == 0) eff = std::stoull(line.substr(7), nullptr, 16);
  std::ifstream max_file("/proc/sys/fs/pipe-max-size");
  size_t max = 0;
  max_file >> max;
  auto bound = pipe_size_bound();
  if ((eff >> 24) & 1) {
    CHECK_FALSE(bound.has_value());
  } else {
    REQUIRE(bound.has_value());
    CHECK(*bound == max);
  }
}

TEST_CASE("proc: open_files_named lists the descriptors whose link starts with the prefix", "[proc][holder]") {
  char path[] = "/tmp/phos-named-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::vector<int> all;
  auto named = open_files_named(path, &all);
  CHECK(named == std::vector<int>{fd});
  CHECK(std::find(all.begin(), all.end(), fd) != all.end());
  CHECK(std::find(all.begin(), all.end(), 0) != all.end());  // every one, not only the named
  CHECK(open_files_named(std::string(path) + "-none").empty());
  ::close(fd);
  ::unlink(path);
}

// The holder keeps only the named files (and its cue), while its parent
// lives, and lets them go once it has exited: a reader of a pipe whose write
// end the parent named sees its end only then.
TEST_CASE("proc: hand_files_to_holder keeps the named files past the process's exit, nothing else", "[proc][holder]") {
  int data[2], report[2], go[2];
  REQUIRE(::pipe(data) == 0);
  REQUIRE(::pipe(report) == 0);
  REQUIRE(::pipe(go) == 0);
  char named[] = "/tmp/phos-holder-XXXXXX";
  int held = ::mkstemp(named);
  REQUIRE(held >= 0);
  const pid_t subject = ::fork();
  REQUIRE(subject >= 0);
  if (subject == 0) {
    ::close(data[0]);
    ::close(report[0]);
    ::close(go[1]);
    // The data pipe's write end under the holder's prefix: a file there.
    ::dup2(held, 100);
    ::close(held);
    pid_t holder = hand_files_to_holder(named);
    ::close(data[1]);  // the subject's own end: only the holder's is left
    (void)!::write(report[1], &holder, sizeof holder);
    char byte;
    (void)!::read(go[0], &byte, 1);
    ::_exit(0);
  }
  ::close(data[1]);
  ::close(report[1]);
  ::close(go[0]);
  pid_t holder = 0;
  REQUIRE(::read(report[0], &holder, sizeof holder) == sizeof holder);
  REQUIRE(holder > 0);
  // The holder keeps the named file, not the data pipe's write end (not
  // named), nor stdin/stdout.
  // (It closes the others after the fork, beside the subject's report.)
  std::vector<std::string> links;
  std::string listing;
  for (int tries = 0; tries < 200 && (tries == 0 || links.size() > 2); tries++) {
    if (tries) ::usleep(10 * 1000);
    links.clear();
    listing.clear();
    for (int fd = 0; fd < 256; fd++) {
      char link[PATH_MAX];
      std::string p = "/proc/" + std::to_string(holder) + "/fd/" + std::to_string(fd);
      ssize_t n = ::readlink(p.c_str(), link, sizeof link - 1);
      if (n <= 0) continue;
      links.emplace_back(link, size_t(n));
      listing += " " + std::to_string(fd) + "=" + links.back();
    }
  }
  INFO("the holder's files:" << listing);
  CHECK(std::count(links.begin(), links.end(), std::string(named)) == 1);
  CHECK(std::count_if(links.begin(), links.end(), [](const std::string& l) { return l.rfind("pipe:", 0) == 0; }) == 1);
  CHECK(links.size() == 2);  // the named file and its cue
  // The data pipe's write end was only the subject's: its reader sees the end.
  char byte;
  CHECK(::read(data[0], &byte, 1) == 0);
  // The holder waits for the subject.
  ::usleep(50 * 1000);
  CHECK(::kill(holder, 0) == 0);
  ::close(go[1]);
  int status = 0;
  REQUIRE(::waitpid(subject, &status, 0) == subject);
  // Then goes (not this test's child: polled, up to 5 s).
  bool gone = false;
  for (int i = 0; i < 500 && !gone; i++) {
    std::ifstream stat("/proc/" + std::to_string(holder) + "/stat");
    std::string s;
    std::getline(stat, s);
    gone = s.empty() || s.find(") Z ") != std::string::npos;
    if (!gone) ::usleep(10 * 1000);
  }
  CHECK(gone);
  ::close(data[0]);
  ::close(report[0]);
  ::unlink(named);
}
