/* A workload of the end-to-end tests that uses NCCL (the fake libnccl of
 * test/hooks): a communicator of one rank made from a unique id, one split
 * from it, and a pair of one process (ncclCommInitAll), each with an
 * all-reduce every 10 ms, some inside a group. It writes
 * "TOKEN COUNTER MADE" to STATE, MADE the communicators the library made so
 * far: a checkpoint that releases and makes them again adds 4 (the same
 * handles go on working: the fake fails a call on one it destroyed, and
 * this program then exits 3). ARGS are ignored (the e2e workload contract).
 *
 * usage: nccl_rank_client STATE [ARGS...] */
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

extern unsigned long long fake_nccl_created;

static void write_state(const char *path, uint64_t token, uint64_t counter) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) exit(2);
  fprintf(f, "%016llx %llu %llu\n", (unsigned long long)token, (unsigned long long)counter,
          __atomic_load_n(&fake_nccl_created, __ATOMIC_RELAXED));
  fclose(f);
  if (rename(tmp, path) != 0) exit(2);
}

static int all_reduce(ncclComm_t c) {
  return ncclAllReduce((void *)0x10000, (void *)0x20000, 16, ncclFloat32, ncclSum, c, (cudaStream_t)0) == ncclSuccess;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  ncclUniqueId id;
  ncclComm_t alone, split, pair[2];
  int devs[2] = {0, 1};
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&alone, 1, id, 0) != ncclSuccess ||
      ncclCommSplit(alone, 0, 0, &split, NULL) != ncclSuccess || ncclCommInitAll(pair, 2, devs) != ncclSuccess)
    return 3;
  for (uint64_t n = 1;; n++) {
    int ok = all_reduce(alone) && all_reduce(pair[0]) && all_reduce(pair[1]);
    if (n % 2) {
      ok = ok && ncclGroupStart() == ncclSuccess && all_reduce(split) && ncclGroupEnd() == ncclSuccess;
    } else {
      ok = ok && all_reduce(split);
    }
    ncclResult_t async = ncclSuccess;
    ok = ok && ncclCommGetAsyncError(alone, &async) == ncclSuccess && async == ncclSuccess;
    if (!ok) {
      fprintf(stderr, "nccl call failed at %llu\n", (unsigned long long)n);
      return 3;
    }
    write_state(argv[1], token, n);
    usleep(10000);
  }
}
