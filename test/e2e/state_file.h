/* The end-to-end workloads' state file (lib.sh's contract): LINE written to
 * PATH atomically (PATH.tmp, then renamed), no file kept open, so CRIU has
 * no open file to carry, but for the moment between the open and the
 * rename: a leave-running dump that freezes it there is made again
 * (lib.sh's criu_dump). Exits 2 where it cannot. */
#pragma once
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static inline void write_state_line(const char *path, const char *line) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  size_t n = strlen(line);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write(fd, line, n) != (ssize_t)n) exit(2);
  close(fd);
  if (rename(tmp, path) != 0) exit(2);
}

/* "TOKEN COUNTER WORD": the line of workloads whose third field is a word
 * of their own (a check's verdict, a ring's state). */
static inline void write_state_word(const char *path, uint64_t token, uint64_t counter, const char *word) {
  char line[160];
  snprintf(line, sizeof(line), "%016llx %llu %s\n", (unsigned long long)token, (unsigned long long)counter, word);
  write_state_line(path, line);
}
