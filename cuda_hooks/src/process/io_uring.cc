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

#include <dlfcn.h>
#include <sys/syscall.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>

namespace {

using SyscallFn = long (*)(long, ...);

// Looked up at load (dlvsym takes the dynamic loader's lock, which a thread
// inside dlopen may hold), or at the first call made before that.
std::atomic<SyscallFn> g_libc_syscall{nullptr};

SyscallFn libc_syscall() {
  SyscallFn f = g_libc_syscall.load(std::memory_order_acquire);
  if (f) return f;
  f = reinterpret_cast<SyscallFn>(dlvsym(RTLD_NEXT, "syscall", "GLIBC_2.2.5"));
  g_libc_syscall.store(f, std::memory_order_release);
  return f;
}

__attribute__((constructor)) void init_libc_syscall() { (void)libc_syscall(); }

bool io_uring_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("PHOS_IO_URING");
    return v && std::strcmp(v, "allow") == 0;
  }();
  return allowed;
}

std::atomic<unsigned long> g_refused{0};

// Where libc's syscall() cannot be found (not on x86-64 glibc, which has it
// under GLIBC_2.2.5): the instruction itself, as libc issues it.
long raw_syscall(long number, const long (&a)[6]) {
  register long r10 __asm__("r10") = a[3];
  register long r8 __asm__("r8") = a[4];
  register long r9 __asm__("r9") = a[5];
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(number), "D"(a[0]), "S"(a[1]), "d"(a[2]), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  if (ret < 0 && ret > -4096) {
    errno = int(-ret);
    return -1;
  }
  return ret;
}

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
  if (SyscallFn real = libc_syscall()) return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
  return raw_syscall(number, a);
}
