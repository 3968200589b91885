/* One host's part of a multi-host NCCL job for the end-to-end tests,
 * against the fake libnccl: a launcher (as torchrun's agent on that host)
 * starts one rank (itself again, exec'd), which makes a communicator of
 * NRANKS ranks from the unique id IDHEX (the same on every host) and
 * issues an all-reduce every 5 ms. With MASTER_ADDR and MASTER_PORT the
 * rank keeps an idle, validated connection to the job's TCPStore, as
 * torch's ranks do (criu then dumps it with --tcp-established). The rank
 * writes "COUNTER MADE ID" to STATE.r (MADE: communicators the library
 * made; ID: the first 8 bytes of the unique id of the last, in hex); the
 * launcher writes "TOKEN COUNTER MADE ID" to STATE. A rank whose NCCL call
 * fails exits 3.
 *
 * usage: nccl_host_client STATE --rank R --nranks N --id IDHEX [--register]   the launcher
 *        nccl_host_client STATE --worker R N IDHEX [register]                  a rank
 * --register: the rank registers a buffer with its communicator
 * (ncclCommRegister), which phos cannot make again. */
#include <nccl.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

extern unsigned long long fake_nccl_created, fake_nccl_last_id;

static void put(const char *path, const char *line) {
  char tmp[4200];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) exit(2);
  fputs(line, f);
  fclose(f);
  if (rename(tmp, path) != 0) exit(2);
}

/* The store's connection, validated (VALIDATE: type 0, the magic
 * 0x3C85F7CE little-endian) and left idle; -1 without MASTER_ADDR. */
static int store_connection(void) {
  const char *host = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  if (!host || !port) return -1;
  struct addrinfo hints = {0}, *list = NULL;
  hints.ai_socktype = SOCK_STREAM;
  for (int attempt = 0; attempt < 100; attempt++, usleep(50000)) {
    if (getaddrinfo(host, port, &hints, &list) != 0) continue;
    int fd = socket(list->ai_family, list->ai_socktype, list->ai_protocol);
    int ok = fd >= 0 && connect(fd, list->ai_addr, list->ai_addrlen) == 0;
    freeaddrinfo(list);
    if (!ok) {
      if (fd >= 0) close(fd);
      continue;
    }
    const unsigned char validate[5] = {0, 0xCE, 0xF7, 0x85, 0x3C};
    if (send(fd, validate, sizeof(validate), MSG_NOSIGNAL) == (ssize_t)sizeof(validate)) return fd;
    close(fd);
  }
  fprintf(stderr, "no TCPStore at %s:%s\n", host, port);
  exit(4);
}

static int rank_main(const char *state, int rank, int nranks, const char *idhex, int register_buffer) {
  int store = store_connection();
  (void)store; /* kept open, idle, for the process's life */
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  for (int i = 0; i < 8 && idhex[2 * i] && idhex[2 * i + 1]; i++) {
    unsigned v;
    if (sscanf(idhex + 2 * i, "%2x", &v) != 1) return 2;
    ((unsigned char *)&id)[i] = (unsigned char)v;
  }
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess) return 3;
  void *registration;
  if (register_buffer && ncclCommRegister(comm, (void *)0x30000, 4096, &registration) != ncclSuccess) return 3;
  char path[4096], line[128];
  if (snprintf(path, sizeof(path), "%s.r", state) >= (int)sizeof(path)) return 2;
  for (unsigned long long n = 1;; n++) {
    if (ncclAllReduce((void *)0x10000, (void *)0x20000, 16, ncclFloat32, ncclSum, comm, (cudaStream_t)0) != ncclSuccess) {
      fprintf(stderr, "rank %d: all-reduce %llu failed\n", rank, n);
      return 3;
    }
    snprintf(line, sizeof(line), "%llu %llu %016llx\n", n, __atomic_load_n(&fake_nccl_created, __ATOMIC_RELAXED),
             fake_nccl_last_id);
    put(path, line);
    usleep(5000);
  }
}

int main(int argc, char **argv) {
  if (argc >= 6 && !strcmp(argv[2], "--worker"))
    return rank_main(argv[1], atoi(argv[3]), atoi(argv[4]), argv[5], argc > 6 && !strcmp(argv[6], "register"));
  if (argc < 8 || strcmp(argv[2], "--rank") || strcmp(argv[4], "--nranks") || strcmp(argv[6], "--id")) {
    fprintf(stderr, "usage: nccl_host_client STATE --rank R --nranks N --id IDHEX [--register]\n");
    return 2;
  }
  const int registers = argc > 8 && !strcmp(argv[8], "--register");
  uint64_t token;
  if (getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  if (fork() == 0) {
    execl("/proc/self/exe", argv[0], argv[1], "--worker", argv[3], argv[5], argv[7], registers ? "register" : NULL,
          (char *)NULL);
    _exit(127);
  }
  char path[4096], line[256];
  snprintf(path, sizeof(path), "%s.r", argv[1]);
  for (;;) {
    unsigned long long n = 0, made = 0, id = 0;
    FILE *f = fopen(path, "r");
    if (f) {
      if (fscanf(f, "%llu %llu %llx", &n, &made, &id) == 3) {
        snprintf(line, sizeof(line), "%016llx %llu %llu %016llx\n", (unsigned long long)token, n, made, id);
        put(argv[1], line);
      }
      fclose(f);
    }
    usleep(5000);
  }
}
