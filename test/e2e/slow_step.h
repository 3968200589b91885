/* The slow part of slow_constructor.c and slow_relocation.c: the file named
 * by the environment variable MARK_VAR is created (the sign that the loading
 * thread is inside), then MS_VAR ms (3000) pass in 10 ms steps (a restored
 * process finishes its sleep on its own clock), `each` (where given) called
 * at every step. */
#pragma once
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static inline void slow_steps(const char *ms_var, const char *mark_var, void (*each)(void)) {
  const char *ms_text = getenv(ms_var);
  const char *mark = getenv(mark_var);
  long ms = ms_text ? atol(ms_text) : 3000;
  if (mark) {
    int fd = open(mark, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) close(fd);
  }
  struct timespec step = {0, 10 * 1000 * 1000};
  for (long slept = 0; slept < ms; slept += 10) {
    if (each) each();
    nanosleep(&step, NULL);
  }
}
