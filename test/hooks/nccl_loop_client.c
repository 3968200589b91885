/* A rank of an NCCL job against the fake libnccl: one communicator made
 * from a unique id (rank 0 of 2), then a collective every millisecond, the
 * number issued so far written to STATE after each (renamed into place). */
#include <cuda.h>
#include <nccl.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  cuCtxSetCurrent((CUcontext)1);
  ncclUniqueId id;
  ncclComm_t comm;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 2, id, 0) != ncclSuccess) return 3;
  for (unsigned long long n = 1; n <= 200000; n++) {
    if (ncclAllReduce((void *)0x10000, (void *)0x20000, 16, ncclFloat32, ncclSum, comm, (cudaStream_t)0) !=
        ncclSuccess)
      return 4;
    /* Whole or not at all for a reader: written aside, renamed over it. */
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (f) {
      fprintf(f, "%llu\n", n);
      fclose(f);
      rename(tmp, argv[1]);
    }
    usleep(1000);
  }
  return 0;
}
