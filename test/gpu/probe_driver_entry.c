/* Which exported libcuda symbol does cuGetProcAddress return for a name,
 * version and flags? The hooks substitute their wrappers by that identity;
 * this probe checks it holds on the host's driver. Prints one line a query:
 *   NAME VERSION FLAGS -> SYMBOL | internal POINTER */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*init_t)(unsigned);

int main(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) { printf("probe: no libcuda: %s\n", dlerror()); return 1; }
  gpa_v2_t gpa = (gpa_v2_t)dlsym(lib, "cuGetProcAddress_v2");
  init_t init = (init_t)dlsym(lib, "cuInit");
  if (!gpa || !init || init(0) != CUDA_SUCCESS) { printf("probe: cuInit failed\n"); return 1; }
  const char *names[] = {"cuMemAlloc", "cuMemFree", "cuMemAllocPitch", "cuMemAllocAsync", "cuMemFreeAsync",
                         "cuLaunchKernel", "cuLaunchKernelEx", "cuMemcpyAsync", "cuMemcpyHtoD", "cuStreamSynchronize",
                         "cuGetProcAddress", "cuMemGetAddressRange", "cuGraphLaunch", "cuLibraryLoadData",
                         "cuKernelGetFunction", "cuMemCreate", "cuMemMap"};
  const char *suffixes[] = {"", "_v2", "_v3", "_ptsz", "_v2_ptsz", "_ptds", "_v2_ptds", "_v3_ptds"};
  int versions[] = {11000, 12000, 13000};
  cuuint64_t flags[] = {CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
  for (size_t n = 0; n < sizeof(names) / sizeof(*names); n++)
    for (size_t v = 0; v < 3; v++)
      for (size_t f = 0; f < 3; f++) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st;
        CUresult r = gpa(names[n], &p, versions[v], flags[f], &st);
        const char *match = NULL;
        char sym[128];
        for (size_t s = 0; s < sizeof(suffixes) / sizeof(*suffixes) && r == CUDA_SUCCESS && p; s++) {
          snprintf(sym, sizeof(sym), "%s%s", names[n], suffixes[s]);
          if (dlsym(lib, sym) == p) { match = sym; break; }
        }
        if (r != CUDA_SUCCESS || !p) printf("%s %d %llu -> error %d status %d\n", names[n], versions[v],
                                            (unsigned long long)flags[f], r, st);
        else if (match) printf("%s %d %llu -> %s\n", names[n], versions[v], (unsigned long long)flags[f], match);
        else {
          Dl_info info;
          dladdr(p, &info);
          printf("%s %d %llu -> internal %p in %s\n", names[n], versions[v], (unsigned long long)flags[f], p,
                 info.dli_fname ? info.dli_fname : "?");
        }
      }
  return 0;
}
