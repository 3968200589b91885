// Device allocations: every cuMemAlloc / pitch / async / pool allocation of
// the program becomes phos VMM memory (device_memory.h). Managed memory
// still works but makes the process impossible to checkpoint; it is
// recorded so a dump can say so. CUDA IPC: hooks/ipc.cc.
#include "driver/driver.h"
#include "phos/images/format.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;
namespace image = phos::image;

namespace {

// What the allocation hooks use: the gate, the device memory, the counters,
// the calls that make a checkpoint impossible, the stream captures, the
// memory cuBLAS allocates for itself.
struct MemoryDeps : RuntimeView {
  using RuntimeView::captures;
  using RuntimeView::counters;
  using RuntimeView::gate;
  using RuntimeView::library_memory;
  using RuntimeView::memory;
  using RuntimeView::unsupported;
};

constexpr size_t kPitchAlignment = 512;

CUresult allocate(MemoryDeps rt, CUdeviceptr* dptr, size_t size, uint32_t flags, const char* call) {
  CUresult r = rt.memory().allocate(dptr, size, flags, call);
  if (r == CUDA_SUCCESS) {
    rt.counters().count(Counter::kAllocations);
    if (flags & image::kAllocAsync) rt.counters().count(Counter::kAsyncAllocations);
    // Made inside a cuBLAS call (its workspace pool): written by its calls
    // beside their arguments (library_memory.h).
    if (LibraryMemory::inside()) rt.library_memory().allocated(*dptr, size);
  }
  return r;
}

void freed(MemoryDeps rt, CUdeviceptr ptr) {
  rt.counters().count(Counter::kFrees);
  rt.library_memory().freed(ptr);
}

// Stream-ordered allocation. phos memory is valid at once, which satisfies
// the stream order; inside a stream capture the driver's own graph memory
// nodes are used (and recorded as `captured`: phos does not checkpoint them
// yet).
template <class Real>
CUresult allocate_async(CallKind kind, const char* call, CUdeviceptr* dptr, size_t size, CUstream stream,
                        bool per_thread, const char* captured, Real&& real) {
  const MemoryDeps rt;
  GatePass pass(rt.gate(), kind);
  if (rt.captures().capturing(stream, per_thread)) {
    rt.unsupported().note(captured);
    return rt.memory().create(captured, size, real);
  }
  return allocate(rt, dptr, size, image::kAllocAsync, call);
}

template <class Real>
CUresult free_async(CallKind kind, CUdeviceptr ptr, CUstream stream, bool per_thread, Real&& real) {
  const MemoryDeps rt;
  GatePass pass(rt.gate(), kind);
  CUresult r = CUDA_SUCCESS;
  if (!rt.captures().capturing(stream, per_thread) && rt.memory().free_after(ptr, stream, per_thread, &r)) {
    if (r == CUDA_SUCCESS) freed(rt, ptr);
    return r;
  }
  rt.counters().count(Counter::kForeignFrees);
  return real();
}

}  // namespace

extern "C" PHOS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  const MemoryDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemAlloc_v2));
  // The driver's answer to a request phos does not serve.
  if (bytesize == 0)
    return rt.memory().create("cuMemAlloc_v2", 0, [&] { return PHOS_REAL(cuMemAlloc_v2)(dptr, bytesize); });
  return allocate(rt, dptr, bytesize, 0, "cuMemAlloc_v2");
}

extern "C" PHOS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                                   unsigned int element_size) {
  const MemoryDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemAllocPitch_v2));
  // The driver's answer to a request phos does not serve.
  if (!pitch || width == 0 || height == 0 || (element_size != 4 && element_size != 8 && element_size != 16))
    return rt.memory().create("cuMemAllocPitch_v2", uint64_t(width) * height,
                              [&] { return PHOS_REAL(cuMemAllocPitch_v2)(dptr, pitch, width, height, element_size); });
  size_t p = align_up(width, kPitchAlignment);
  CUresult r = allocate(rt, dptr, p * height, image::kAllocPitched, "cuMemAllocPitch_v2");
  if (r == CUDA_SUCCESS) *pitch = p;
  return r;
}

extern "C" PHOS_EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
  const MemoryDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemFree_v2));
  CUresult r = CUDA_SUCCESS;
  if (rt.memory().free(ptr, &r)) {
    if (r == CUDA_SUCCESS) freed(rt, ptr);
    return r;
  }
  rt.counters().count(Counter::kForeignFrees);
  return PHOS_REAL(cuMemFree_v2)(ptr);
}

