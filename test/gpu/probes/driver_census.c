/* Preload that counts the program's calls of every driver function it
 * reaches through dlsym or cuGetProcAddress (how cudart, cuBLAS and PyTorch
 * reach libcuda): each such pointer is swapped for a trampoline that counts
 * and jumps on. At exit, "census NAME CALLS" lines go to $PHOS_CENSUS_FILE
 * (or stderr), most called first. Run without libphos.so: it tells how many
 * driver calls, of which functions, a workload makes, so that the hooks'
 * per-call cost can be weighed. A measurement tool, not part of phos. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 4096
__attribute__((visibility("hidden"))) unsigned long long census_counts[SLOTS];
__attribute__((visibility("hidden"))) void *census_reals[SLOTS];
extern char census_tramps[];
/* Slot i: count, then jump to the real function (14 bytes, padded to 16). */
__asm__(".text\n.balign 16\n.hidden census_tramps\ncensus_tramps:\n"
        ".set census_i, 0\n.rept 4096\n"
        "lock incq census_counts+8*census_i(%rip)\n"
        "jmp *census_reals+8*census_i(%rip)\n"
        ".balign 16\n.set census_i, census_i+1\n.endr\n");

static const char *names[SLOTS];
static int used;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void *counted(const char *name, void *real) {
  if (!real || !name || name[0] != 'c' || name[1] != 'u') return real;
  pthread_mutex_lock(&mu);
  void *out = real;
  for (int i = 0; i < used; i++)
    if (census_reals[i] == real) { out = census_tramps + 16 * i; goto done; }
  if (used < SLOTS) {
    census_reals[used] = real;
    names[used] = strdup(name);
    out = census_tramps + 16 * used++;
  }
done:
  pthread_mutex_unlock(&mu);
  return out;
}

typedef void *(*dlsym_t)(void *, const char *);
typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_v1_t)(const char *, void **, int, cuuint64_t);
static dlsym_t real_dlsym;
static gpa_v2_t real_gpa_v2;
static gpa_v1_t real_gpa_v1;

static CUresult census_gpa_v2(const char *s, void **p, int v, cuuint64_t f, CUdriverProcAddressQueryResult *st) {
  CUresult r = real_gpa_v2(s, p, v, f, st);
  if (r == CUDA_SUCCESS && p && *p) {
    if (strcmp(s, "cuGetProcAddress") == 0) { real_gpa_v2 = (gpa_v2_t)*p; *p = (void *)census_gpa_v2; }
    else *p = counted(s, *p);
  }
  return r;
}
static CUresult census_gpa_v1(const char *s, void **p, int v, cuuint64_t f) {
  CUresult r = real_gpa_v1(s, p, v, f);
  if (r == CUDA_SUCCESS && p && *p) *p = counted(s, *p);
  return r;
}

void *dlsym(void *handle, const char *name) {
  if (!real_dlsym) real_dlsym = (dlsym_t)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!real_dlsym) real_dlsym = (dlsym_t)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  void *r = real_dlsym(handle, name);
  if (!r || !name || name[0] != 'c' || name[1] != 'u') return r;
  if (strcmp(name, "cuGetProcAddress_v2") == 0) { real_gpa_v2 = (gpa_v2_t)r; return (void *)census_gpa_v2; }
  if (strcmp(name, "cuGetProcAddress") == 0) { real_gpa_v1 = (gpa_v1_t)r; return (void *)census_gpa_v1; }
  return counted(name, r);
}

static int by_count(const void *a, const void *b) {
  unsigned long long x = census_counts[*(const int *)a], y = census_counts[*(const int *)b];
  return x < y ? 1 : x > y ? -1 : 0;
}

__attribute__((destructor)) static void census_report(void) {
  const char *path = getenv("PHOS_CENSUS_FILE");
  FILE *f = path && *path ? fopen(path, "w") : stderr;
  if (!f) return;
  int order[SLOTS];
  for (int i = 0; i < used; i++) order[i] = i;
  qsort(order, used, sizeof(int), by_count);
  for (int i = 0; i < used; i++)
    if (census_counts[order[i]]) fprintf(f, "census %s %llu\n", names[order[i]], census_counts[order[i]]);
  if (f != stderr) fclose(f);
}
