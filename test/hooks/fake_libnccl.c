/* A stand-in libnccl for testing libphos.so's interposition without a GPU.
 * A communicator here points at two ints: this process's rank and the rank
 * count. The communicators it made and has not destroyed are kept: a call
 * on any other (one destroyed, or a handle that is not NCCL's) fails with
 * ncclInvalidArgument, as NCCL's own check of its magic makes it fail. */
#define _GNU_SOURCE
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

unsigned long long fake_nccl_calls;
/* Communicators made and destroyed so far (read by the tests' clients). */
unsigned long long fake_nccl_created, fake_nccl_destroyed;
/* The first 8 bytes of the unique id the last communicator was made from. */
unsigned long long fake_nccl_last_id;

#define FAKE_MAX_COMMS 64
static void *live[FAKE_MAX_COMMS];
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;

static void keep(void *c) {
  pthread_mutex_lock(&live_mu);
  for (int i = 0; i < FAKE_MAX_COMMS; i++)
    if (!live[i]) { live[i] = c; break; }
  fake_nccl_created++;
  pthread_mutex_unlock(&live_mu);
}
/* 1 where `c` is live; with `drop`, no longer. */
static int alive(const void *c, int drop) {
  int found = 0;
  pthread_mutex_lock(&live_mu);
  for (int i = 0; i < FAKE_MAX_COMMS; i++)
    if (c && live[i] == c) {
      found = 1;
      if (drop) { live[i] = 0; fake_nccl_destroyed++; }
      break;
    }
  pthread_mutex_unlock(&live_mu);
  return found;
}
/* The record test's communicators are the library's own static ints,
 * never made here: those (ranks below 8 of counts below 8, at addresses
 * not kept) are let through when FAKE_NCCL_STRICT is unset. */
static int usable(const void *c) {
  if (alive(c, 0)) return 1;
  return !getenv("FAKE_NCCL_STRICT");
}

static ncclResult_t counted(void) {
  __atomic_add_fetch(&fake_nccl_calls, 1, __ATOMIC_RELAXED);
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) { *rank = ((const int *)comm)[0]; return ncclSuccess; }
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) { *count = ((const int *)comm)[1]; return ncclSuccess; }

ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) {
  (void)s; (void)r; (void)n; (void)t; (void)op; (void)st;
  return usable(c) ? counted() : ncclInvalidArgument;
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

/* FAKE_NCCL_PROXY_POLL: each communicator has a thread that, like NCCL's
 * proxy service thread, sees its stop flag only between polls of 500 ms on
 * an idle fd; destroying or aborting the communicator joins it. */
#include <poll.h>
struct fake_proxy {
  const void *comm;
  pthread_t thread;
  int idle[2];
  int stop;
};
static struct fake_proxy proxies[FAKE_MAX_COMMS];

static void *proxy_loop(void *arg) {
  struct fake_proxy *p = arg;
  pthread_setname_np(pthread_self(), "NCCL Service  0");  /* as NCCL names its proxy thread */
  struct pollfd pfd = {p->idle[0], POLLIN, 0};
  while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) poll(&pfd, 1, 500);
  return NULL;
}
static void start_proxy(const void *comm) {
  if (!getenv("FAKE_NCCL_PROXY_POLL")) return;
  pthread_mutex_lock(&live_mu);
  for (int i = 0; i < FAKE_MAX_COMMS; i++)
    if (!proxies[i].comm && pipe(proxies[i].idle) == 0) {
      proxies[i].comm = comm;
      proxies[i].stop = 0;
      pthread_create(&proxies[i].thread, NULL, proxy_loop, &proxies[i]);
      break;
    }
  pthread_mutex_unlock(&live_mu);
}
static void stop_proxy(const void *comm) {
  struct fake_proxy *p = NULL;
  pthread_mutex_lock(&live_mu);
  for (int i = 0; i < FAKE_MAX_COMMS; i++)
    if (proxies[i].comm == comm) p = &proxies[i];
  pthread_mutex_unlock(&live_mu);
  if (!p) return;
  __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
  pthread_join(p->thread, NULL);
  close(p->idle[0]);
  close(p->idle[1]);
  pthread_mutex_lock(&live_mu);
  p->comm = NULL;
  pthread_mutex_unlock(&live_mu);
}

/* Communicators: two ints each (rank, rank count), no bootstrap. */
static ncclComm_t fake_comm(int rank, int nranks) {
  int *c = malloc(2 * sizeof(int));
  c[0] = rank;
  c[1] = nranks;
  keep(c);
  start_proxy(c);
  return (ncclComm_t)c;
}
/* All zeros (every process of a test agrees on it without talking), or
 * random bytes with FAKE_NCCL_RANDOM_IDS set (as NCCL's own). */
#include <sys/random.h>
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof(*id));
  if (getenv("FAKE_NCCL_RANDOM_IDS") && getrandom(id, 8, 0) != 8) return ncclSystemError;
  return ncclSuccess;
}
/* FAKE_NCCL_INIT_MS: each creation from a unique id takes that long (a
 * test sees a rebuild in progress). FAKE_NCCL_INIT_THREAD=1: it starts a
 * thread and waits for it, as NCCL's starts its proxy threads. */
#include <unistd.h>
static void *init_thread(void *arg) { return arg; }
static void note_id(const ncclUniqueId *id) {
  memcpy(&fake_nccl_last_id, id, sizeof(fake_nccl_last_id));
  const char *ms = getenv("FAKE_NCCL_INIT_MS");
  if (ms) usleep((useconds_t)atoi(ms) * 1000);
  const char *thread = getenv("FAKE_NCCL_INIT_THREAD");
  pthread_t t;
  if (thread && *thread == '1' && pthread_create(&t, NULL, init_thread, NULL) == 0) pthread_join(t, NULL);
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  note_id(&id); *comm = fake_comm(rank, nranks); return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
  (void)config; note_id(&id); *comm = fake_comm(rank, nranks); return ncclSuccess;
}
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  (void)devlist;
  for (int i = 0; i < ndev; i++) comms[i] = fake_comm(i, ndev);
  return ncclSuccess;
}
/* The new communicator: rank `key` of 2 (of 1, split from one of 1), or
 * none for NCCL_SPLIT_NOCOLOR. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  (void)config;
  if (!usable(comm)) return ncclInvalidArgument;
  *newcomm = color == NCCL_SPLIT_NOCOLOR ? NULL : fake_comm(key, ((const int *)comm)[1] == 1 ? 1 : 2);
  return ncclSuccess;
}
static ncclResult_t end(ncclComm_t comm) {
  if (!alive(comm, 1)) return ncclInvalidArgument;
  stop_proxy(comm);
  free(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { return end(comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return end(comm); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
  *error = ncclSuccess;
  return usable(comm) ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
  (void)buff; (void)size;
  *handle = (void *)0x1;
  return usable(comm) ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
  (void)handle;
  return usable(comm) ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "fake error"; }
