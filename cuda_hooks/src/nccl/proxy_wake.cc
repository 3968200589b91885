#include "nccl/proxy_wake.h"

#include <dlfcn.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using PollFn = int (*)(struct pollfd*, nfds_t, int);

// NCCL's proxy loops poll with exactly this timeout (proxy.cc).
constexpr int kNcclProxyPollMs = 500;

PollFn libc_poll() {
  static PollFn f = reinterpret_cast<PollFn>(dlvsym(RTLD_NEXT, "poll", "GLIBC_2.2.5"));
  return f;
}

// Made at the first NCCL proxy poll, kept for the process's life (criu dumps
// and restores an eventfd with its count).
std::atomic<int> g_wake_fd{-1};

int wake_fd() {
  int fd = g_wake_fd.load(std::memory_order_acquire);
  if (fd >= 0) return fd;
  int made = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (made < 0) return -1;
  if (!g_wake_fd.compare_exchange_strong(fd, made, std::memory_order_acq_rel)) {
    ::close(made);
    return fd;
  }
  return made;
}

// Whether the poll was issued from libnccl: its caller's object is named
// libnccl*. One answer kept per thread for the last call site.
bool from_nccl(const void* caller) {
  thread_local const void* last_caller = nullptr;
  thread_local bool last_answer = false;
  if (caller == last_caller) return last_answer;
  Dl_info info{};
  bool nccl = dladdr(caller, &info) && info.dli_fname && std::strstr(info.dli_fname, "libnccl");
  last_caller = caller;
  last_answer = nccl;
  return nccl;
}

}  // namespace

namespace phos::hooks {

void nccl_proxy_wake_begin() {
  int fd = g_wake_fd.load(std::memory_order_acquire);
  if (fd < 0) return;  // no proxy has polled: nothing to wake
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

extern "C" __attribute__((visibility("default"))) int poll(struct pollfd* fds, nfds_t n, int timeout) {
  PollFn real = libc_poll();
  if (timeout != kNcclProxyPollMs || !from_nccl(__builtin_return_address(0))) return real(fds, n, timeout);
  int fd = wake_fd();
  if (fd < 0) return real(fds, n, timeout);
  thread_local std::vector<struct pollfd> with_wake;
  with_wake.assign(fds, fds + n);
  with_wake.push_back({fd, POLLIN, 0});
  int r = real(with_wake.data(), n + 1, timeout);
  if (r <= 0) return r;
  for (nfds_t i = 0; i < n; i++) fds[i].revents = with_wake[i].revents;
  // Phos's fd is not the caller's: woken by it alone looks like a timeout.
  return with_wake[n].revents ? r - 1 : r;
}
