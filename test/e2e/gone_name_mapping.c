/* An end-to-end workload that maps a shared file whose name is gone while
 * the file is still linked under another name, as glibc's sem_open() leaves
 * a new POSIX semaphore (torch.multiprocessing's, on issue 31): the file is
 * created under a temporary name, mapped, linked to FINAL, and the
 * temporary name unlinked. No fd is kept: CRIU sees only the mapping.
 *
 * Every 10 ms it adds one to the counter in the mapping's first word and
 * writes "TOKEN COUNTER PEER-MAP PEER-FD CHECK" to STATE (lib.sh's
 * contract): PEER-MAP and PEER-FD are the second and third words, which the
 * child counts in (0 without one), CHECK "ok" while the rest of the file
 * still holds the pattern written from TOKEN.
 *
 * usage: phos-test-gone-name STATE FINAL BYTES [--child]
 *   --child: a child process drops the mapping it inherits and opens FINAL
 *            by its name instead, as a process that sem_open()s an existing
 *            semaphore does: it counts in the second word through its own
 *            mapping of FINAL, and in the third with pwrite() on the fd it
 *            keeps (a file opened by the name that still exists). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "state_file.h"

static uint64_t token;

static uint64_t pattern(uint64_t i) { return token ^ (i * 0x9E3779B97F4A7C15ull); }

static volatile uint64_t *map_fd(int fd, size_t bytes, const char *what) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror(what);
    exit(2);
  }
  return p;
}

/* The file under a temporary name, filled and mapped, then linked to FINAL
 * and the temporary name removed; the fd closed. */
static volatile uint64_t *create_gone_name(const char *final, size_t bytes) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.XXXXXX", final);
  int fd = mkstemp(tmp);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
    perror("creating the temporary file");
    exit(2);
  }
  volatile uint64_t *m = map_fd(fd, bytes, "mapping the temporary file");
  close(fd);
  m[0] = m[1] = m[2] = 0;
  for (size_t i = 3; i < bytes / 8; i++) m[i] = pattern(i);
  if (link(tmp, final) != 0 || unlink(tmp) != 0) {
    perror("linking the temporary file to its final name");
    exit(2);
  }
  return m;
}

static void child_counts(const char *final, volatile uint64_t *inherited, size_t bytes) {
  munmap((void *)inherited, bytes);
  int fd = open(final, O_RDWR);
  if (fd < 0) {
    perror("opening the final name");
    exit(2);
  }
  volatile uint64_t *m = map_fd(fd, bytes, "mapping the final name");
  struct timespec tick = {0, 10 * 1000 * 1000};
  for (uint64_t n = 1;; n++) {
    m[1]++;
    if (pwrite(fd, &n, sizeof(n), 2 * sizeof(n)) != sizeof(n)) {
      perror("writing through the fd of the final name");
      exit(2);
    }
    nanosleep(&tick, NULL);
  }
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s STATE FINAL BYTES [--child]\n", argv[0]);
    return 2;
  }
  size_t bytes = strtoull(argv[3], NULL, 0);
  if (bytes < 64 || bytes % 4096) {
    fprintf(stderr, "BYTES must be a multiple of 4096\n");
    return 2;
  }
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  volatile uint64_t *m = create_gone_name(argv[2], bytes);
  if (argc > 4 && strcmp(argv[4], "--child") == 0 && fork() == 0) child_counts(argv[2], m, bytes);

  struct timespec tick = {0, 10 * 1000 * 1000};
  for (uint64_t step = 1;; step++) {
    uint64_t i = 3 + step % (bytes / 8 - 3);
    uint64_t counter = ++m[0];
    char line[160];
    snprintf(line, sizeof(line), "%016llx %llu %llu %llu %s\n", (unsigned long long)token,
             (unsigned long long)counter, (unsigned long long)m[1], (unsigned long long)m[2],
             m[i] == pattern(i) ? "ok" : "pattern-changed");
    write_state_line(argv[1], line);
    nanosleep(&tick, NULL);
  }
}
