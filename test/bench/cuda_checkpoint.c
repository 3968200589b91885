/* cuda-checkpoint: the utility CRIU's own cuda plugin executes, written here
 * as a thin wrapper over the driver's checkpoint API so the benchmarks can run
 * CRIU + cuda plugin side by side with phos. Output follows what the plugin
 * parses: a tid for --get-restore-tid, a state word for --get-state.
 *
 *   cuda-checkpoint --get-restore-tid --pid N
 *   cuda-checkpoint --get-state --pid N
 *   cuda-checkpoint --action lock|checkpoint|restore|unlock --pid N [--timeout MS]
 *   cuda-checkpoint --action restore --pid N --gpu-pairs OLD=NEW[,OLD=NEW...]
 *   cuda-checkpoint -h
 * --gpu-pairs (UUIDs as nvidia-smi prints them) remaps GPUs at the restore
 * (CUcheckpointRestoreArgs.gpuPairs), to try the driver's remapping alone. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: cuda-checkpoint --action lock|checkpoint|restore|unlock --pid PID [--timeout MS]\n"
    "       cuda-checkpoint --action restore --pid PID --gpu-pairs OLD=NEW[,OLD=NEW...] (GPU UUIDs)\n"
    "       cuda-checkpoint --get-state --pid PID\n"
    "       cuda-checkpoint --get-restore-tid --pid PID\n"
    "Drives the CUDA driver's checkpoint API (cuCheckpointProcess*) on process PID.\n";

static void *driver(const char *name) {
  static void *lib;
  if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
  void *fn = lib ? dlsym(lib, name) : NULL;
  if (!fn) {
    fprintf(stderr, "cuda-checkpoint: %s not available: %s\n", name, lib ? "driver too old" : dlerror());
    exit(1);
  }
  return fn;
}

/* "GPU-8ea6f5b6-..." (or without "GPU-"): 16 bytes; 0 if it is not a UUID. */
static int parse_uuid(const char *s, size_t n, CUuuid *out) {
  if (n > 4 && !strncmp(s, "GPU-", 4)) s += 4, n -= 4;
  int got = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '-') continue;
    char hex[3] = {s[i], i + 1 < n ? s[i + 1] : 0, 0};
    char *end;
    long v = strtol(hex, &end, 16);
    if (got == 16 || end != hex + 2) return 0;
    out->bytes[got++] = (char)v;
    i++;
  }
  return got == 16;
}

/* "OLD=NEW,OLD=NEW": the pairs (at most 64); their count, or -1. */
static int parse_pairs(const char *arg, CUcheckpointGpuPair *pairs) {
  int n = 0;
  for (const char *p = arg; *p;) {
    const char *comma = strchr(p, ','), *end = comma ? comma : p + strlen(p);
    const char *eq = memchr(p, '=', (size_t)(end - p));
    if (!eq || n == 64 || !parse_uuid(p, (size_t)(eq - p), &pairs[n].oldUuid) ||
        !parse_uuid(eq + 1, (size_t)(end - eq - 1), &pairs[n].newUuid))
      return -1;
    n++;
    p = comma ? comma + 1 : end;
  }
  return n;
}

static int check(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return 0;
  const char *name = NULL;
  ((CUresult(*)(CUresult, const char **))driver("cuGetErrorName"))(r, &name);
  fprintf(stderr, "cuda-checkpoint: %s failed: %s\n", what, name ? name : "unknown error");
  return 1;
}

int main(int argc, char **argv) {
  const char *action = NULL, *pairs_arg = NULL;
  int pid = 0, get_state = 0, get_tid = 0;
  unsigned timeout_ms = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { fputs(usage, stdout); return 0; }
    else if (!strcmp(argv[i], "--action") && i + 1 < argc) action = argv[++i];
    else if (!strcmp(argv[i], "--pid") && i + 1 < argc) pid = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) timeout_ms = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--gpu-pairs") && i + 1 < argc) pairs_arg = argv[++i];
    else if (!strcmp(argv[i], "--get-state")) get_state = 1;
    else if (!strcmp(argv[i], "--get-restore-tid")) get_tid = 1;
    else { fprintf(stderr, "cuda-checkpoint: unknown argument %s\n%s", argv[i], usage); return 2; }
  }
  if (pid <= 0 || (!action && !get_state && !get_tid)) { fputs(usage, stderr); return 2; }
  if (check(((CUresult(*)(unsigned))driver("cuInit"))(0), "cuInit")) return 1;

  if (get_tid) {
    int tid = 0;
    if (check(((CUresult(*)(int, int *))driver("cuCheckpointProcessGetRestoreThreadId"))(pid, &tid), "get restore tid")) return 1;
    printf("%d\n", tid);
    return 0;
  }
  if (get_state) {
    CUprocessState st;
    if (check(((CUresult(*)(int, CUprocessState *))driver("cuCheckpointProcessGetState"))(pid, &st), "get state")) return 1;
    const char *names[] = {"running", "locked", "checkpointed", "failed"};
    printf("%s\n", st <= CU_PROCESS_STATE_FAILED ? names[st] : "unknown");
    return 0;
  }
  if (!strcmp(action, "lock")) {
    CUcheckpointLockArgs args;
    memset(&args, 0, sizeof(args));
    args.timeoutMs = timeout_ms;
    return check(((CUresult(*)(int, CUcheckpointLockArgs *))driver("cuCheckpointProcessLock"))(pid, &args), "lock");
  }
  if (!strcmp(action, "checkpoint")) {
    CUcheckpointCheckpointArgs args;
    memset(&args, 0, sizeof(args));
    return check(((CUresult(*)(int, CUcheckpointCheckpointArgs *))driver("cuCheckpointProcessCheckpoint"))(pid, &args), "checkpoint");
  }
  if (!strcmp(action, "restore")) {
    CUcheckpointRestoreArgs args;
    memset(&args, 0, sizeof(args));
    static CUcheckpointGpuPair pairs[64];
    if (pairs_arg) {
      int n = parse_pairs(pairs_arg, pairs);
      if (n <= 0) { fprintf(stderr, "cuda-checkpoint: --gpu-pairs %s: not OLD=NEW UUID pairs\n", pairs_arg); return 2; }
      args.gpuPairs = pairs;
      args.gpuPairsCount = (unsigned)n;
    }
    return check(((CUresult(*)(int, CUcheckpointRestoreArgs *))driver("cuCheckpointProcessRestore"))(pid, &args), "restore");
  }
  if (!strcmp(action, "unlock")) {
    CUcheckpointUnlockArgs args;
    memset(&args, 0, sizeof(args));
    return check(((CUresult(*)(int, CUcheckpointUnlockArgs *))driver("cuCheckpointProcessUnlock"))(pid, &args), "unlock");
  }
  fprintf(stderr, "cuda-checkpoint: unknown action %s\n%s", action, usage);
  return 2;
}
