/* A library that uses NCCL, opened by the test with RTLD_LOCAL as Python
 * opens extension modules: its libnccl is then outside the global scope,
 * where dlsym(RTLD_NEXT) does not look. */
#include <nccl.h>

int phos_nccl_user_run(void) {
  static int comm[2] = {1, 4}; /* rank 1 of 4 */
  ncclComm_t c = (ncclComm_t)comm;
  cudaStream_t s = (cudaStream_t)0x5;
  int bad = 0;
  bad |= ncclAllReduce((void *)0x10000, (void *)0x20000, 100, ncclFloat32, ncclSum, c, s);
  bad |= ncclBroadcast((void *)0x11000, (void *)0x21000, 10, ncclFloat64, 0, c, s);
  bad |= ncclReduce((void *)0x12000, (void *)0x22000, 10, ncclFloat64, ncclSum, 1, c, s);
  bad |= ncclAllGather((void *)0x13000, (void *)0x23000, 8, ncclBfloat16, c, s);
  bad |= ncclReduceScatter((void *)0x14000, (void *)0x24000, 8, ncclInt64, ncclSum, c, s);
  bad |= ncclSend((void *)0x15000, 3, ncclUint8, 0, c, s);
  bad |= ncclRecv((void *)0x25000, 3, ncclInt32, 0, c, s);
  return bad;
}

/* Communicators made and destroyed (two calls issued on the first): rank 1
 * of 4 from a unique id, two of
 * one process (ncclCommInitAll), a split of the first, a split that leaves
 * this rank out; one of the pair destroyed, and a third made and aborted.
 * Left: rank 1 of 4, rank 0 of 2 (one process), the split (rank 1 of 2). */
int phos_nccl_user_comms(void) {
  ncclUniqueId id;
  ncclComm_t a, pair[2], split, none, gone;
  int devs[2] = {0, 1};
  int bad = 0;
  bad |= ncclGetUniqueId(&id);
  bad |= ncclCommInitRank(&a, 4, id, 1);
  bad |= ncclCommInitAll(pair, 2, devs);
  bad |= ncclAllReduce((void *)0x10000, (void *)0x20000, 100, ncclFloat32, ncclSum, a, (cudaStream_t)0x5);
  bad |= ncclSend((void *)0x15000, 3, ncclUint8, 0, a, (cudaStream_t)0x5);
  bad |= ncclCommSplit(a, 0, 1, &split, NULL);
  bad |= ncclCommSplit(a, NCCL_SPLIT_NOCOLOR, 0, &none, NULL);
  bad |= ncclCommDestroy(pair[1]);
  bad |= ncclCommInitRank(&gone, 8, id, 3);
  bad |= ncclCommAbort(gone);
  return bad;
}

/* Rank RANK of 2 (from the fixed unique id) splits twice: rank 0 with a
 * color, rank 1 sitting the first split out (NCCL_SPLIT_NOCOLOR), then both
 * with one color. The second split is one communicator of both ranks: its
 * job id must be the same in both processes. */
int phos_nccl_user_late_split(int rank) {
  ncclUniqueId id;
  ncclComm_t c, first, late;
  int bad = 0;
  bad |= ncclGetUniqueId(&id);
  bad |= ncclCommInitRank(&c, 2, id, rank);
  bad |= ncclCommSplit(c, rank == 0 ? 3 : NCCL_SPLIT_NOCOLOR, rank, &first, NULL);
  bad |= ncclCommSplit(c, 4, rank, &late, NULL);
  return bad;
}
