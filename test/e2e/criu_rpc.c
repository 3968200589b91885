/* criu driven through its RPC, the way runc and podman drive it: `criu swrk
 * FD` on one end of a SOCK_SEQPACKET pair, one criu_req (CRIU's rpc.proto)
 * sent, one criu_resp read, the socket closed, criu waited for. The few
 * fields a dump and a restore need are encoded here by hand (protobuf's wire
 * format: varints and length-delimited fields), so the test needs neither
 * CRIU's .proto nor a protobuf runtime.
 *
 * usage: phos-criu-rpc CRIU dump|restore IMAGES_DIR CONFIG_FILE [PID] [--leave-running]
 *   CONFIG_FILE: criu's configuration (swrk takes no command-line options:
 *   the plugin directory comes from its `lib` line)
 * Exit 0 when criu answers success; prints criu's answer. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* rpc.proto's numbers. */
enum { kDump = 1, kRestore = 2 };
enum { kReqType = 1, kReqOpts = 2 };
enum { kOptImagesDirFd = 1, kOptPid = 2, kOptLeaveRunning = 3, kOptLogLevel = 9, kOptLogFile = 10, kOptConfigFile = 51 };
enum { kRespType = 1, kRespSuccess = 2, kRespErrno = 7, kRespErrmsg = 9 };

struct buf {
  uint8_t data[4096];
  size_t len;
};

static void put_varint(struct buf *b, uint64_t v) {
  do {
    uint8_t byte = v & 0x7f;
    v >>= 7;
    b->data[b->len++] = byte | (v ? 0x80 : 0);
  } while (v);
}
static void put_key(struct buf *b, unsigned field, unsigned wire) { put_varint(b, ((uint64_t)field << 3) | wire); }
static void put_int(struct buf *b, unsigned field, uint64_t v) {
  put_key(b, field, 0);
  put_varint(b, v);
}
static void put_bytes(struct buf *b, unsigned field, const void *p, size_t n) {
  put_key(b, field, 2);
  put_varint(b, n);
  memcpy(b->data + b->len, p, n);
  b->len += n;
}

static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; *p < end && shift < 64; shift += 7) {
    uint8_t byte = *(*p)++;
    *v |= (uint64_t)(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return 0;
  }
  return -1;
}

int main(int argc, char **argv) {
  if (argc < 5 || (strcmp(argv[2], "dump") && strcmp(argv[2], "restore"))) {
    fprintf(stderr, "usage: %s CRIU dump|restore IMAGES_DIR CONFIG_FILE [PID] [--leave-running]\n", argv[0]);
    return 2;
  }
  const int dump = !strcmp(argv[2], "dump");
  int pid = 0, leave_running = 0;
  for (int i = 5; i < argc; i++) {
    if (!strcmp(argv[i], "--leave-running")) leave_running = 1;
    else pid = atoi(argv[i]);
  }
  /* Inherited by criu with the same number: the request names it. */
  int dir = open(argv[3], O_RDONLY | O_DIRECTORY);
  if (dir < 0) {
    perror(argv[3]);
    return 2;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) {
    perror("socketpair");
    return 2;
  }
  pid_t criu = fork();
  if (criu == 0) {
    close(sv[0]);
    char fd[16];
    snprintf(fd, sizeof(fd), "%d", sv[1]);
    execl(argv[1], argv[1], "swrk", fd, (char *)NULL);
    perror("exec criu");
    _exit(127);
  }
  close(sv[1]);

  struct buf opts = {{0}, 0}, req = {{0}, 0};
  put_int(&opts, kOptImagesDirFd, (uint64_t)dir);
  if (dump && pid) put_int(&opts, kOptPid, (uint64_t)pid);
  if (leave_running) put_int(&opts, kOptLeaveRunning, 1);
  put_int(&opts, kOptLogLevel, 4);
  const char *log = dump ? "dump.log" : "restore.log";
  put_bytes(&opts, kOptLogFile, log, strlen(log));
  put_bytes(&opts, kOptConfigFile, argv[4], strlen(argv[4]));
  put_int(&req, kReqType, dump ? kDump : kRestore);
  put_bytes(&req, kReqOpts, opts.data, opts.len);
  if (send(sv[0], req.data, req.len, 0) != (ssize_t)req.len) {
    perror("send the request");
    return 2;
  }

  uint8_t resp[4096];
  ssize_t n = recv(sv[0], resp, sizeof(resp), 0);
  if (n <= 0) {
    fprintf(stderr, "criu swrk answered nothing (%s)\n", n < 0 ? strerror(errno) : "closed");
    return 1;
  }
  uint64_t type = 0, success = 0, cr_errno = 0;
  char errmsg[512] = "";
  for (const uint8_t *p = resp, *end = resp + n; p < end;) {
    uint64_t key, v;
    if (get_varint(&p, end, &key) != 0) break;
    unsigned field = (unsigned)(key >> 3), wire = (unsigned)(key & 7);
    if (wire == 0) {
      if (get_varint(&p, end, &v) != 0) break;
      if (field == kRespType) type = v;
      else if (field == kRespSuccess) success = v;
      else if (field == kRespErrno) cr_errno = v;
    } else if (wire == 2) {
      if (get_varint(&p, end, &v) != 0 || v > (uint64_t)(end - p)) break;
      if (field == kRespErrmsg) snprintf(errmsg, sizeof(errmsg), "%.*s", (int)v, (const char *)p);
      p += v;
    } else {
      break; /* no other wire types in a criu_resp */
    }
  }
  close(sv[0]);
  int status = 0;
  waitpid(criu, &status, 0);
  printf("criu swrk %s: type %llu, success %llu, errno %llu%s%s; criu exited %d\n", argv[2], (unsigned long long)type,
         (unsigned long long)success, (unsigned long long)cr_errno, errmsg[0] ? ", " : "", errmsg,
         WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  return success ? 0 : 1;
}
