#include "phos/plugin/log.h"

#include <dlfcn.h>

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
  if (auto print = criu_printer()) {
    print(static_cast<unsigned>(level), "phos: %s%s\n", tag, msg);
  } else if (level <= g_stderr_level) {
    std::fprintf(stderr, "phos: %s%s\n", tag, msg);
  }
}

}  // namespace phos::plugin
