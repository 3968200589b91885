/* libphos.so's poll() stand-in as an NCCL proxy thread sees it (the thread
 * named as NCCL names its proxy service thread, the wake on by default):
 * a 500 ms poll that reports an event, then one that times out, must leave
 * no stale revents behind (NCCL reads them whatever poll() returned).
 * Exits 0 when it holds, 1 (saying what it saw) when not. */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
  pthread_setname_np(pthread_self(), "NCCL Service  0");
  int p[2];
  if (pipe(p) != 0) return 2;
  struct pollfd pfd = {p[0], POLLIN, 0};
  char c = 'x';
  if (write(p[1], &c, 1) != 1) return 2;
  int r = poll(&pfd, 1, 500);
  if (r != 1 || !(pfd.revents & POLLIN)) {
    printf("poll with data: r=%d revents=%#x\n", r, pfd.revents);
    return 1;
  }
  if (read(p[0], &c, 1) != 1) return 2;
  r = poll(&pfd, 1, 500);
  if (r != 0 || pfd.revents != 0) {
    printf("poll that timed out: r=%d revents=%#x (stale)\n", r, pfd.revents);
    return 1;
  }
  printf("poll: event reported, then a timeout with revents cleared\n");
  return 0;
}
