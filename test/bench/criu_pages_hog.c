/* criu_pages_hog: a CPU process with SIZE MiB of dirty private anonymous
 * memory, for measuring criu's dump and restore of private pages
 * (criu_pages.sh).
 *
 *   criu_pages_hog MIB RESULT_FILE [VMAS [THREADS [HOLES]]]
 *
 * Maps MIB MiB in VMAS separate anonymous mappings (default 4, to give criu
 * several VMAs as a real program has), writes a pattern that depends on each
 * page's index into every page, starts THREADS - 1 idle threads (default 16
 * in all: a GPU program has a dozen or more, and a patched criu reads pages
 * with the tids of a task's threads), writes "ready" to RESULT_FILE and
 * sleeps. With HOLES = k > 0, every page whose index is a multiple of k, and
 * every k-th run of k pages, is left untouched, which gives criu many short
 * page runs in each VMA (the check wants zeros there). On
 * SIGUSR1 (sent after a restore) it checks every page and writes "ok" or
 * "bad <first page>" to RESULT_FILE. SIGTERM ends it. No libc buffers are
 * left unflushed across a dump: the file is opened, written and closed each
 * time. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile sig_atomic_t check_requested;
static void *idle(void *arg) { (void)arg; for (;;) pause(); return NULL; }
static void on_usr1(int sig) { (void)sig; check_requested = 1; }

static const char *result_path;
static uint64_t *regions[256];
static size_t region_bytes;
static int nregions;

static void put_result(const char *text) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", result_path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) exit(2);
  if (write(fd, text, strlen(text)) < 0) exit(2);
  close(fd);
  if (rename(tmp, result_path) != 0) exit(2);
}

/* Each 8-byte word of page p holds p * 0x9e3779b97f4a7c15 + word index, so a
 * page read into the wrong place or left zero is caught. */
static inline uint64_t word(uint64_t page, uint64_t i) { return page * 0x9e3779b97f4a7c15ull + i; }
static uint64_t holes;
static inline int is_hole(uint64_t page) {
  return holes && (page % holes == 0 || (page / holes) % holes == 1);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MIB RESULT_FILE [VMAS [THREADS]]\n", argv[0]);
    return 2;
  }
  size_t mib = strtoull(argv[1], NULL, 10);
  result_path = argv[2];
  nregions = argc > 3 ? atoi(argv[3]) : 4;
  int nthreads = argc > 4 ? atoi(argv[4]) : 16;
  holes = argc > 5 ? strtoull(argv[5], NULL, 10) : 0;
  if (nregions < 1 || nregions > 256 || mib % nregions) {
    fprintf(stderr, "VMAS must be 1..256 and divide MIB\n");
    return 2;
  }
  region_bytes = mib / nregions << 20;
  const size_t page = 4096, words = page / 8;
  uint64_t pg = 0;
  for (int r = 0; r < nregions; r++) {
    /* A gap page between regions keeps the kernel from merging them. */
    char *p = mmap(NULL, region_bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    munmap(p + region_bytes, page);
    regions[r] = (uint64_t *)p;
    for (size_t off = 0; off < region_bytes; off += page, pg++) {
      uint64_t *w = (uint64_t *)(p + off);
      if (is_hole(pg)) continue;
      for (size_t i = 0; i < words; i++) w[i] = word(pg, i);
    }
  }
  signal(SIGUSR1, on_usr1);
  for (int t = 1; t < nthreads; t++) {
    pthread_t th;
    if (pthread_create(&th, NULL, idle, NULL) != 0) { perror("pthread_create"); return 1; }
  }
  put_result("ready\n");
  for (;;) {
    usleep(20000);
    if (!check_requested) continue;
    check_requested = 0;
    uint64_t bad = UINT64_MAX;
    pg = 0;
    for (int r = 0; r < nregions && bad == UINT64_MAX; r++) {
      for (size_t off = 0; off < region_bytes; off += page, pg++) {
        const uint64_t *w = (const uint64_t *)((char *)regions[r] + off);
        size_t i = 0;
        while (i < words && w[i] == (is_hole(pg) ? 0 : word(pg, i))) i++;
        if (i < words) { bad = pg; break; }
      }
    }
    char msg[64];
    if (bad == UINT64_MAX) snprintf(msg, sizeof msg, "ok\n");
    else snprintf(msg, sizeof msg, "bad %llu\n", (unsigned long long)bad);
    put_result(msg);
  }
}
