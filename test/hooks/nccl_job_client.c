/* A multi-process NCCL job for the end-to-end tests, against the fake
 * libnccl: a launcher (as torchrun) draws a unique id and starts two ranks
 * (itself again, exec'd), each making a communicator of 2 ranks from that
 * id and issuing an all-reduce every 5 ms. Each rank writes
 * "COUNTER MADE ID" to STATE.rR (MADE: communicators the library made, ID:
 * the first 8 bytes of the unique id of the last, in hex); the launcher
 * writes "TOKEN COUNTER MADE0 MADE1 ID0 ID1" to STATE, COUNTER the lower
 * rank's count. A rank whose NCCL call fails exits 3.
 *
 * usage: nccl_job_client STATE [--bare-rank1|--register-rank1]   the
 *          launcher; with --bare-rank1, rank 1 runs without phos
 *          (PHOS_DISABLE=1); with --register-rank1, rank 1 registers a
 *          buffer with its communicator (ncclCommRegister)
 *        nccl_job_client STATE --rank R IDHEX [register]   a rank */
#include <cuda.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

extern unsigned long long fake_nccl_created, fake_nccl_last_id;

static void put(const char *path, const char *line) {
  char tmp[4200];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) exit(2);
  fputs(line, f);
  fclose(f);
  if (rename(tmp, path) != 0) exit(2);
}

static int rank_main(const char *state, int rank, const char *idhex, int register_buffer) {
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  for (int i = 0; i < 8 && idhex[2 * i] && idhex[2 * i + 1]; i++) {
    unsigned v;
    if (sscanf(idhex + 2 * i, "%2x", &v) != 1) return 2;
    ((unsigned char *)&id)[i] = (unsigned char)v;
  }
  // A rank holds device memory, as a real one does (criu's contexts are
  // made for the GPUs of such processes ahead of the hold).
  CUdeviceptr weights;
  cuInit(0);
  cuCtxSetCurrent((CUcontext)1);  /* the fake libcuda's one context */
  if (cuMemAlloc(&weights, 1 << 20) != CUDA_SUCCESS) return 4;
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return 3;
  void *registration;
  if (register_buffer && ncclCommRegister(comm, (void *)0x30000, 4096, &registration) != ncclSuccess) return 3;
  char path[4096], line[128];
  if (snprintf(path, sizeof(path), "%s.r%d", state, rank) >= (int)sizeof(path)) return 2;
  for (unsigned long long n = 1;; n++) {
    if (ncclAllReduce((void *)0x10000, (void *)0x20000, 16, ncclFloat32, ncclSum, comm, (cudaStream_t)0) != ncclSuccess) {
      fprintf(stderr, "rank %d: all-reduce %llu failed\n", rank, n);
      return 3;
    }
    snprintf(line, sizeof(line), "%llu %llu %016llx\n", n, __atomic_load_n(&fake_nccl_created, __ATOMIC_RELAXED),
             fake_nccl_last_id);
    put(path, line);
    usleep(5000);
  }
}

int main(int argc, char **argv) {
  if (argc >= 5 && !strcmp(argv[2], "--rank"))
    return rank_main(argv[1], atoi(argv[3]), argv[4], argc > 5 && !strcmp(argv[5], "register"));
  if (argc < 2) return 2;
  uint64_t token;
  ncclUniqueId id;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token) || ncclGetUniqueId(&id) != ncclSuccess) return 2;
  char idhex[17];
  for (int i = 0; i < 8; i++) snprintf(idhex + 2 * i, 3, "%02x", ((unsigned char *)&id)[i]);
  // The launcher starts CUDA and holds no device memory, as torchrun's
  // agent does (its ranks exec a fresh image).
  cuInit(0);
  int bare = argc > 2 && !strcmp(argv[2], "--bare-rank1");
  int registers = argc > 2 && !strcmp(argv[2], "--register-rank1");
  for (int r = 0; r < 2; r++) {
    if (fork() == 0) {
      if (r == 1 && bare) setenv("PHOS_DISABLE", "1", 1);
      char rank[8];
      snprintf(rank, sizeof(rank), "%d", r);
      execl("/proc/self/exe", argv[0], argv[1], "--rank", rank, idhex, r == 1 && registers ? "register" : NULL,
            (char *)NULL);
      _exit(127);
    }
  }
  char path[4096], line[256];
  for (;;) {
    unsigned long long n[2] = {0, 0}, made[2] = {0, 0}, ids[2] = {0, 0};
    int have = 0;
    for (int r = 0; r < 2; r++) {
      snprintf(path, sizeof(path), "%s.r%d", argv[1], r);
      FILE *f = fopen(path, "r");
      if (!f) continue;
      if (fscanf(f, "%llu %llu %llx", &n[r], &made[r], &ids[r]) == 3) have++;
      fclose(f);
    }
    if (have == 2) {
      snprintf(line, sizeof(line), "%016llx %llu %llu %llu %016llx %016llx\n", (unsigned long long)token,
               n[0] < n[1] ? n[0] : n[1], made[0], made[1], ids[0], ids[1]);
      put(argv[1], line);
    }
    usleep(5000);
  }
}
