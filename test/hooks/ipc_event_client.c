/* An interprocess event recorded again and again for another process to
 * wait on each time, for the test ipc_event.sh, on the fake libcuda with
 * real memory (FAKE_CUDA_MEMORY=1), whose host functions (cuLaunchHostFunc)
 * stay pending on a thread of its own until they return: the "work" here,
 * each sleeping WORK_MS and then writing its round's value into memory
 * shared through phos's IPC handle.
 *
 * The exporter allocates S, creates an interprocess event E, takes both IPC
 * handles (through cuGetProcAddress, as cudart does) and starts the opener
 * (itself again, exec'd, with two pipes). Then, each round k:
 *   1. the exporter queues work that writes S[0] = k, records E after it
 *      (cuEventRecord), and only then tells the opener "k" through the pipe;
 *      the opener waits on its event (cuStreamWaitEvent) and reads S[0];
 *   2. the other way: the opener queues work that writes S[1] = 100 + k,
 *      records its event (cuEventRecordWithFlags), tells the exporter, who
 *      waits on E and reads S[1].
 * Each side prints "ROLE round K record-waited yes|no read V ok|bad:WHAT":
 * whether the work was done when its record returned, what the other side
 * read once it had waited. Then the exporter has E recorded by a graph,
 * which records only when it runs: into a stream capture, and as an event
 * record node; phos refuses both at the call ("graph records refused").
 * Then a thread of its own begins a capture in global mode (torch's
 * default) while the exporter records E on the legacy stream, which is not
 * capturing: "record beside a global capture R end E" (the record's wait
 * is made in relaxed mode: it succeeds and the capture stays valid).
 * Last it destroys E,
 * creates a plain event (the fake hands out E's handle again) and records
 * it after work: "plain record-waited yes|no" (no: phos forgot E at its
 * destroy); the same for an interprocess event destroyed through the
 * unversioned cuEventDestroy (cuGetProcAddress below 4000), and for one
 * destroyed with its context (cuCtxDestroy). Exit status 0 when every line
 * says ok.
 *
 * usage: ipc_event_client | ipc_event_client --open MEMHEX EVENTHEX RFD WFD */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc_calls.h"

#define ROUNDS 2
#define WORK_MS 400
#define SHARED_BYTES (2u << 20)

static void must(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return;
  fprintf(stderr, "%s failed: %d\n", what, (int)r);
  exit(1);
}

/* One piece of pending work: sleeps, then writes `value` at `where` (the
 * fake's device memory is the process's own) and says it is done. */
struct work {
  CUdeviceptr where;
  uint32_t value;
  int done;
};
static void slow_write(void *arg) {
  struct work *w = arg;
  usleep(WORK_MS * 1000);
  *(volatile uint32_t *)(uintptr_t)w->where = w->value;
  __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
}
static void queue_work(struct work *w, CUdeviceptr where, uint32_t value) {
  w->where = where;
  w->value = value;
  w->done = 0;
  must(cuLaunchHostFunc(NULL, slow_write, w), "cuLaunchHostFunc");
}
static int done(const struct work *w) { return __atomic_load_n(&w->done, __ATOMIC_ACQUIRE); }

/* What a wait on `ev` lets this process see at S[word], read by the driver's copy. */
static uint32_t wait_and_read(CUevent ev, CUdeviceptr s, int word) {
  uint32_t v = 0;
  must(cuStreamWaitEvent(NULL, ev, 0), "cuStreamWaitEvent");
  must(cuMemcpyDtoH(&v, s + 4 * word, 4), "cuMemcpyDtoH");
  return v;
}

static void tell(int fd, uint32_t v) {
  if (write(fd, &v, sizeof(v)) != sizeof(v)) exit(1);
}
static uint32_t hear(int fd) {
  uint32_t v;
  if (read(fd, &v, sizeof(v)) != sizeof(v)) exit(1);
  return v;
}

static void to_hex(const char *bytes, char *out) {
  for (size_t i = 0; i < 64; i++) sprintf(out + 2 * i, "%02x", (unsigned char)bytes[i]);
}
static void from_hex(const char *hex, char *bytes) {
  if (strlen(hex) != 128) exit(2);
  for (size_t i = 0; i < 64; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) exit(2);
    bytes[i] = (char)v;
  }
}

