/* Two processes sharing device memory through CUDA IPC, for the e2e test
 * ipc_criu.sh, on the fake libcuda with real memory (FAKE_CUDA_MEMORY=1).
 * The IPC calls are taken through cuGetProcAddress, as cudart's cudaIpc*
 * take them. Device memory is only read and written through the driver's
 * copies (the fake's memory is the process's, but a dump takes it away
 * while the process still runs: only CUDA calls wait at phos's gate).
 *
 * The owner allocates S (4 MiB, shared) and A (its own), fills S past its
 * first 64 bytes with a pattern, gets S's IPC handle, writes it in hex to
 * STATE.handle, records an interprocess event after the fill and gets its
 * IPC handle (as torch.multiprocessing sends one with each CUDA tensor),
 * and starts the importer (itself again, exec'd: its child,
 * in the dumped tree). The importer allocates B (its own), opens the
 * event's handle and waits on it, opens the memory handle, checks the pattern, and from then on echoes: whenever S[0] (the
 * owner's count) differs from S[1], it sets S[1] = S[0], and checks the
 * pattern; it writes "COUNT ok|bad:WHAT" to STATE.importer.
 * The owner, every 10 ms, sets S[0] = n and waits (5 s at most) until the
 * importer's echo S[1] == n: only one memory seen by both gets it. It
 * writes "TOKEN n ok|bad:WHAT PEER" to STATE (PEER: the importer's pid).
 *
 * An outsider (--outsider HEX) opens the handle from another tree, prints
 * "opened", and closes it at SIGTERM, then exits.
 *
 * usage: ipc_client STATE | ipc_client STATE --import HEX EVENTHEX | ipc_client STATE --outsider HEX */
#include <cuda.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "../e2e/state_file.h"
#include "ipc_calls.h"

#define SHARED_BYTES (4u << 20)
#define PATTERN_AT 16 /* words: S[0..15] are the counters */

static uint32_t pattern(size_t i) { return (uint32_t)(i * 2654435761u) ^ 0x5eed; }

static uint32_t get(CUdeviceptr s, size_t word) {
  uint32_t v = 0;
  if (cuMemcpyDtoH(&v, s + 4 * word, 4) != CUDA_SUCCESS) exit(1);
  return v;
}
static void set(CUdeviceptr s, size_t word, uint32_t v) {
  if (cuMemcpyHtoD(s + 4 * word, &v, 4) != CUDA_SUCCESS) exit(1);
}

static const char *check_pattern(CUdeviceptr s) {
  for (size_t i = PATTERN_AT; i < SHARED_BYTES / 4; i += 9973)
    if (get(s, i) != pattern(i)) return "pattern";
  return NULL;
}

