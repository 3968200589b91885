#include "phos/hooks/stderr_line.h"

#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace phos::hooks {

// vsnprintf formats into the buffer through a string stream of its own,
// which takes no lock.
void stderr_line(const char* format, ...) {
  char text[4096];
  va_list ap;
  va_start(ap, format);
  int n = std::vsnprintf(text, sizeof(text), format, ap);
  va_end(ap);
  if (n < 0) return;
  size_t size = size_t(n);
  if (size >= sizeof(text)) {
    constexpr char kCut[] = "...\n";
    std::memcpy(text + sizeof(text) - sizeof(kCut), kCut, sizeof(kCut));
    size = sizeof(text) - 1;
  }
  for (size_t at = 0; at < size;) {
    ssize_t w = ::write(STDERR_FILENO, text + at, size - at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    at += size_t(w);
  }
}

}  // namespace phos::hooks
