/* A library whose relocation takes its time, as a big library's (CUDA's,
 * torch's, hundreds of MiB) does: dlopen() maps and relocates it holding
 * glibc's loader locks, the TLS one included, before any constructor runs.
 * An IFUNC resolver (run while the library is relocated) sleeps
 * PHOS_TEST_RELOCATION_MS (3000) ms after creating PHOS_TEST_RELOCATION_MARK
 * (where set): the sign that the loading thread is inside. Built with
 * -fno-plt: the resolver's calls go through GOT entries relocated before it. */
#include "slow_step.h"

__thread int slow_relocation_tls = 1;

static int answer(void) { return 42; }

static int (*slow_resolver(void))(void) {
  slow_steps("PHOS_TEST_RELOCATION_MS", "PHOS_TEST_RELOCATION_MARK", NULL);
  return answer;
}

__attribute__((visibility("hidden"))) int slow_relocation_answer(void) __attribute__((ifunc("slow_resolver")));
/* Its address in data: an IRELATIVE relocation, which runs the resolver as
 * the library is relocated. */
int (*slow_relocation_pointer)(void) = slow_relocation_answer;
