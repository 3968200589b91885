/* A library whose constructor takes its time, as a big library's (CUDA's,
 * torch's) does: the thread that dlopen()s it holds glibc's loader lock
 * until it returns. It sleeps PHOS_TEST_CONSTRUCTOR_MS (3000) ms, in steps,
 * after creating PHOS_TEST_CONSTRUCTOR_MARK (where set): the sign that the
 * loading thread is inside. It has thread-local storage, as those libraries
 * do (its load moves the process's TLS generation on).
 *   PHOS_TEST_CONSTRUCTOR_CUINIT=1: it calls cuInit(0) at every step,
 *   through libphos's gate: a checkpoint's closed gate holds it there.
 *   PHOS_TEST_CONSTRUCTOR_STDERR=1: it holds stdio's lock on stderr
 *   meanwhile, as a constructor frozen inside an fprintf(stderr) does. */
#include <dlfcn.h>
#include <stdio.h>

#include "slow_step.h"

__thread int slow_constructor_tls = 1;

static int (*cu_init)(unsigned);
static void call_cu_init(void) { cu_init(0); }

static int on(const char *name) {
  const char *v = getenv(name);
  return v && *v == '1';
}

__attribute__((constructor)) static void slow_constructor(void) {
  if (on("PHOS_TEST_CONSTRUCTOR_CUINIT")) cu_init = (int (*)(unsigned))dlsym(RTLD_DEFAULT, "cuInit");
  const int hold_stderr = on("PHOS_TEST_CONSTRUCTOR_STDERR");
  if (hold_stderr) flockfile(stderr);
  slow_steps("PHOS_TEST_CONSTRUCTOR_MS", "PHOS_TEST_CONSTRUCTOR_MARK", cu_init ? call_cu_init : NULL);
  if (hold_stderr) funlockfile(stderr);
  slow_constructor_tls++;
}
