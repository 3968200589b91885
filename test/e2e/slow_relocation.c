/* A library whose relocation takes its time, as a big library's (CUDA's,
 * torch's, hundreds of MiB) does: dlopen() maps and relocates it holding
 * glibc's loader locks, the TLS one included, before any constructor runs.
 * An IFUNC resolver (run while the library is relocated) sleeps
 * PHOS_TEST_RELOCATION_MS (3000) ms after creating PHOS_TEST_RELOCATION_MARK
 * (where set): the sign that the loading thread is inside. Built with
 * -fno-plt: the resolver's calls go through GOT entries relocated before it. */
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

__thread int slow_relocation_tls = 1;

static int answer(void) { return 42; }

static int (*slow_resolver(void))(void) {
  const char *ms_text = getenv("PHOS_TEST_RELOCATION_MS");
  const char *mark = getenv("PHOS_TEST_RELOCATION_MARK");
  long ms = ms_text ? atol(ms_text) : 3000;
  if (mark) {
    int fd = open(mark, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) close(fd);
  }
  struct timespec step = {0, 10 * 1000 * 1000};
  for (long slept = 0; slept < ms; slept += 10) nanosleep(&step, NULL);
  return answer;
}

__attribute__((visibility("hidden"))) int slow_relocation_answer(void) __attribute__((ifunc("slow_resolver")));
/* Its address in data: an IRELATIVE relocation, which runs the resolver as
 * the library is relocated. */
int (*slow_relocation_pointer)(void) = slow_relocation_answer;