extern "C" PHOS_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t size, CUstream stream) {
  return allocate_async(PHOS_CALL_KIND(cuMemAllocAsync), "cuMemAllocAsync", dptr, size, stream, false,
                        "cuMemAllocAsync during stream capture",
                        [&] { return PHOS_REAL(cuMemAllocAsync)(dptr, size, stream); });
}
extern "C" PHOS_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t size, CUstream stream) {
  return allocate_async(PHOS_CALL_KIND(cuMemAllocAsync_ptsz), "cuMemAllocAsync_ptsz", dptr, size, stream, true,
                        "cuMemAllocAsync during stream capture",
                        [&] { return PHOS_REAL(cuMemAllocAsync_ptsz)(dptr, size, stream); });
}
extern "C" PHOS_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t size, CUmemoryPool pool,
                                                        CUstream stream) {
  return allocate_async(PHOS_CALL_KIND(cuMemAllocFromPoolAsync), "cuMemAllocFromPoolAsync", dptr, size, stream, false,
                        "cuMemAllocFromPoolAsync during stream capture",
                        [&] { return PHOS_REAL(cuMemAllocFromPoolAsync)(dptr, size, pool, stream); });
}
extern "C" PHOS_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t size, CUmemoryPool pool,
                                                             CUstream stream) {
  return allocate_async(PHOS_CALL_KIND(cuMemAllocFromPoolAsync_ptsz), "cuMemAllocFromPoolAsync_ptsz", dptr, size, stream, true,
                        "cuMemAllocFromPoolAsync during stream capture",
                        [&] { return PHOS_REAL(cuMemAllocFromPoolAsync_ptsz)(dptr, size, pool, stream); });
}
extern "C" PHOS_EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) {
  return free_async(PHOS_CALL_KIND(cuMemFreeAsync), ptr, stream, false,
                    [&] { return PHOS_REAL(cuMemFreeAsync)(ptr, stream); });
}
extern "C" PHOS_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream stream) {
  return free_async(PHOS_CALL_KIND(cuMemFreeAsync_ptsz), ptr, stream, true,
                    [&] { return PHOS_REAL(cuMemFreeAsync_ptsz)(ptr, stream); });
}

// A sub-allocation's own range, not its slab's.
extern "C" PHOS_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  const MemoryDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemGetAddressRange_v2));
  if (rt.memory().address_range(ptr, base, size)) return CUDA_SUCCESS;
  return PHOS_REAL(cuMemGetAddressRange_v2)(base, size, ptr);
}

extern "C" PHOS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t size, unsigned int flags) {
  const MemoryDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemAllocManaged));
  rt.unsupported().note("cuMemAllocManaged");
  return rt.memory().create("cuMemAllocManaged", size, [&] { return PHOS_REAL(cuMemAllocManaged)(dptr, size, flags); });
}

namespace {

// The device of `ctx`: cuCtxGetDevice_v2 (CUDA 12.8+), or with `ctx` made
// current for a moment on older drivers.
CUresult device_of(CUcontext ctx, CUdevice* dev) {
  if (auto v2 = PHOS_REAL(cuCtxGetDevice_v2)) return v2(dev, ctx);
  CUresult r = PHOS_REAL(cuCtxPushCurrent_v2)(ctx);
  if (r != CUDA_SUCCESS) return r;
  r = PHOS_REAL(cuCtxGetDevice)(dev);
  CUcontext popped = nullptr;
  PHOS_REAL(cuCtxPopCurrent_v2)(&popped);
  return r;
}

}  // namespace

// Peer access covers the driver's own allocations only: phos's memory on the
// peer's device gets the access set on its mappings (device_memory.h).
extern "C" PHOS_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  const MemoryDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuCtxEnablePeerAccess));
  CUresult r = PHOS_REAL(cuCtxEnablePeerAccess)(peer, flags);
  CUdevice self = 0, owner = 0;
  if (r != CUDA_SUCCESS || PHOS_REAL(cuCtxGetDevice)(&self) != CUDA_SUCCESS || device_of(peer, &owner) != CUDA_SUCCESS)
    return r;
  r = rt.memory().peer_access_enabled(owner, self);
  // All or nothing: the program sees peer access fail rather than fault later.
  if (r != CUDA_SUCCESS) {
    rt.memory().peer_access_disabled(owner, self);
    PHOS_REAL(cuCtxDisablePeerAccess)(peer);
  }
  return r;
}

extern "C" PHOS_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer) {
  const MemoryDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuCtxDisablePeerAccess));
  CUresult r = PHOS_REAL(cuCtxDisablePeerAccess)(peer);
  CUdevice self = 0, owner = 0;
  if (r == CUDA_SUCCESS && PHOS_REAL(cuCtxGetDevice)(&self) == CUDA_SUCCESS && device_of(peer, &owner) == CUDA_SUCCESS)
    rt.memory().peer_access_disabled(owner, self);
  return r;
}
