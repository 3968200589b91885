/* RTLD_NEXT from a library: call_next() must find next_b.so's probe, not its own. */
#define _GNU_SOURCE
#include <dlfcn.h>
int phos_next_probe(void) { return 1; }
int call_next(void) {
  int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "phos_next_probe");
  return next ? next() : -1;
}
