/* Launches against the fake libcuda whose read and write sets libphos.so
 * speculates (test: speculation.sh, which reads the stats file):
 *   saxpy(float const* x, float* y, float a, int n) twice: x read, y read and written;
 *   closure_kernel(int n, Closure c) (extern "C"), c = {int tag; const float* in; float* out}:
 *     without a signature database every word of c may be a written pointer,
 *     with one only `out` is written;
 *   noinfo: the driver gives no layout: kernelParams make the set unknown,
 *     a packed (extra) argument buffer is scanned whole;
 *   one device-to-device copy: an exact set.
 *
 * With PHOS_TEST_FATBIN=FILE the module is that fatbin (nvcc's, holding
 * saxpy), so the layout is checked against the cubin's records; with
 * PHOS_TEST_PTX=FILE it is that PTX text, whose kernels PHOS_VALIDATE=1
 * runs as twins.
 *
 * usage: speculation_client [wait]   wait: print "ready" before the launches
 *                                    and "launched" after them, and wait for
 *                                    a line on stdin after each
 *        speculation_client wait again  then saxpy once more, "again", a line
 *        speculation_client reuse    saxpy once, its module unloaded, then
 *                                    closure_kernel of a new module under
 *                                    saxpy's old CUfunction handle */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static CUdeviceptr alloc(const char *name, size_t size) {
  CUdeviceptr p = 0;
  if (cuMemAlloc(&p, size) != CUDA_SUCCESS) printf("%s failed\n", name);
  printf("%s 0x%llx\n", name, (unsigned long long)p);
  return p;
}

extern void *fake_next_handle;  /* fake_libcuda_module.c */

static int reuse(void) {
  int bad = 0;
  CUdeviceptr x = alloc("x", 1u << 20), y = alloc("y", 1u << 20), in = alloc("in", 256), out = alloc("out", 4096);
  static unsigned char header[16] = {0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0};
  CUmodule m1, m2;
  CUfunction saxpy, closure;
  bad |= cuModuleLoadData(&m1, header);
  bad |= cuModuleGetFunction(&saxpy, m1, "_Z5saxpyPKfPffi");
  float a = 2.0f;
  int n = 1000;
  void *saxpy_args[] = {&x, &y, &a, &n};
  bad |= cuLaunchKernel(saxpy, 1, 1, 1, 32, 1, 1, 0, NULL, saxpy_args, NULL);
  bad |= cuModuleUnload(m1);
  bad |= cuModuleLoadData(&m2, header);
  fake_next_handle = saxpy;
  bad |= cuModuleGetFunction(&closure, m2, "closure_kernel");
  if (closure != saxpy) printf("handle not reused\n");
  struct { int tag; CUdeviceptr in, out; } c = {7, in, out};
  void *closure_args[] = {&n, &c};
  bad |= cuLaunchKernel(closure, 1, 1, 1, 32, 1, 1, 0, NULL, closure_args, NULL);
  printf("calls failed %d\n", bad);
  return 0;
}

static int pause_for(const char *what) {
  printf("%s\n", what);
  fflush(stdout);
  char line[16];
  return fgets(line, sizeof(line), stdin) != NULL;
}

int main(int argc, char **argv) {
  int bad = 0;
  cuCtxSetCurrent((CUcontext)1);
  if (argc > 1 && !strcmp(argv[1], "reuse")) return reuse();
  CUdeviceptr x = alloc("x", 1u << 20), y = alloc("y", 1u << 20), in = alloc("in", 256), out = alloc("out", 4u << 20);
  static unsigned char header[16] = {0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0};
  static unsigned char fatbin[1 << 20];
  const void *image = header;
  const char *fatbin_path = getenv("PHOS_TEST_FATBIN"), *ptx_path = getenv("PHOS_TEST_PTX");
  const char *module_path = fatbin_path && *fatbin_path ? fatbin_path : ptx_path && *ptx_path ? ptx_path : NULL;
  if (module_path) {
    FILE *f = fopen(module_path, "rb");
    size_t n = f ? fread(fatbin, 1, sizeof(fatbin) - 1, f) : 0;
    if (!n) { printf("cannot read %s\n", module_path); return 2; }
    fclose(f);
    fatbin[n] = 0;  /* PTX is NUL-terminated text */
    image = fatbin;
  }
  CUmodule m;
  CUfunction saxpy, closure, noinfo;
  bad |= cuModuleLoadData(&m, image);
  bad |= cuModuleGetFunction(&saxpy, m, "_Z5saxpyPKfPffi");
  bad |= cuModuleGetFunction(&closure, m, "closure_kernel");
  bad |= cuModuleGetFunction(&noinfo, m, "noinfo");
  int wait = argc > 1 && !strcmp(argv[1], "wait");
  if (wait && !pause_for("ready")) return 3;

  CUdeviceptr xs = x + 16;
  float a = 2.0f;
  int n = 1000;
  void *saxpy_args[] = {&xs, &y, &a, &n};
  bad |= cuLaunchKernel(saxpy, 4, 1, 1, 256, 1, 1, 0, NULL, saxpy_args, NULL);
  bad |= cuLaunchKernel(saxpy, 4, 1, 1, 256, 1, 1, 0, NULL, saxpy_args, NULL);

  struct { int tag; CUdeviceptr in, out; } c = {7, in + 8, out + 4096};
  void *closure_args[] = {&n, &c};
  bad |= cuLaunchKernel(closure, 1, 1, 1, 32, 1, 1, 0, NULL, closure_args, NULL);

  void *noinfo_args[] = {&out};
  bad |= cuLaunchKernel(noinfo, 1, 1, 1, 32, 1, 1, 0, NULL, noinfo_args, NULL);
  unsigned long long packed[2] = {42, out + 64};
  size_t packed_size = sizeof(packed);
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &packed_size,
                   CU_LAUNCH_PARAM_END};
  bad |= cuLaunchKernel(noinfo, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, extra);

  bad |= cuMemcpyDtoD(out, x, 4096);
  printf("calls failed %d\n", bad);
  if (wait && !pause_for("launched")) return 3;
  if (wait && argc > 2 && !strcmp(argv[2], "again")) {
    bad |= cuLaunchKernel(saxpy, 4, 1, 1, 256, 1, 1, 0, NULL, saxpy_args, NULL);
    printf("calls failed %d\n", bad);
    if (!pause_for("again")) return 3;
  }
  return 0;
}
