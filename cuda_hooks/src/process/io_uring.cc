// io_uring refused in every process under libphos.so.
//
// CRIU cannot dump an io_uring (its fds and mappings: "Unknown shit 600
// (anon_inode:[io_uring])"), and a job's tree is dumped whole: one process
// holding a ring fails the dump of every rank. torchrun's launcher holds two,
// made by libuv (the c10d TCPStore's event loop) to batch its epoll_ctl calls;
// libuv, like other users, falls back to plain epoll when the kernel says it
// has no io_uring. So libphos.so stands in for libc's syscall() and answers
// io_uring_setup with ENOSYS, as a kernel built without io_uring does.
// PHOS_IO_URING=allow gives the program its rings (and makes it undumpable).
//
// Only callers that go through libc's syscall() are seen (libuv does); a
// library that issues the system call itself (liburing 2.2 and later) is not.
#include "process/io_uring.h"

#include <sys/syscall.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>

#include "driver/library_next.h"

namespace {

using SyscallFn = long (*)(long, ...);

std::atomic<void*> g_libc_syscall{nullptr};

SyscallFn libc_syscall() {
  return phos::hooks::library_next_as<SyscallFn>("syscall", "libc.so", g_libc_syscall);
}

// Looked up at load: the lookup takes the dynamic loader's lock, which a
// thread inside dlopen may hold; later calls only read the cache.
__attribute__((constructor)) void init_libc_syscall() { (void)libc_syscall(); }

bool io_uring_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("PHOS_IO_URING");
    return v && std::strcmp(v, "allow") == 0;
  }();
  return allowed;
}

std::atomic<unsigned long> g_refused{0};

}  // namespace

namespace phos::hooks {
unsigned long io_uring_setups_refused() { return g_refused.load(std::memory_order_relaxed); }
}  // namespace phos::hooks

// syscall(2) takes at most six arguments after the number; they are passed
// on as longs whatever their types, as libc's own syscall() does.
extern "C" __attribute__((visibility("default"))) long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (long& x : a) x = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_io_uring_setup && !io_uring_allowed()) {
    g_refused.fetch_add(1, std::memory_order_relaxed);
    errno = ENOSYS;
    return -1;
  }
  SyscallFn real = libc_syscall();
  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
