#include "common/stuck_thread.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "phos/images/unique_fd.h"
#include "phos/plugin/proc.h"

namespace phos::plugin {
namespace {

struct Mapping {
  uint64_t start, end, offset;
  std::string file;
};

// The executable file mappings of `pid`.
std::vector<Mapping> code_mappings(pid_t pid) {
  std::vector<Mapping> out;
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    Mapping m;
    char perms[8] = {};
    char path[512] = {};
    if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %*s %*s %511s", &m.start, &m.end, perms,
                    &m.offset, path) < 4 || perms[2] != 'x' || path[0] != '/')
      continue;
    const std::string full = path;
    m.file = full.substr(full.rfind('/') + 1);
    out.push_back(std::move(m));
  }
  return out;
}

// "LIBRARY+0xOFFSET" (the offset in the file, as addr2line takes it), or
// nothing outside code.
std::optional<std::string> place(const std::vector<Mapping>& code, uint64_t address) {
  for (const auto& m : code) {
    if (address < m.start || address >= m.end) continue;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "+0x%" PRIx64, address - m.start + m.offset);
    return m.file + buf;
  }
  return std::nullopt;
}

// /proc/PID/task/TID/syscall: "NR ARG1..ARG6 SP PC" in a system call,
// "-1 SP PC" stopped outside one; nothing where it runs or is gone.
std::optional<std::vector<uint64_t>> syscall_of(pid_t pid, pid_t tid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/syscall");
  std::string first;
  if (!(in >> first) || first == "running") return std::nullopt;
  std::vector<uint64_t> fields{uint64_t(std::stoll(first))};
  std::string word;
  while (in >> word) fields.push_back(std::stoull(word, nullptr, 0));
  return fields;
}

// Code addresses among the first words of the stack at `sp`, placed: the
// callers' return addresses (and some stale ones; the first few tell).
std::string stack_code(pid_t pid, uint64_t sp, const std::vector<Mapping>& code, size_t most) {
  UniqueFd mem(::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY | O_CLOEXEC));
  if (!mem.valid()) return "(its stack could not be read)";
  uint64_t words[1024];
  ssize_t got = ::pread(mem.get(), words, sizeof(words), off_t(sp));
  std::string out;
  size_t found = 0;
  for (ssize_t i = 0; i < got / ssize_t(sizeof(uint64_t)) && found < most; i++) {
    auto at = place(code, words[i]);
    if (!at) continue;
    out += (found++ ? ", " : "") + *at;
  }
  return found ? out : "(no code addresses on its stack)";
}

// Whether every thread of `pid` but `tid` is in a tracing stop (criu's): a
// thread made since (the agent's own work may start some) runs, and may be
// what `tid` waits for.
bool others_stopped(pid_t pid, pid_t tid) {
  for (pid_t t : thread_ids(pid))
    if (t != tid && thread_state(pid, t) != 't') return false;
  return true;
}

}  // namespace

std::optional<std::string> futex_wait_of(pid_t pid, pid_t tid) {
  auto call = syscall_of(pid, tid);
  if (!call || call->size() < 9 || (*call)[0] != SYS_futex) return std::nullopt;
  const auto code = code_mappings(pid);
  const uint64_t sp = (*call)[7], pc = (*call)[8];
  char args[96];
  std::snprintf(args, sizeof(args), "futex(0x%" PRIx64 ", op %" PRIu64 ")", (*call)[1], (*call)[2]);
  return std::string(args) + " at " + place(code, pc).value_or("?") + "; code on its stack: " +
         stack_code(pid, sp, code, 12);
}

std::string other_threads_at(pid_t pid, pid_t tid, size_t most) {
  const auto code = code_mappings(pid);
  std::string out;
  size_t n = 0;
  for (pid_t t : thread_ids(pid)) {
    if (t == tid) continue;
    if (n++ == most) {
      out += "; ...";
      break;
    }
    auto call = syscall_of(pid, t);
    std::string where = "running";
    if (call && !call->empty()) {
      where = place(code, call->back()).value_or("?");
      if (int64_t((*call)[0]) >= 0) where += ", system call " + std::to_string((*call)[0]);
    }
    out += (out.empty() ? "" : "; ") + std::to_string(t) + " (" + thread_name(pid, t) + "): " + where;
  }
  return out;
}

std::optional<std::string> StuckWatch::check(int step_ms) {
  auto waiting = futex_wait_of(pid_, tid_);
  if (!waiting || !others_stopped(pid_, tid_)) {
    waited_ms_ = 0;
    return std::nullopt;
  }
  waited_ms_ += step_ms;
  if (waited_ms_ < limit_ms_) return std::nullopt;
  return "the agent's thread (" + std::to_string(tid_) + ") has waited " + std::to_string(waited_ms_) +
         " ms in " + *waiting + ", while the process's other threads are stopped: one of them holds what it waits "
         "for, and it would wait as long as they are stopped. They were stopped at: " +
         other_threads_at(pid_, tid_);
}

}  // namespace phos::plugin