static void to_hex(const CUipcMemHandle *h, char *out) {
  for (size_t i = 0; i < sizeof(h->reserved); i++) sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static int from_hex(const char *hex, CUipcMemHandle *h) {
  if (strlen(hex) != 2 * sizeof(h->reserved)) return -1;
  for (size_t i = 0; i < sizeof(h->reserved); i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
    h->reserved[i] = (char)v;
  }
  return 0;
}

static CUdeviceptr open_shared(const char *hex) {
  CUipcMemHandle h;
  CUdeviceptr p = 0;
  if (from_hex(hex, &h) != 0) exit(2);
  CUresult r = ((OpenHandle)proc("cuIpcOpenMemHandle"))(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuIpcOpenMemHandle failed: %d\n", (int)r);
    exit(1);
  }
  return p;
}

__attribute__((noreturn)) static void importer(const char *state, const char *hex, const char *event_hex) {
  char path[4000], line[128];
  snprintf(path, sizeof(path), "%s.importer", state);
  /* B: memory of its own, as any rank has (IPC_IMPORTER_OWN=0: none, a
   * process whose only device memory is the owner's) */
  const char *own = getenv("IPC_IMPORTER_OWN");
  if (!own || strcmp(own, "0")) alloc(4u << 20);
  CUipcEventHandle eh;
  CUevent ev;
  if (from_hex(event_hex, (CUipcMemHandle *)&eh) != 0 ||
      ((OpenEventHandle)proc("cuIpcOpenEventHandle"))(&ev, eh) != CUDA_SUCCESS || cuEventSynchronize(ev) != CUDA_SUCCESS) {
    fprintf(stderr, "cuIpcOpenEventHandle failed\n");
    exit(1);
  }
  CUdeviceptr s = open_shared(hex);
  const char *bad = check_pattern(s);
  for (uint64_t n = 1;; n++) {
    uint32_t c = get(s, 0);
    if (c != get(s, 1)) {
      if (!bad) bad = check_pattern(s);
      set(s, 1, c);
    }
    if (n % 100 == 0) {
      snprintf(line, sizeof(line), "%llu %s%s\n", (unsigned long long)n, bad ? "bad:" : "ok", bad ? bad : "");
      write_state_line(path, line);
    }
    usleep(1000);
  }
}

static volatile sig_atomic_t g_stop;
static void on_term(int sig) { (void)sig; g_stop = 1; }

static int outsider(const char *hex) {
  signal(SIGTERM, on_term);
  CUdeviceptr p = open_shared(hex);
  printf("opened\n");
  fflush(stdout);
  while (!g_stop) usleep(10000);
  CUresult r = ((CloseHandle)proc("cuIpcCloseMemHandle"))(p);
  printf("closed %d\n", (int)r);
  return r == CUDA_SUCCESS ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  cuInit(0);
  cuCtxSetCurrent((CUcontext)1);
  if (argc == 5 && !strcmp(argv[2], "--import")) importer(argv[1], argv[3], argv[4]);
  if (argc == 4 && !strcmp(argv[2], "--outsider")) return outsider(argv[3]);
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  CUdeviceptr sp = alloc(SHARED_BYTES);
  alloc(4u << 20); /* A */
  static uint32_t fill[SHARED_BYTES / 4];
  for (size_t i = PATTERN_AT; i < SHARED_BYTES / 4; i++) fill[i] = pattern(i);
  if (cuMemcpyHtoD(sp, fill, SHARED_BYTES) != CUDA_SUCCESS) return 1;
  CUipcMemHandle h;
  if (((GetHandle)proc("cuIpcGetMemHandle"))(&h, sp) != CUDA_SUCCESS) {
    fprintf(stderr, "cuIpcGetMemHandle failed\n");
    return 1;
  }
  char hex[2 * sizeof(h.reserved) + 1], event_hex[2 * sizeof(h.reserved) + 1], path[4000], line[256];
  to_hex(&h, hex);
  CUevent ev;
  CUipcEventHandle eh;
  if (cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
      cuEventRecord(ev, NULL) != CUDA_SUCCESS ||
      ((GetEventHandle)proc("cuIpcGetEventHandle"))(&eh, ev) != CUDA_SUCCESS) {
    fprintf(stderr, "cuIpcGetEventHandle failed\n");
    return 1;
  }
  to_hex((CUipcMemHandle *)&eh, event_hex);
  snprintf(path, sizeof(path), "%s.handle", argv[1]);
  write_state_line(path, hex);
  pid_t child = fork();
  if (child == 0) {
    execl("/proc/self/exe", argv[0], argv[1], "--import", hex, event_hex, (char *)NULL);
    _exit(127);
  }
  const char *bad = NULL;
  for (uint32_t n = 1;; n++) {
    set(sp, 0, n);
    int waited = 0;
    while (get(sp, 1) != n && waited < 5000) {
      usleep(1000);
      waited++;
    }
    if (waited >= 5000 && !bad) bad = "no-echo";
    if (!bad && check_pattern(sp)) bad = "pattern";
    snprintf(line, sizeof(line), "%016llx %u %s%s %d\n", (unsigned long long)token, n, bad ? "bad:" : "ok",
             bad ? bad : "", (int)child);
    write_state_line(argv[1], line);
    usleep(10000);
  }
}
