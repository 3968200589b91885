/* Preload that logs how a program reaches the CUDA driver: every dlsym of a
 * cu* name (with the caller's object) and every cuGetProcAddress query. A
 * measurement tool for the GPU host, not part of phos. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef void *(*dlsym_t)(void *, const char *);
typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_v1_t)(const char *, void **, int, cuuint64_t);
static dlsym_t real_dlsym;
static gpa_v2_t real_gpa_v2;
static gpa_v1_t real_gpa_v1;

static void init(void) {
  if (!real_dlsym) real_dlsym = (dlsym_t)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!real_dlsym) real_dlsym = (dlsym_t)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

static CUresult log_gpa_v2(const char *s, void **p, int v, cuuint64_t f, CUdriverProcAddressQueryResult *st) {
  fprintf(stderr, "phos-probe gpa_v2 %s %d %llu\n", s, v, (unsigned long long)f);
  return real_gpa_v2(s, p, v, f, st);
}
static CUresult log_gpa_v1(const char *s, void **p, int v, cuuint64_t f) {
  fprintf(stderr, "phos-probe gpa_v1 %s %d %llu\n", s, v, (unsigned long long)f);
  return real_gpa_v1(s, p, v, f);
}

void *dlsym(void *handle, const char *name) {
  init();
  void *r = real_dlsym(handle, name);
  if (name && name[0] == 'c' && name[1] == 'u') {
    Dl_info info;
    const char *who = dladdr(__builtin_return_address(0), &info) && info.dli_fname ? info.dli_fname : "?";
    fprintf(stderr, "phos-probe dlsym %s from %s\n", name, who);
    if (r && strcmp(name, "cuGetProcAddress_v2") == 0) { real_gpa_v2 = (gpa_v2_t)r; return (void *)log_gpa_v2; }
    if (r && strcmp(name, "cuGetProcAddress") == 0) { real_gpa_v1 = (gpa_v1_t)r; return (void *)log_gpa_v1; }
  }
  return r;
}
