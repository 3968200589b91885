/* A stand-in libnccl for testing libphos.so's interposition without a GPU.
 * A communicator here points at two ints: this process's rank and the rank
 * count. */
#include <nccl.h>

unsigned long long fake_nccl_calls;

static ncclResult_t counted(void) {
  __atomic_add_fetch(&fake_nccl_calls, 1, __ATOMIC_RELAXED);
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) { *rank = ((const int *)comm)[0]; return ncclSuccess; }
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) { *count = ((const int *)comm)[1]; return ncclSuccess; }

ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) {
  (void)s; (void)r; (void)n; (void)t; (void)op; (void)c; (void)st; return counted();
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) {
  (void)s; (void)r; (void)n; (void)t; (void)root; (void)c; (void)st; return counted();
}
ncclResult_t ncclReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t c,
                        cudaStream_t st) {
  (void)s; (void)r; (void)n; (void)t; (void)op; (void)root; (void)c; (void)st; return counted();
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  (void)s; (void)r; (void)n; (void)t; (void)c; (void)st; return counted();
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t st) {
  (void)s; (void)r; (void)n; (void)t; (void)op; (void)c; (void)st; return counted();
}
ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  (void)s; (void)n; (void)t; (void)peer; (void)c; (void)st; return counted();
}
ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  (void)r; (void)n; (void)t; (void)peer; (void)c; (void)st; return counted();
}

/* Communicators: two ints each (rank, rank count), no bootstrap. */
#include <stdlib.h>
#include <string.h>
static ncclComm_t fake_comm(int rank, int nranks) {
  int *c = malloc(2 * sizeof(int));
  c[0] = rank;
  c[1] = nranks;
  return (ncclComm_t)c;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) { memset(id, 0, sizeof(*id)); return ncclSuccess; }
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  (void)id; *comm = fake_comm(rank, nranks); return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
  (void)id; (void)config; *comm = fake_comm(rank, nranks); return ncclSuccess;
}
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  (void)devlist;
  for (int i = 0; i < ndev; i++) comms[i] = fake_comm(i, ndev);
  return ncclSuccess;
}
/* The new communicator: rank `key` of 2, or none for NCCL_SPLIT_NOCOLOR. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  (void)comm; (void)config;
  *newcomm = color == NCCL_SPLIT_NOCOLOR ? NULL : fake_comm(key, 2);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { free(comm); return ncclSuccess; }
ncclResult_t ncclCommAbort(ncclComm_t comm) { free(comm); return ncclSuccess; }
