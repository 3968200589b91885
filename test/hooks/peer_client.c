/* Peer access against the fake libcuda: device 0 is granted access to
 * device 1's memory, then loses it; phos's mappings on device 1 must follow
 * (the fake logs every cuMemSetAccess). Prints each allocation's name and
 * address, so the test can read the log.
 *
 * usage: peer_client [wait]   wait: after the grant, print "ready PID" and sleep
 *                             (a test maps the memory back meanwhile) */
#include <cuda.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void fake_mark(const char *what);

static CUcontext ctx(int dev) { return (CUcontext)(unsigned long)(dev + 1); }

static CUdeviceptr alloc(const char *name, int dev, size_t size) {
  CUdeviceptr p = 0;
  cuCtxSetCurrent(ctx(dev));
  if (cuMemAlloc(&p, size) != CUDA_SUCCESS) printf("%s failed\n", name);
  printf("%s 0x%llx\n", name, (unsigned long long)p);
  return p;
}

int main(int argc, char **argv) {
  int wait = argc > 1 && !strcmp(argv[1], "wait");
  alloc("own1", 1, 4u << 20);
  alloc("small1", 1, 256);
  alloc("own0", 0, 4u << 20);
  fake_mark("enable");
  cuCtxSetCurrent(ctx(0));
  if (cuCtxEnablePeerAccess(ctx(1), 0) != CUDA_SUCCESS) printf("enable failed\n");
  fake_mark("allocate");
  alloc("later1", 1, 4u << 20);
  if (wait) {
    fake_mark("ready");
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    sleep(60);
    return 0;
  }
  fake_mark("disable");
  cuCtxSetCurrent(ctx(0));
  if (cuCtxDisablePeerAccess(ctx(1)) != CUDA_SUCCESS) printf("disable failed\n");
  fake_mark("allocate");
  alloc("last1", 1, 4u << 20);
  return 0;
}
