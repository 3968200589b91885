/* A workload that asks for an io_uring the way libuv does (torchrun's
 * launcher holds two, made by the c10d store's event loop): through libc's
 * syscall(), mapping the ring's queues as libuv does. Every 10 ms it writes
 * "TOKEN COUNTER RING" to STATE, RING being "ring" while it holds one or
 * "none:ERRNO-NAME" when io_uring_setup was refused (lib.sh's contract).
 *
 * usage: phos-test-io-uring STATE */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "state_file.h"

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s STATE\n", argv[0]);
    return 2;
  }
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;

  char ring[64] = "ring";
  struct io_uring_params params;
  memset(&params, 0, sizeof(params));
  long fd = syscall(SYS_io_uring_setup, 8, &params);
  if (fd < 0) {
    snprintf(ring, sizeof(ring), "none:%s", errno == ENOSYS ? "ENOSYS" : strerrorname_np(errno));
  } else {
    size_t sq = params.sq_off.array + params.sq_entries * sizeof(uint32_t);
    size_t sqes = params.sq_entries * sizeof(struct io_uring_sqe);
    if (mmap(NULL, sq, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, (int)fd, IORING_OFF_SQ_RING) == MAP_FAILED ||
        mmap(NULL, sqes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, (int)fd, IORING_OFF_SQES) == MAP_FAILED) {
      perror("io_uring mmap");
      return 2;
    }
  }
  for (uint64_t counter = 0;; counter++) {
    write_state_word(argv[1], token, counter, ring);
    usleep(10000);
  }
}
