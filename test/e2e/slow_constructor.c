/* A library whose constructor takes its time, as a big library's (CUDA's,
 * torch's) does: the thread that dlopen()s it holds glibc's loader lock
 * until it returns. It sleeps PHOS_TEST_CONSTRUCTOR_MS (3000) ms, in steps,
 * after creating PHOS_TEST_CONSTRUCTOR_MARK (where set): the sign that the
 * loading thread is inside. It has thread-local storage, as those libraries
 * do (its load moves the process's TLS generation on). With
 * PHOS_TEST_CONSTRUCTOR_CUINIT=1 it calls cuInit(0) at every step, through
 * libphos's gate: a checkpoint's closed gate holds it there, inside dlopen. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

__thread int slow_constructor_tls = 1;

__attribute__((constructor)) static void slow_constructor(void) {
  const char *ms_text = getenv("PHOS_TEST_CONSTRUCTOR_MS");
  const char *mark = getenv("PHOS_TEST_CONSTRUCTOR_MARK");
  long ms = ms_text ? atol(ms_text) : 3000;
  if (mark) {
    int fd = open(mark, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) close(fd);
  }
  /* PHOS_TEST_CONSTRUCTOR_STDERR=1: it holds stderr's lock meanwhile, as a
   * constructor frozen in the middle of an fprintf(stderr) does. */
  const char *hold_stderr = getenv("PHOS_TEST_CONSTRUCTOR_STDERR");
  if (hold_stderr && *hold_stderr == '1') flockfile(stderr);
  typedef int (*CuInit)(unsigned);
  const char *cuinit = getenv("PHOS_TEST_CONSTRUCTOR_CUINIT");
  CuInit init = cuinit && *cuinit == '1' ? (CuInit)dlsym(RTLD_DEFAULT, "cuInit") : NULL;
  /* 10 ms steps: a restored process finishes its sleep on its own clock. */
  struct timespec step = {0, 10 * 1000 * 1000};
  for (long slept = 0; slept < ms; slept += 10) {
    if (init) init(0);
    nanosleep(&step, NULL);
  }
  if (hold_stderr && *hold_stderr == '1') funlockfile(stderr);
  slow_constructor_tls++;
}
