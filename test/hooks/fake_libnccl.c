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
