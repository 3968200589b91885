// The driver's checkpoint buffer in huge pages (driver_buffer.h says why).
#include "memory/driver_buffer.h"

#include <link.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "driver/library_next.h"
#include "phos/hooks/stderr_line.h"
#include "phos/support/clock.h"
#include "process/env_switch.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace phos::hooks {
namespace {

using MmapFn = void* (*)(void*, size_t, int, int, int, off_t);

std::atomic<void*> g_libc_mmap{nullptr};

MmapFn libc_mmap() { return library_next_as<MmapFn>("mmap", "libc.so", g_libc_mmap); }

// mmap(2) itself, for the calls that come before the constructor found
// libc's (other libraries' constructors run first): looking it up there
// could call dlsym, whose allocation (glibc before 2.34) may come back
// here through an allocator that maps with mmap.
void* raw_mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  long ret;
  register long r10 asm("r10") = flags;
  register long r8 asm("r8") = fd;
  register long r9 asm("r9") = offset;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(long(SYS_mmap)), "D"(addr), "S"(length), "d"(long(prot)), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
  if (ret < 0 && ret > -4096) {
    errno = int(-ret);
    return MAP_FAILED;
  }
  return reinterpret_cast<void*>(ret);
}

// libc's mmap once the constructor found it, the system call before.
MmapFn next_mmap() {
  void* found = g_libc_mmap.load(std::memory_order_acquire);
  return found ? reinterpret_cast<MmapFn>(found) : raw_mmap;
}

// libcuda's executable segments: [lo, hi). Zero until the driver is resolved.
std::atomic<uintptr_t> g_code_lo{0}, g_code_hi{0};

bool enabled() {
  static const bool on = on_unless_switched_off("PHOS_DRIVER_BUFFER_HUGE");
  return on;
}

constexpr size_t kDriverBufferMinBytes = size_t(32) << 20;

// The driver's buffer: a private anonymous writable mapping of at least 32
// MiB asked populated, from libcuda's code. The flags first: most mmaps end
// at MAP_POPULATE.
bool driver_buffer(size_t length, int prot, int flags, const void* caller) {
  if (!(flags & MAP_POPULATE) || (flags & MAP_TYPE) != MAP_PRIVATE || !(flags & MAP_ANONYMOUS) ||
      (flags & MAP_HUGETLB) || !(prot & PROT_WRITE) || length < kDriverBufferMinBytes)
    return false;
  const auto at = reinterpret_cast<uintptr_t>(caller);
  return at >= g_code_lo.load(std::memory_order_relaxed) && at < g_code_hi.load(std::memory_order_relaxed) &&
         enabled();
}

void touch_pages(void* p, size_t length) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  auto* bytes = static_cast<volatile char*>(p);
  for (size_t at = 0; at < length; at += page) bytes[at] = 0;
}

// Huge pages come slower than small ones where the kernel must compact
// memory to find them (a host long up, its memory fragmented; the defrag
// setting `madvise` compacts for advised mappings), or where a VM's host
// backs its memory at first touch: the first 32 MiB tell. Under 1 GB/s
// (4 KiB pages came at 2.4-3.3 GB/s on the H200 hosts, huge ones at 5-6),
// the rest is populated in small pages.
constexpr size_t kProbeBytes = size_t(32) << 20;
constexpr uint64_t kSlowProbeNs = 32'000'000;  // 32 MiB at 1 GB/s

bool huge_pages_slow(uint64_t probe_ns) {
  // PHOS_FAULT=slow-huge-pages: a test's fragmented host.
  static const bool forced = [] {
    const char* v = std::getenv("PHOS_FAULT");
    return v && std::strcmp(v, "slow-huge-pages") == 0;
  }();
  return forced || probe_ns > kSlowProbeNs;
}

// Looked up at load, as io_uring.cc's syscall: the lookup takes the
// loader's lock, which the driver's thread must not wait for during a
// checkpoint (a frozen program thread may hold it). The settings too: a
// function-local static's first use takes a lock of its own.
__attribute__((constructor)) void init_driver_buffer() {
  (void)libc_mmap();
  (void)enabled();
  (void)huge_pages_slow(0);
}

