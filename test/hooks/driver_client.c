/* Reaches the (fake or real) driver every way a program can, and reports
 * which object answered: run with LD_PRELOAD=libphos.so, every answer must
 * be libphos.so, and every call must still reach libcuda; but a query
 * (cuDriverGetVersion, in libphos's query_functions.txt) is libcuda's own
 * but where the program links it directly.
 *
 * usage: driver_client where | loop STATE_FILE | query-loop STATE_FILE
 * (loop: calls through libphos's wrapper; query-loop: queries; each writes
 * its count of calls made to STATE_FILE after every call) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef CUresult (*memcpy_t)(CUdeviceptr, const void *, size_t);
typedef CUresult (*gpa2_t)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*version_t)(int *);

CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t); /* linked directly */
CUresult cuDriverGetVersion(int *);                          /* likewise */
int call_next(void);                                          /* next_a.so */
int phos_next_b_loaded(void);                                 /* keeps next_b.so loaded, after next_a.so */

static const char *owner(void *p) {
  Dl_info info;
  if (!p || !dladdr(p, &info) || !info.dli_fname) return "none";
  const char *slash = strrchr(info.dli_fname, '/');
  return slash ? slash + 1 : info.dli_fname;
}

int main(int argc, char **argv) {
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
  unsigned long long *calls = (unsigned long long *)dlsym(cuda, "fake_calls");
  if (!cuda || !calls) { printf("no fake libcuda\n"); return 2; }
  memcpy_t by_dlsym = (memcpy_t)dlsym(cuda, "cuMemcpyHtoD_v2");
  gpa2_t gpa = (gpa2_t)dlsym(cuda, "cuGetProcAddress_v2");
  void *by_gpa = NULL, *gpa_of_gpa = NULL, *by_gpa_of_gpa = NULL;
  gpa("cuMemcpyHtoD", &by_gpa, 13000, 0, NULL);
  gpa("cuGetProcAddress", &gpa_of_gpa, 13000, 0, NULL);
  ((gpa2_t)gpa_of_gpa)("cuMemcpyHtoD", &by_gpa_of_gpa, 13000, 0, NULL);

  void *query_by_gpa = NULL;
  gpa("cuDriverGetVersion", &query_by_gpa, 13000, 0, NULL);

  if (argc > 2 && (!strcmp(argv[1], "loop") || !strcmp(argv[1], "query-loop"))) {
    int queries = !strcmp(argv[1], "query-loop"), version;
    for (unsigned long long n = 1;; n++) {
      if (queries) {
        ((version_t)query_by_gpa)(&version);
        cuDriverGetVersion(&version);
      } else if (by_gpa_of_gpa) {
        ((memcpy_t)by_gpa_of_gpa)(0, NULL, 0);
      }
      char tmp[4096];
      snprintf(tmp, sizeof(tmp), "%s.tmp", argv[2]);
      FILE *f = fopen(tmp, "w");  /* written aside and renamed: readers never see it half written */
      if (f) { fprintf(f, "%llu\n", queries ? n : *calls); fclose(f); rename(tmp, argv[2]); }
      usleep(1000);
    }
  }
  printf("dlsym %s\n", owner((void *)by_dlsym));
  printf("cuGetProcAddress %s\n", owner((void *)gpa));
  printf("cuGetProcAddress(cuMemcpyHtoD) %s\n", owner(by_gpa));
  printf("cuGetProcAddress(cuGetProcAddress) %s\n", owner(gpa_of_gpa));
  printf("that(cuMemcpyHtoD) %s\n", owner(by_gpa_of_gpa));
  printf("direct %s\n", owner((void *)&cuMemcpyHtoD_v2));
  printf("missing %s\n", owner(dlsym(cuda, "cuNoSuchFunction")));
  printf("query dlsym %s\n", owner(dlsym(cuda, "cuDriverGetVersion")));
  printf("query cuGetProcAddress %s\n", owner(query_by_gpa));
  printf("query direct %s\n", owner((void *)&cuDriverGetVersion));
  unsigned long long before = *calls;
  by_dlsym(0, NULL, 0);
  ((memcpy_t)by_gpa)(0, NULL, 0);
  ((memcpy_t)by_gpa_of_gpa)(0, NULL, 0);
  cuMemcpyHtoD_v2(0, NULL, 0);
  printf("calls reached libcuda %llu\n", *calls - before);
  printf("RTLD_NEXT from a library %d\n", phos_next_b_loaded() ? call_next() : -2);
  return 0;
}
