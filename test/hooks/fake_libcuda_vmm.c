/* The fake libcuda's contexts and VMM memory, enough for libphos.so's device
 * memory to allocate, map, release and map back without a GPU. A context is
 * its device + 1; addresses are made up and never touched. Every
 * cuMemSetAccess is logged ("access ADDRESS SIZE DEVICE:FLAGS...") to the
 * file FAKE_CUDA_LOG names, with the marks the program adds (fake_mark).
 *
 * With FAKE_CUDA_MEMORY=1 the memory is real, in the program and in criu
 * alike (the plugin's engine runs on this fake too): a handle is a memfd of
 * its size, an address reservation a PROT_NONE mapping, a map the memfd
 * mapped there (MAP_SHARED), an exported handle the memfd itself; copies
 * and sets copy and set (fake_libcuda_copy.c), and the engine's kernels run
 * on the CPU (fake_libcuda_kernels.cc). A store of the program's own into
 * that memory is a write no hook sees, as a kernel's outside its
 * speculated set is. */
#define _GNU_SOURCE  /* memfd_create */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int fake_real_memory(void) {
  static int real = -1;
  if (real < 0) {
    const char *v = getenv("FAKE_CUDA_MEMORY");
    real = v && *v == '1';
  }
  return real;
}

/* Real memory: a handle names its memfd (fd + 1, so 0 stays invalid). */
static int fd_of(CUmemGenericAllocationHandle h) { return (int)h - 1; }
static CUmemGenericAllocationHandle handle_of(int fd) { return (CUmemGenericAllocationHandle)fd + 1; }

static __thread uintptr_t t_ctx[8];
static __thread int t_depth;
static CUdeviceptr g_next_va = 0x7f0000000000ull;
static CUmemGenericAllocationHandle g_next_handle = 1;

static void logline(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void logline(const char *fmt, ...) {
  const char *path = getenv("FAKE_CUDA_LOG");
  FILE *f = path ? fopen(path, "a") : NULL;
  if (!f) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fclose(f);
}

void fake_mark(const char *what) { logline("mark %s\n", what); }
void fake_log_driver_ipc(const char *name) { logline("driver ipc %s\n", name); }

__attribute__((visibility("protected"))) CUresult cuCtxSetCurrent(CUcontext c) { t_ctx[t_depth] = (uintptr_t)c; return CUDA_SUCCESS; }
int fake_current_device(void) { return (int)t_ctx[t_depth] - 1; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = (CUcontext)t_ctx[t_depth]; return CUDA_SUCCESS; }
CUresult cuCtxGetDevice(CUdevice *d) {
  if (!t_ctx[t_depth]) return CUDA_ERROR_INVALID_CONTEXT;
  *d = (CUdevice)(t_ctx[t_depth] - 1);
  return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice_v2(CUdevice *d, CUcontext c) { *d = (CUdevice)((uintptr_t)c - 1); return CUDA_SUCCESS; }
CUresult cuCtxPushCurrent(CUcontext c) {
  if (t_depth == 7) return CUDA_ERROR_INVALID_VALUE;
  t_ctx[++t_depth] = (uintptr_t)c;
  return CUDA_SUCCESS;
}
CUresult cuCtxPopCurrent(CUcontext *c) {
  if (t_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (c) *c = (CUcontext)t_ctx[t_depth];
  t_depth--;
  return CUDA_SUCCESS;
}
void fake_wait_streams(void); /* fake_libcuda_events.c: the host functions queued */
int fake_streams_busy(void);
CUresult cuCtxSynchronize(void) { fake_wait_streams(); return CUDA_SUCCESS; }

/* The limits that size a context's device state (stack, printf FIFO, malloc
 * heap), per context, from the driver's defaults; every set is logged
 * ("limit CTX NAME VALUE"). FAKE_LIMIT_REFUSE=NAME refuses sets of that one
 * (CUDA_ERROR_INVALID_VALUE), as the driver does for the FIFO and the heap
 * once a kernel used printf or malloc. */
static const char *const g_limit_names[] = {"stack", "printf_fifo", "malloc_heap"};
static size_t g_limits[9][3];
static int g_limits_set[9];
static size_t *limit_slot(CUlimit limit) {
  uintptr_t c = t_ctx[t_depth];
  if (c == 0 || c > 8 || (unsigned)limit > CU_LIMIT_MALLOC_HEAP_SIZE) return NULL;
  if (!g_limits_set[c]) {
    g_limits_set[c] = 1;
    g_limits[c][0] = 1024;
    g_limits[c][1] = 1u << 20;
    g_limits[c][2] = 8u << 20;
  }
  return &g_limits[c][limit];
}
CUresult cuCtxGetLimit(size_t *value, CUlimit limit) {
  size_t *slot = limit_slot(limit);
  if (!slot) return CUDA_ERROR_INVALID_VALUE;
  *value = *slot;
  return CUDA_SUCCESS;
}
CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  size_t *slot = limit_slot(limit);
  if (!slot) return CUDA_ERROR_INVALID_VALUE;
  const char *refuse = getenv("FAKE_LIMIT_REFUSE");
  if (refuse && !strcmp(refuse, g_limit_names[limit])) return CUDA_ERROR_INVALID_VALUE;
  *slot = value;
  logline("limit %lu %s %zu\n", (unsigned long)t_ctx[t_depth], g_limit_names[limit], value);
  return CUDA_SUCCESS;
}
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) { (void)peer; (void)flags; return CUDA_SUCCESS; }
CUresult cuCtxDisablePeerAccess(CUcontext peer) { (void)peer; return CUDA_SUCCESS; }
/* An sm_90 device (the speculation reads that cubin of a fatbin); 0 for
 * anything else. FAKE_CUDA_EXCLUSIVE_DEVICE=N: device N is in the
 * exclusive-process compute mode. */
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
  const char *exclusive = getenv("FAKE_CUDA_EXCLUSIVE_DEVICE");
  if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)
    *v = exclusive && atoi(exclusive) == (int)d ? CU_COMPUTEMODE_EXCLUSIVE_PROCESS : CU_COMPUTEMODE_DEFAULT;
  else
    *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : 0;
  return CUDA_SUCCESS;
}

/* GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadae0N for device N. */
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice d) {
  for (int i = 0; i < 16; i++) uuid->bytes[i] = (char)(0xa0 + i);
  uuid->bytes[15] = (char)d;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags o) {
  (void)p; (void)o;
  *g = 2u << 20;
  return CUDA_SUCCESS;
}
CUresult cuMemAddressReserve(CUdeviceptr *va, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
  (void)align; (void)flags;
  if (fake_real_memory()) {
    void *p = mmap((void *)addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *va = (CUdeviceptr)p;
    return CUDA_SUCCESS;
  }
  *va = __atomic_fetch_add(&g_next_va, size, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr va, size_t size) {
  if (fake_real_memory() && munmap((void *)va, size) != 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
/* Real memory: the memfd is named after its GPU ("fake-gpu-N"), so that
 * wherever it is mapped, in the program or in criu, its GPU is known
 * (fake_libcuda_copy.c). */
/* FAKE_CUDA_BUDGET_MIB (real memory): the GPU holds that much, and what
 * this process maps of it (its own memory and a dump's copy-on-write pool,
 * each memfd once) is what is used; a creation past it is out of memory.
 * Only where the variable is set (a workload sets it for itself: criu's
 * engine creates the pool unbounded). */
static unsigned long long fake_mapped_gpu_bytes(void) {
  FILE *maps = fopen("/proc/self/maps", "r");
  if (!maps) return 0;
  char line[512];
  unsigned long long total = 0, inodes[256];
  int n = 0;
  while (fgets(line, sizeof(line), maps)) {
    unsigned long long start, end, inode;
    if (!strstr(line, "/memfd:fake-gpu-") || sscanf(line, "%llx-%llx %*s %*s %*s %llu", &start, &end, &inode) != 3)
      continue;
    int seen = 0;
    for (int i = 0; i < n; i++) seen |= inodes[i] == inode;
    if (seen) continue;
    if (n < 256) inodes[n++] = inode;
    total += end - start;
  }
  fclose(maps);
  return total;
}
static int fake_over_budget(size_t size) {
  const char *v = getenv("FAKE_CUDA_BUDGET_MIB");
  if (!v || !*v) return 0;
  return fake_mapped_gpu_bytes() + size > strtoull(v, NULL, 10) << 20;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *p, unsigned long long f) {
  (void)f;
  if (fake_real_memory() && fake_over_budget(size)) return CUDA_ERROR_OUT_OF_MEMORY;
  if (fake_real_memory()) {
    char name[32];
    snprintf(name, sizeof(name), "fake-gpu-%d", p ? p->location.id : 0);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
      if (fd >= 0) close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = handle_of(fd);
    return CUDA_SUCCESS;
  }
  *h = __atomic_fetch_add(&g_next_handle, 1, __ATOMIC_RELAXED);
  return CUDA_SUCCESS;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  if (fake_real_memory() && close(fd_of(h)) != 0) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}
CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long f) {
  (void)f;
  if (fake_real_memory() &&
      mmap((void *)va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_of(h), (off_t)offset) == MAP_FAILED)
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
/* Access granted by cuMemSetAccess, per mapped range and GPU, so that a
 * device-to-device copy in one GPU's context may reach another GPU's memory
 * mapped with access for it (peer to peer, fake_libcuda_copy.c), as the
 * driver allows; cuMemUnmap takes it away. */
#include <pthread.h>
enum { kMaxGrants = 4096 };
static struct { CUdeviceptr va; size_t size; int device; } g_grants[kMaxGrants];
static int g_ngrants;
static pthread_mutex_t g_grants_mu = PTHREAD_MUTEX_INITIALIZER;

static void grant(CUdeviceptr va, size_t size, int device, int allowed) {
  pthread_mutex_lock(&g_grants_mu);
  int i = 0;
  while (i < g_ngrants && !(g_grants[i].va == va && g_grants[i].device == device)) i++;
  if (!allowed && i < g_ngrants) {
    g_grants[i] = g_grants[--g_ngrants];
  } else if (allowed && i == g_ngrants && g_ngrants < kMaxGrants) {
    g_grants[g_ngrants].va = va;
    g_grants[g_ngrants].size = size;
    g_grants[g_ngrants++].device = device;
  }
  pthread_mutex_unlock(&g_grants_mu);
}

static void revoke_range(CUdeviceptr va, size_t size) {
  pthread_mutex_lock(&g_grants_mu);
  for (int i = 0; i < g_ngrants;)
    if (g_grants[i].va < va + size && va < g_grants[i].va + g_grants[i].size)
      g_grants[i] = g_grants[--g_ngrants];
    else
      i++;
  pthread_mutex_unlock(&g_grants_mu);
}

int fake_gpu_may_access(unsigned long long addr, int device) {
  int may = 0;
  pthread_mutex_lock(&g_grants_mu);
  for (int i = 0; i < g_ngrants && !may; i++)
    may = g_grants[i].device == device && addr >= g_grants[i].va && addr < g_grants[i].va + g_grants[i].size;
  pthread_mutex_unlock(&g_grants_mu);
  return may;
}

/* Back to a reservation: the range stays the program's, without memory. */
CUresult cuMemUnmap(CUdeviceptr va, size_t size) {
  revoke_range(va, size);
  if (fake_real_memory() &&
      mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
CUresult cuMemSetAccess(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count) {
  char line[512];
  int n = snprintf(line, sizeof(line), "access 0x%llx %zu", (unsigned long long)va, size);
  for (size_t i = 0; i < count && n < (int)sizeof(line); i++) {
    n += snprintf(line + n, sizeof(line) - (size_t)n, " %d:%d", desc[i].location.id, (int)desc[i].flags);
    grant(va, size, desc[i].location.id, desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE);
  }
  logline("%s\n", line);
  return CUDA_SUCCESS;
}
/* libphos.so answers every allocation itself; a program linked against the
 * fake needs the symbol. With real memory, criu's engine allocates its
 * bounce buffers (and snapshots) here: a mapping with its size before it. */
CUresult cuMemAlloc(CUdeviceptr *p, size_t size) {
  if (!fake_real_memory()) return CUDA_ERROR_NOT_SUPPORTED;
  void *m = mmap(NULL, size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  *(size_t *)m = size;
  *p = (CUdeviceptr)m + 4096;
  return CUDA_SUCCESS;
}
/* As cuMemAlloc: libphos.so answers a pitched allocation itself. */
CUresult cuMemAllocPitch(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned int element_size) {
  (void)p; (void)pitch; (void)width; (void)height; (void)element_size;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuMemFree(CUdeviceptr p) {
  if (!fake_real_memory() || !p) return CUDA_SUCCESS;
  void *m = (void *)(p - 4096);
  return munmap(m, *(size_t *)m + 4096) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* What a copy window (copy_window.h) opens in the process: the device's
 * primary context and a stream of its own. */
CUresult cuDeviceGet(CUdevice *d, int ordinal) { *d = ordinal; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { *c = (CUcontext)(uintptr_t)(d + 1); return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRelease(CUdevice d) { (void)d; return CUDA_SUCCESS; }
CUresult cuStreamCreate(CUstream *s, unsigned int flags) { (void)flags; *s = (CUstream)0x5; return CUDA_SUCCESS; }
CUresult cuStreamDestroy(CUstream s) { (void)s; return CUDA_SUCCESS; }
/* Stream capture of one stream at a time: what a test of a record into a
 * capture needs (phos asks whether the stream is capturing). */
static CUstream g_captured;
static CUstreamCaptureMode g_capture_mode;
static int g_capture_invalidated;
static __thread CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  if (!s || g_captured) return CUDA_ERROR_ILLEGAL_STATE;
  g_captured = s;
  g_capture_mode = mode;
  g_capture_invalidated = 0;
  return CUDA_SUCCESS;
}
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  CUstreamCaptureMode was = t_capture_mode;
  t_capture_mode = *mode;
  *mode = was;
  return CUDA_SUCCESS;
}
/* As the driver: an unsafe call (a synchronize) on a thread that is not in
 * relaxed mode while a capture in global mode runs fails, and invalidates
 * that capture. */
int fake_capture_forbids_unsafe(void) {
  if (!g_captured || g_capture_mode != CU_STREAM_CAPTURE_MODE_GLOBAL ||
      t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
    return 0;
  g_capture_invalidated = 1;
  return 1;
}
CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) {
  *status = s && s == g_captured ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture(CUstream s, CUgraph *graph) {
  if (!s || s != g_captured) return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  g_captured = NULL;
  if (g_capture_invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  *graph = (CUgraph)0x6;
  return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream s) { (void)s; fake_wait_streams(); return CUDA_SUCCESS; }
/* Other work ran at its call; host functions may still be queued. */
CUresult cuStreamQuery(CUstream s) { (void)s; return fake_streams_busy() ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS; }

/* Shareable handles: an fd that names the handle (a memfd holding its
 * value), so that memory can leave the process and come back, as the plugin
 * does with it across a checkpoint. An import gives a new handle. */
CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                                      unsigned long long flags) {
  (void)type; (void)flags;
  if (fake_real_memory()) {
    int fd = fcntl(fd_of(h), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
    *(int *)out = fd;
    return CUDA_SUCCESS;
  }
  int fd = memfd_create("fake-cuda-memory", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (write(fd, &h, sizeof(h)) != (ssize_t)sizeof(h)) {
    close(fd);
    return CUDA_ERROR_UNKNOWN;
  }
  *(int *)out = fd;
  return CUDA_SUCCESS;
}
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle,
                                        CUmemAllocationHandleType type) {
  (void)type;
  if (fake_real_memory()) {
    int fd = fcntl((int)(intptr_t)os_handle, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
    *h = handle_of(fd);
    return CUDA_SUCCESS;
  }
  CUmemGenericAllocationHandle named = 0;
  if (pread((int)(intptr_t)os_handle, &named, sizeof(named), 0) != (ssize_t)sizeof(named) || !named)
    return CUDA_ERROR_INVALID_VALUE;
  *h = __atomic_fetch_add(&g_next_handle, 1, __ATOMIC_RELAXED);
  logline("import %llu\n", (unsigned long long)named);
  return CUDA_SUCCESS;
}