/* ROLE round K record-waited yes|no read V ok|bad:WHAT */
static int report(const char *role, uint32_t k, int waited, uint32_t read, uint32_t want) {
  const char *bad = !waited ? "the record returned before the work before it was done"
                            : read != want ? "the other process read what was there before the work" : NULL;
  printf("%s round %u record-waited %s read %u %s%s\n", role, k, waited ? "yes" : "no", read, bad ? "bad:" : "ok",
         bad ? bad : "");
  fflush(stdout);
  return bad ? 1 : 0;
}

/* A capture in global mode on a thread of its own, begun and held until
 * told to end (another thread of the program recording meanwhile). */
struct capture {
  CUstream stream;
  int begun, end;
  CUresult began, ended;
  pthread_mutex_t mu;
  pthread_cond_t cv;
};
static void *capture_thread(void *arg) {
  struct capture *c = arg;
  CUgraph graph;
  cuCtxSetCurrent((CUcontext)1);
  c->began = cuStreamBeginCapture(c->stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
  pthread_mutex_lock(&c->mu);
  c->begun = 1;
  pthread_cond_broadcast(&c->cv);
  while (!c->end) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  c->ended = cuStreamEndCapture(c->stream, &graph);
  return NULL;
}
static int record_beside_capture(CUevent ev) {
  struct capture c = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  pthread_t t;
  must(cuStreamCreate(&c.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  if (pthread_create(&t, NULL, capture_thread, &c) != 0) exit(2);
  pthread_mutex_lock(&c.mu);
  while (!c.begun) pthread_cond_wait(&c.cv, &c.mu);
  pthread_mutex_unlock(&c.mu);
  CUresult recorded = cuEventRecord(ev, NULL);
  pthread_mutex_lock(&c.mu);
  c.end = 1;
  pthread_cond_broadcast(&c.cv);
  pthread_mutex_unlock(&c.mu);
  pthread_join(t, NULL);
  const char *bad = c.began != CUDA_SUCCESS        ? "the capture did not begin"
                    : recorded != CUDA_SUCCESS     ? "the record failed"
                    : c.ended != CUDA_SUCCESS      ? "the capture was invalidated"
                                                   : NULL;
  printf("record beside a global capture %d end %d %s%s\n", (int)recorded, (int)c.ended, bad ? "bad:" : "ok",
         bad ? bad : "");
  return bad ? 1 : 0;
}

/* `ev`, interprocess, is destroyed by `destroy` (WHAT names it); a plain
 * event made next gets its handle again: its record must not wait. */
static int plain_after(const char *what, CUevent ev, CUdeviceptr s, int word, void (*destroy)(CUevent)) {
  CUevent plain;
  destroy(ev);
  must(cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  struct work w;
  queue_work(&w, s + 4 * word, 1);
  must(cuEventRecord(plain, NULL), "cuEventRecord");
  int waited = done(&w);
  const char *bad = plain != ev ? "the fake driver did not hand out the destroyed event's handle again"
                    : waited    ? "a plain event's record waited (the interprocess event was not forgotten)"
                                : NULL;
  printf("plain%s record-waited %s %s%s\n", what, waited ? "yes" : "no", bad ? "bad:" : "ok", bad ? bad : "");
  must(cuEventSynchronize(plain), "cuEventSynchronize");
  must(cuEventDestroy(plain), "cuEventDestroy");
  return bad ? 1 : 0;
}
static void destroy_v2(CUevent ev) { must(cuEventDestroy(ev), "cuEventDestroy"); }
static void destroy_v1(CUevent ev) {
  CUresult (*v1)(CUevent) = NULL;
  must(cuGetProcAddress("cuEventDestroy", (void **)&v1, 3020, 0, NULL), "cuGetProcAddress(cuEventDestroy, 3020)");
  must(v1(ev), "cuEventDestroy (unversioned)");
}
static void destroy_context(CUevent ev) {
  (void)ev;
  must(cuCtxDestroy((CUcontext)1), "cuCtxDestroy");
  cuCtxSetCurrent((CUcontext)1);
}
static CUevent interprocess_event(void) {
  CUevent ev;
  must(cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  return ev;
}

static int opener(const char *mem_hex, const char *event_hex, int rfd, int wfd) {
  CUipcMemHandle mh;
  CUipcEventHandle eh;
  from_hex(mem_hex, mh.reserved);
  from_hex(event_hex, eh.reserved);
  CUevent ev;
  CUdeviceptr s = 0;
  must(((OpenEventHandle)proc("cuIpcOpenEventHandle"))(&ev, eh), "cuIpcOpenEventHandle");
  must(((OpenHandle)proc("cuIpcOpenMemHandle"))(&s, mh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle");
  int failed = 0;
  for (uint32_t k = 1; k <= ROUNDS; k++) {
    if (hear(rfd) != k) return 1;
    tell(wfd, wait_and_read(ev, s, 0));
    struct work w;
    queue_work(&w, s + 4, 100 + k);
    must(cuEventRecordWithFlags(ev, NULL, CU_EVENT_RECORD_DEFAULT), "cuEventRecordWithFlags");
    int waited = done(&w);
    tell(wfd, k);
    failed |= report("opener", k, waited, hear(rfd), 100 + k);
    cuStreamSynchronize(NULL);
  }
  return failed;
}

int main(int argc, char **argv) {
  cuInit(0);
  cuCtxSetCurrent((CUcontext)1);
  if (argc == 6 && !strcmp(argv[1], "--open")) return opener(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
  CUdeviceptr s = 0;
  must(cuMemAlloc(&s, SHARED_BYTES), "cuMemAlloc");
  must(cuMemsetD32(s, 0, SHARED_BYTES / 4), "cuMemsetD32");
  CUevent ev;
  CUipcMemHandle mh;
  CUipcEventHandle eh;
  must(cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  must(((GetEventHandle)proc("cuIpcGetEventHandle"))(&eh, ev), "cuIpcGetEventHandle");
  must(((GetHandle)proc("cuIpcGetMemHandle"))(&mh, s), "cuIpcGetMemHandle");
  char mem_hex[129], event_hex[129], rfd[16], wfd[16];
  to_hex(mh.reserved, mem_hex);
  to_hex(eh.reserved, event_hex);
  int down[2], up[2]; /* exporter -> opener, opener -> exporter */
  if (pipe(down) || pipe(up)) return 2;
  pid_t child = fork();
  if (child == 0) {
    snprintf(rfd, sizeof(rfd), "%d", down[0]);
    snprintf(wfd, sizeof(wfd), "%d", up[1]);
    execl("/proc/self/exe", argv[0], "--open", mem_hex, event_hex, rfd, wfd, (char *)NULL);
    _exit(127);
  }
  int failed = 0;
  for (uint32_t k = 1; k <= ROUNDS; k++) {
    struct work w;
    queue_work(&w, s, k);
    must(cuEventRecord(ev, NULL), "cuEventRecord");
    int waited = done(&w);
    tell(down[1], k);
    failed |= report("exporter", k, waited, hear(up[0]), k);
    if (hear(up[0]) != k) return 1;
    tell(down[1], wait_and_read(ev, s, 1));
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    printf("opener bad:its exit status %d\n", status);
    failed = 1;
  }
  /* Recorded by a graph later, no call could complete: refused. */
  CUstream captured;
  CUgraph graph;
  CUgraphNode node;
  must(cuStreamCreate(&captured, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  must(cuStreamBeginCapture(captured, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture");
  CUresult into_capture = cuEventRecord(ev, captured);
  must(cuStreamEndCapture(captured, &graph), "cuStreamEndCapture");
  CUresult as_node = cuGraphAddEventRecordNode(&node, graph, NULL, 0, ev);
  int refused = into_capture == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && as_node == CUDA_ERROR_NOT_SUPPORTED;
  printf("graph records refused capture %d node %d %s\n", (int)into_capture, (int)as_node,
         refused ? "ok" : "bad:not refused");
  failed |= !refused;
  failed |= record_beside_capture(ev);
  /* Destroyed, E's handle comes back for a plain event: its record must not wait. */
  failed |= plain_after("", ev, s, 2, destroy_v2);
  failed |= plain_after(" after an unversioned destroy", interprocess_event(), s, 3, destroy_v1);
  failed |= plain_after(" after its context's destroy", interprocess_event(), s, 4, destroy_context);
  return failed ? 1 : 0;
}
