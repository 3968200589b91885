/* The CPU workload of the end-to-end tests. It keeps state that only a real
 * restore brings back: a random token, a counter, and 8 MiB of memory filled
 * from the token that it checks as it goes. Every 10 ms it writes
 * "TOKEN COUNTER [CHILD-COUNTER]" to STATE (atomically, with no file kept
 * open, so CRIU has no open file to carry).
 *
 * usage: phos-test-counter STATE [--fork]
 *   --fork: also run a child process that counts too (a process tree). */
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

#define WORDS (8u << 20) / 8

static uint64_t *memory;
static uint64_t token;

static uint64_t expected(uint64_t i) { return (token ^ (i * 0x9E3779B97F4A7C15ull)) + i; }

static void write_state(const char *path, uint64_t counter, const volatile uint64_t *child_counter) {
  char line[128];
  if (child_counter)
    snprintf(line, sizeof(line), "%016llx %llu %llu\n", (unsigned long long)token, (unsigned long long)counter,
             (unsigned long long)*child_counter);
  else
    snprintf(line, sizeof(line), "%016llx %llu\n", (unsigned long long)token, (unsigned long long)counter);
  write_state_line(path, line);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s STATE [--fork]\n", argv[0]);
    return 2;
  }
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  memory = malloc(WORDS * sizeof(uint64_t));
  if (!memory) return 2;
  for (uint64_t i = 0; i < WORDS; i++) memory[i] = expected(i);

  volatile uint64_t *child_counter = NULL;
  if (argc > 2 && strcmp(argv[2], "--fork") == 0) {
    child_counter = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (child_counter == MAP_FAILED) return 2;
    *child_counter = 0;
    if (fork() == 0) {
      for (;;) {
        (*child_counter)++;
        usleep(10000);
      }
    }
  }

  struct timespec tick = {0, 10 * 1000 * 1000};
  for (uint64_t counter = 1;; counter++) {
    uint64_t i = (counter * 2654435761u) % WORDS;
    if (memory[i] != expected(i)) {
      write_state(argv[1], 0, NULL);
      fprintf(stderr, "memory corrupted at word %llu\n", (unsigned long long)i);
      return 3;
    }
    write_state(argv[1], counter, child_counter);
    nanosleep(&tick, NULL);
  }
}
