/* The fake libcuda's events and the one kind of its stream work that takes
 * time: host functions (cuLaunchHostFunc), run in the order they were
 * queued on a thread of the fake's, as the driver runs them on one of its
 * own. All other work is done at its call (a copy too, even behind a host
 * function still queued: a test that reads what a host function wrote
 * waits for it first), so the host functions are the pending work of every
 * stream at once (one queue, whatever the stream). An event records how
 * many had been queued; it is complete once they have run; a synchronize
 * waits for them, and so does a stream's wait on an event, on the host
 * (the stream's later work runs at its call, after the wait). A
 * destroyed event's handle is the next one created, as the driver reuses
 * handles (a test sees that phos forgets what it knew of the old event). */
#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>

struct fake_event {
  unsigned long long ticket; /* host functions queued before its last record */
  struct fake_event *next_free;
  int live;
};
/* Every event made, for a context's destroy (which destroys its events). */
#define MAX_EVENTS 64
static struct fake_event *all_events[MAX_EVENTS];
static int event_count;

struct host_call {
  CUhostFn fn;
  void *data;
  struct host_call *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static struct host_call *head, *tail;
static unsigned long long queued, ran;
static int runner_started;
static struct fake_event *free_events;

static void *run_host_calls(void *unused) {
  (void)unused;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (!head) pthread_cond_wait(&changed, &mu);
    struct host_call *c = head;
    head = c->next;
    if (!head) tail = NULL;
    pthread_mutex_unlock(&mu);
    c->fn(c->data);
    free(c);
    pthread_mutex_lock(&mu);
    ran++;
    pthread_cond_broadcast(&changed);
  }
  return NULL;
}

CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data) {
  (void)s;
  struct host_call *c = calloc(1, sizeof(*c));
  if (!c || !fn) {
    free(c);
    return CUDA_ERROR_INVALID_VALUE;
  }
  c->fn = fn;
  c->data = data;
  pthread_mutex_lock(&mu);
  if (!runner_started) {
    pthread_t t;
    if (pthread_create(&t, NULL, run_host_calls, NULL) != 0) {
      pthread_mutex_unlock(&mu);
      free(c);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_detach(t);
    runner_started = 1;
  }
  if (tail) tail->next = c;
  else head = c;
  tail = c;
  queued++;
  pthread_cond_broadcast(&changed);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}

/* Until the host functions queued before `ticket` have run. */
static void wait_ran(unsigned long long ticket) {
  pthread_mutex_lock(&mu);
  while (ran < ticket) pthread_cond_wait(&changed, &mu);
  pthread_mutex_unlock(&mu);
}
void fake_wait_streams(void) { /* cuCtxSynchronize, cuStreamSynchronize (fake_libcuda_vmm.c) */
  pthread_mutex_lock(&mu);
  unsigned long long all = queued;
  pthread_mutex_unlock(&mu);
  wait_ran(all);
}
int fake_streams_busy(void) { /* cuStreamQuery */
  pthread_mutex_lock(&mu);
  int busy = ran < queued;
  pthread_mutex_unlock(&mu);
  return busy;
}

void fake_log_driver_ipc(const char *name); /* fake_libcuda_vmm.c */
CUresult cuEventCreate(CUevent *e, unsigned int flags) {
  if (flags & CU_EVENT_INTERPROCESS) fake_log_driver_ipc("cuEventCreate(CU_EVENT_INTERPROCESS)");
  pthread_mutex_lock(&mu);
  struct fake_event *ev = free_events;
  if (ev) free_events = ev->next_free;
  pthread_mutex_unlock(&mu);
  if (!ev) {
    if (event_count == MAX_EVENTS || !(ev = malloc(sizeof(*ev)))) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    all_events[event_count++] = ev;
    pthread_mutex_unlock(&mu);
  }
  ev->ticket = 0; /* never recorded: no work, complete */
  ev->next_free = NULL;
  ev->live = 1;
  *e = (CUevent)ev;
  return CUDA_SUCCESS;
}
/* protected: the fake cuGetProcAddress hands out its own (fake_libcuda.c) */
__attribute__((visibility("protected"))) CUresult cuEventRecord(CUevent e, CUstream s) {
  (void)s;
  pthread_mutex_lock(&mu);
  ((struct fake_event *)e)->ticket = queued;
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) {
  (void)flags;
  return cuEventRecord(e, s);
}
CUresult cuEventQuery(CUevent e) {
  pthread_mutex_lock(&mu);
  int done = ran >= ((struct fake_event *)e)->ticket;
  pthread_mutex_unlock(&mu);
  return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
int fake_capture_forbids_unsafe(void); /* fake_libcuda_vmm.c */
CUresult cuEventSynchronize(CUevent e) {
  if (fake_capture_forbids_unsafe()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  wait_ran(((struct fake_event *)e)->ticket);
  return CUDA_SUCCESS;
}
static void free_event_locked(struct fake_event *ev) {
  ev->live = 0;
  ev->next_free = free_events;
  free_events = ev;
}
static CUresult destroy_event(CUevent e) {
  struct fake_event *ev = (struct fake_event *)e;
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&mu);
  free_event_locked(ev);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(CUevent e) { return destroy_event(e); }
/* The unversioned export of CUDA < 4.0 (cuda.h names _v2 cuEventDestroy);
 * protected: the fake cuGetProcAddress hands out its own. */
__attribute__((visibility("protected"))) CUresult fake_cuEventDestroy_v1(CUevent e) __asm__("cuEventDestroy");
/* Not through cuEventDestroy_v2, which a preloaded library would answer. */
CUresult fake_cuEventDestroy_v1(CUevent e) { return destroy_event(e); }
/* One context: its destroy or reset destroys every event. */
static CUresult destroy_all_events(void) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < event_count; i++)
    if (all_events[i]->live) free_event_locked(all_events[i]);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuCtxDestroy_v2(CUcontext c) {
  (void)c;
  return destroy_all_events();
}
CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
  (void)d;
  return destroy_all_events();
}
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  (void)s; (void)flags;
  wait_ran(((struct fake_event *)e)->ticket);
  return CUDA_SUCCESS;
}
/* An event record node: accepted (the fake runs no graph). */
CUresult cuGraphAddEventRecordNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t n, CUevent e) {
  (void)graph; (void)deps; (void)n; (void)e;
  *node = (CUgraphNode)0x7;
  return CUDA_SUCCESS;
}
