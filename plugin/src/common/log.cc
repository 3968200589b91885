#include "phos/plugin/log.h"

#include <dlfcn.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <string>

namespace phos::plugin {
namespace {

using PrintOnLevel = void (*)(unsigned int, const char*, ...);

PrintOnLevel criu_printer() {
  static PrintOnLevel fn = reinterpret_cast<PrintOnLevel>(dlsym(RTLD_DEFAULT, "print_on_level"));
  return fn;
}

// criu's print_on_level formats into one static buffer: two threads in it
// at once garble the log (NUL bytes in criu's log, seen; grep then calls it
// binary). The plugin's other threads (the engine's workers, the copier,
// the warm-up) write their lines themselves, each with one write(2) to
// criu's log fd, stamped as criu stamps its own.
struct CriuLog {
  int (*fd)() = nullptr;
  void (*start)(struct timeval*) = nullptr;
  unsigned (*level)() = nullptr;
  bool usable() const { return fd && start && level; }
};

const CriuLog& criu_log() {
  static const CriuLog log = [] {
    CriuLog l;
    l.fd = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "log_get_fd"));
    l.start = reinterpret_cast<void (*)(struct timeval*)>(dlsym(RTLD_DEFAULT, "log_get_logstart"));
    l.level = reinterpret_cast<unsigned (*)()>(dlsym(RTLD_DEFAULT, "log_get_loglevel"));
    return l;
  }();
  return log;
}

bool on_criu_thread() { return ::syscall(SYS_gettid) == ::getpid(); }

// criu's LOG_TIMESTAMP: lines carry "(SS.UUUUUU) " from level 4 (debug) on.
constexpr unsigned kCriuTimestampLevel = 4;

void write_line(const CriuLog& l, unsigned level, const char* tag, const char* msg) {
  if (level > l.level()) return;
  char line[2200];
  int n = 0;
  struct timeval start {};
  l.start(&start);
  if (l.level() >= kCriuTimestampLevel && (start.tv_sec || start.tv_usec)) {
    struct timeval now {};
    ::gettimeofday(&now, nullptr);
    long long us = (long long)(now.tv_sec - start.tv_sec) * 1000000 + (now.tv_usec - start.tv_usec);
    n = std::snprintf(line, sizeof(line), "(%02lld.%06lld) ", us / 1000000, us % 1000000);
  }
  int m = std::snprintf(line + n, sizeof(line) - size_t(n), "phos: %s%s\n", tag, msg);
  if (m < 0) return;
  size_t len = std::min(sizeof(line) - 1, size_t(n + m));
  (void)!::write(l.fd(), line, len);
}

LogLevel g_stderr_level = LogLevel::kWarn;

}  // namespace

void set_stderr_level(LogLevel level) { g_stderr_level = level; }

void log(LogLevel level, const char* format, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(msg, sizeof(msg), format, ap);
  va_end(ap);
  const char* tag = level == LogLevel::kError ? "Error: " : level == LogLevel::kWarn ? "Warn: " : "";
  auto print = criu_printer();
  if (print && !on_criu_thread() && criu_log().usable()) {
    write_line(criu_log(), static_cast<unsigned>(level), tag, msg);
  } else if (print) {
    print(static_cast<unsigned>(level), "phos: %s%s\n", tag, msg);
  } else if (level <= g_stderr_level) {
    std::fprintf(stderr, "phos: %s%s\n", tag, msg);
  }
}

}  // namespace phos::plugin