// Written page by page where the kernel lacks MADV_POPULATE_WRITE (EINVAL);
// any other failure (no memory) leaves the pages to their first write, as
// MAP_POPULATE itself does.
void populate(char* p, size_t length) {
  if (madvise(p, length, MADV_POPULATE_WRITE) != 0 && errno == EINVAL) touch_pages(p, length);
}

void* map_huge(MmapFn real, void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  void* p = real(addr, length, prot, flags & ~MAP_POPULATE, fd, offset);
  if (p == MAP_FAILED) return p;
  const int saved_errno = errno;  // a successful mmap leaves it as it was
  auto* bytes = static_cast<char*>(p);
  const uint64_t t0 = monotonic_ns();
  // Refused only by a kernel without transparent huge pages: 4 KiB pages
  // then, populated all the same.
  (void)madvise(p, length, MADV_HUGEPAGE);
  const size_t probe = std::min(length, kProbeBytes);
  populate(bytes, probe);
  const uint64_t probe_ns = monotonic_ns() - t0;
  const bool slow = huge_pages_slow(probe_ns);
  if (slow) (void)madvise(bytes + probe, length - probe, MADV_NOHUGEPAGE);
  populate(bytes + probe, length - probe);
  const uint64_t took = monotonic_ns() - t0;
  if (slow)
    stderr_line("phos: the driver's %.1f MiB buffer populated in %.1f ms, in small pages past its first %zu MiB (those "
                "came at %.2f GB/s, under 1 GB/s, advised huge)\n",
                double(length) / (1 << 20), double(took) / 1e6, probe >> 20,
                double(probe) / double(probe_ns ? probe_ns : 1));
  else
    stderr_line("phos: the driver's %.1f MiB buffer populated in %.1f ms, advised huge pages\n", double(length) / (1 << 20),
                double(took) / 1e6);
  errno = saved_errno;
  return p;
}

// The loaded object whose executable segment holds `data` (a function's
// address): its executable segments' span.
int note_code_of(dl_phdr_info* info, size_t, void* data) {
  const auto fn = reinterpret_cast<uintptr_t>(data);
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  bool holds = false;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
    const uintptr_t from = info->dlpi_addr + ph.p_vaddr, to = from + ph.p_memsz;
    holds = holds || (fn >= from && fn < to);
    lo = std::min(lo, from);
    hi = std::max(hi, to);
  }
  if (!holds) return 0;
  g_code_lo.store(lo, std::memory_order_relaxed);
  g_code_hi.store(hi, std::memory_order_relaxed);
  return 1;
}

}  // namespace

void note_driver_code(const void* driver_function) {
  if (!driver_function) return;
  if (!dl_iterate_phdr(note_code_of, const_cast<void*>(driver_function)))
    stderr_line("phos: libcuda's code not found among the loaded objects: the driver's checkpoint buffer is left "
                "in small pages\n");
}

}  // namespace phos::hooks

// mmap(2) as libc's, but for the driver's buffer (driver_buffer.h). Both
// names are defined under their own: with -D_FILE_OFFSET_BITS=64 cuda.h's
// <sys/mman.h> names mmap as mmap64, and the caller's address is each
// stand-in's own return address.
namespace {
void* mmap_from(const void* caller, void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  using namespace phos::hooks;
  MmapFn real = next_mmap();
  if (__builtin_expect(driver_buffer(length, prot, flags, caller), 0))
    return map_huge(real, addr, length, prot, flags, fd, offset);
  return real(addr, length, prot, flags, fd, offset);
}
}  // namespace

extern "C" __attribute__((visibility("default"))) void* phos_mmap_standin(void* addr, size_t length, int prot, int flags,
                                                                       int fd, off_t offset) __asm__("mmap");
extern "C" __attribute__((visibility("default"))) void* phos_mmap64_standin(void* addr, size_t length, int prot,
                                                                         int flags, int fd, off_t offset) __asm__("mmap64");

void* phos_mmap_standin(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  return mmap_from(__builtin_return_address(0), addr, length, prot, flags, fd, offset);
}
void* phos_mmap64_standin(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  return mmap_from(__builtin_return_address(0), addr, length, prot, flags, fd, offset);
}
