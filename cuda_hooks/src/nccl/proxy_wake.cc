#include "nccl/proxy_wake.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "driver/library_next.h"

// Two earlier versions hung a 2-rank torchrun job at start-up on the 2xH200
// host: both returned a timeout without clearing the caller's revents (NCCL
// reads them whatever poll() returned: a stale event on its listening socket
// sends its proxy thread into accept()), and both took the dynamic loader's
// lock on poll()'s path (dladdr, a thread_local with a destructor), which a
// thread inside dlopen may hold. This version does neither; it passed the
// 2-GPU torchrun, DDP and copy-on-write cases and is on unless
// PHOS_NCCL_PROXY_WAKE=off.

namespace {

using PollFn = int (*)(struct pollfd*, nfds_t, int);

// NCCL's proxy loops poll with exactly this timeout (proxy.cc).
constexpr int kNcclProxyPollMs = 500;
// NCCL's service thread polls NCCL_MAX_PROXY_CONNECTIONS + 1 fds; a longer
// array is passed on unwoken.
constexpr nfds_t kMaxWokenFds = 512;

std::atomic<void*> g_libc_poll{nullptr};
std::atomic<int> g_wake_fd{-1};
bool g_wake_on = false;

PollFn libc_poll() { return phos::hooks::library_next_as<PollFn>("poll", "libc.so", g_libc_poll); }

// At load, before any thread of the program polls: the lookup and the
// eventfd are made here, not on poll()'s path.
__attribute__((constructor)) void init_proxy_wake() {
  (void)libc_poll();
  const char* v = std::getenv("PHOS_NCCL_PROXY_WAKE");
  g_wake_on = !(v && std::strcmp(v, "off") == 0);
  if (!g_wake_on) return;
  g_wake_fd.store(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), std::memory_order_release);
  // NCCL names its threads only when asked; the wake tells NCCL's proxy
  // threads by their names.
  setenv("NCCL_SET_THREAD_NAME", "1", 0);
}

// Whether the calling thread is one of NCCL's proxy service threads, by the
// name NCCL gives them with NCCL_SET_THREAD_NAME=1 ("NCCL Service NN",
// "NCCL UDS Service NN", cut to 15 characters). Read at each such poll
// (NCCL names a thread after starting it), with prctl: no lock.
bool nccl_proxy_thread() {
  char name[16] = {};
  if (prctl(PR_GET_NAME, name) != 0) return false;
  return std::strncmp(name, "NCCL Service", 12) == 0 || std::strncmp(name, "NCCL UDS Serv", 13) == 0;
}

}  // namespace

namespace phos::hooks {

void nccl_proxy_wake_begin() {
  int fd = g_wake_fd.load(std::memory_order_acquire);
  if (fd < 0) return;
  uint64_t one = 1;
  (void)!::write(fd, &one, sizeof(one));
}

void nccl_proxy_wake_end() {
  int fd = g_wake_fd.load(std::memory_order_acquire);
  if (fd < 0) return;
  uint64_t count;
  (void)!::read(fd, &count, sizeof(count));  // reset: the next proxies poll as NCCL meant
}

}  // namespace phos::hooks

namespace {

// The wake's own path, out of poll()'s frame: poll() itself stays a few
// loads and a tail call (its array would otherwise take 4 KiB of every
// caller's stack, the wake off or on).
__attribute__((noinline)) int poll_with_wake(PollFn real, struct pollfd* fds, nfds_t n, int timeout) {
  int fd = g_wake_fd.load(std::memory_order_acquire);
  if (fd < 0 || n + 1 > kMaxWokenFds || !nccl_proxy_thread()) return real(fds, n, timeout);
  struct pollfd with_wake[kMaxWokenFds];
  std::memcpy(with_wake, fds, n * sizeof(*fds));
  with_wake[n] = {fd, POLLIN, 0};
  int r = real(with_wake, n + 1, timeout);
  if (r < 0) return r;
  // Every entry's revents, on a timeout too: the kernel clears them, and
  // NCCL reads them whatever poll() returned (a stale event on its listening
  // socket would send its proxy thread into accept()).
  for (nfds_t i = 0; i < n; i++) fds[i].revents = with_wake[i].revents;
  // Phos's fd is not the caller's: woken by it alone looks like a timeout.
  return with_wake[n].revents ? r - 1 : r;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int poll(struct pollfd* fds, nfds_t n, int timeout) {
  PollFn real = libc_poll();  // cached at load; looked up here only before that
  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  if (!g_wake_on || timeout != kNcclProxyPollMs) return real(fds, n, timeout);
  return poll_with_wake(real, fds, n, timeout);
}
