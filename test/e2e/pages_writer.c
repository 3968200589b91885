/* pages_writer: a CPU process that rewrites all its private memory, pass
 * after pass, and keeps in it a cursor that says which pass each page
 * holds, so that any stop of it, and any image of it, can be checked for
 * being the memory of one instant (criu_resume_copies.sh).
 *
 *   pages_writer MIB RESULT_FILE     run
 *   pages_writer check PID           check a stopped process's memory
 *   pages_writer state PID           print a process's cursor
 *
 * Run: maps MIB MiB of anonymous memory, fills it (pass 0), writes
 * "ready ADDR BYTES CURSOR" (hex addresses) to RESULT_FILE, then rewrites
 * page after page, pass after pass, for ever. The cursor is one 64-bit word
 * in a mapping of its own, stored after each page: pass * PAGES + k, which
 * says pages [0, k) hold pass `pass` and pages [k, PAGES) the pass before
 * (page k may be half written). Every 8-byte word of a page holds a value
 * of its pass, its page and its place, so a page from another instant or
 * another place is caught. On SIGUSR1 it checks itself between two pages
 * and writes "ok PASS PAGE" or "bad ..." to RESULT_FILE.
 *
 * check PID: reads the cursor and the memory of the process PID (stopped,
 * e.g. restored with --leave-stopped) through /proc/PID/mem, with the
 * addresses its RESULT_FILE gave (in the environment: WRITER_ADDR,
 * WRITER_BYTES, WRITER_CURSOR), and prints "ok PASS PAGE" (exit 0) or what
 * differs (exit 1). state PID: prints the cursor's value (decimal). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "state_file.h"

#define PAGE 4096ul
#define WORDS (PAGE / 8)

static inline uint64_t word(uint64_t pass, uint64_t page, uint64_t i) {
  return (pass << 40) ^ (page * 0x9e3779b97f4a7c15ull) ^ i;
}

/* 0 if the pages [first, first + n) of memory `mem` agree with cursor
 * `state`; else the first page that does not (+1) and what it holds. */
static uint64_t check_pages(const uint64_t *mem, uint64_t first, uint64_t n, uint64_t pages, uint64_t state,
                            char *why, size_t why_len) {
  uint64_t pass = state / pages, k = state % pages;
  for (uint64_t p = first; p < first + n; p++) {
    const uint64_t *w = mem + (p - first) * WORDS;
    for (uint64_t i = 0; i < WORDS; i++) {
      uint64_t now = word(pass, p, i), before = word(pass - 1, p, i);
      int good = p < k ? w[i] == now : p > k ? w[i] == before : (w[i] == now || w[i] == before);
      if (!good) {
        snprintf(why, why_len, "bad page %" PRIu64 " word %" PRIu64 ": 0x%" PRIx64 ", want pass %" PRIu64
                 " (cursor: pass %" PRIu64 ", page %" PRIu64 ")", p, i, w[i], p < k ? pass : pass - 1, pass, k);
        return p + 1;
      }
    }
  }
  return 0;
}

static volatile sig_atomic_t check_requested;
static void on_usr1(int sig) { (void)sig; check_requested = 1; }

static int run(size_t mib, const char *result) {
  size_t bytes = mib << 20;
  uint64_t pages = bytes / PAGE;
  uint64_t *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  uint64_t *cursor = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED || cursor == MAP_FAILED) { perror("mmap"); return 1; }
  for (uint64_t p = 0; p < pages; p++)
    for (uint64_t i = 0; i < WORDS; i++) mem[p * WORDS + i] = word(0, p, i);
  uint64_t state = pages; /* pass 1, page 0: every page holds pass 0 */
  __atomic_store_n(cursor, state, __ATOMIC_RELEASE);
  signal(SIGUSR1, on_usr1);
  char msg[256];
  snprintf(msg, sizeof msg, "ready %lx %zx %lx\n", (unsigned long)mem, bytes, (unsigned long)cursor);
  write_state_line(result, msg);
  for (;;) {
    uint64_t pass = state / pages, k = state % pages;
    if (check_requested) {
      check_requested = 0;
      char why[200];
      if (check_pages(mem, 0, pages, pages, state, why, sizeof why))
        snprintf(msg, sizeof msg, "%s\n", why);
      else
        snprintf(msg, sizeof msg, "ok %" PRIu64 " %" PRIu64 "\n", pass, k);
      write_state_line(result, msg);
    }
    uint64_t *w = mem + k * WORDS;
    for (uint64_t i = 0; i < WORDS; i++) w[i] = word(pass, k, i);
    /* The page before the cursor that says so (release: in program order). */
    __atomic_store_n(cursor, ++state, __ATOMIC_RELEASE);
  }
}

static int open_mem(const char *pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%s/mem", pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0) fprintf(stderr, "pages_writer: %s: %s\n", path, strerror(errno));
  return fd;
}

static int read_state(int fd, uint64_t cursor_addr, uint64_t *state) {
  if (pread(fd, state, sizeof *state, (off_t)cursor_addr) != sizeof *state) {
    fprintf(stderr, "pages_writer: reading the cursor at 0x%" PRIx64 ": %s\n", cursor_addr, strerror(errno));
    return -1;
  }
  return 0;
}

static uint64_t env_hex(const char *name) {
  const char *v = getenv(name);
  if (!v) { fprintf(stderr, "pages_writer: %s is not set\n", name); exit(2); }
  return strtoull(v, NULL, 16);
}

static int check(const char *pid) {
  uint64_t addr = env_hex("WRITER_ADDR"), bytes = env_hex("WRITER_BYTES"), cursor = env_hex("WRITER_CURSOR");
  uint64_t pages = bytes / PAGE, state;
  int fd = open_mem(pid);
  if (fd < 0 || read_state(fd, cursor, &state)) return 2;
  const uint64_t chunk = 1024; /* pages read at once */
  uint64_t *buf = malloc(chunk * PAGE);
  if (!buf) return 2;
  for (uint64_t p = 0; p < pages; p += chunk) {
    uint64_t n = pages - p < chunk ? pages - p : chunk;
    if (pread(fd, buf, n * PAGE, (off_t)(addr + p * PAGE)) != (ssize_t)(n * PAGE)) {
      fprintf(stderr, "pages_writer: reading page %" PRIu64 ": %s\n", p, strerror(errno));
      return 2;
    }
    char why[200];
    if (check_pages(buf, p, n, pages, state, why, sizeof why)) { printf("%s\n", why); return 1; }
  }
  printf("ok %" PRIu64 " %" PRIu64 "\n", state / pages, state % pages);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "check") == 0) return check(argv[2]);
  if (argc == 3 && strcmp(argv[1], "state") == 0) {
    uint64_t state;
    int fd = open_mem(argv[2]);
    if (fd < 0 || read_state(fd, env_hex("WRITER_CURSOR"), &state)) return 2;
    printf("%" PRIu64 "\n", state);
    return 0;
  }
  if (argc == 3) return run(strtoull(argv[1], NULL, 10), argv[2]);
  fprintf(stderr, "usage: %s MIB RESULT_FILE | check PID | state PID\n", argv[0]);
  return 2;
}
