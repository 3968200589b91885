// Copies and sets: while launches are recorded or speculated, each cuMemcpy*
// and cuMemset* on linear device memory is recorded and given its exact set,
// from the ranges it reads and writes (pitched 2D/3D ones as their enclosing extent, call_ranges.h). Off,
// they cost what a generated wrapper costs plus one relaxed load.
//
// cuMemcpy / cuMemcpyAsync / cuMemcpyPeer take unified addresses: either
// side may be host memory, which the buffer index simply does not match.
// Copies from and to CUDA arrays record only their linear side. A batch of
// linear copies (cuMemcpyBatchAsync) is recorded copy by copy; stream
// memory operations (cuStreamWriteValue*) as sets of 4 or 8 bytes. 3D
// batches and cuStreamBatchMemOp are not recorded: while a dump's copy
// window is open they wait for its end (their write sets are not read).
//
// While a dump's copy window is open, copies between host and device memory
// (over PCIe) also tell it of themselves (HostTransfer), so that the engine
// can give way to them (PhOS §5): HtoD and DtoH, unified-address copies
// with one side in device memory, 2D and 3D copies with one side on the
// host. Device-to-device and peer copies do not cross the host's link;
// copies to and from CUDA arrays and batches of copies are not told.
#include "driver/driver.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;
namespace ranges = phos::hooks::ranges;

namespace {

// Copies and sets are described only while recording or speculating (a
// copy window turns speculation on).
inline bool tracked() {
  return __builtin_expect(runtime().launches.enabled() || runtime().speculation.active(), 0);
}

// Work queued into a stream being captured runs later, as part of a graph.
void note(RecordKind kind, const char* call, CUstream stream, bool per_thread, const ranges::RangeList& l) {
  if (stream_capturing(stream, per_thread)) return;
  if (runtime().launches.enabled()) runtime().launches.record_call(kind, call, stream, l);
  if (runtime().speculation.active()) runtime().speculation.on_call(l);
  if (runtime().copy_window.open()) runtime().copy_window.before_exact(l);
}

void note_copy(const char* call, CUstream stream, bool per_thread, CUdeviceptr dst, CUdeviceptr src, size_t n) {
  ranges::RangeList l;
  if (src) l.add(src, n, ranges::kRead);
  if (dst) l.add(dst, n, ranges::kWrite | ranges::kWholeWrite);
  note(RecordKind::kCopy, call, stream, per_thread, l);
}

bool on_device(CUmemorytype t) { return t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED; }

void note_copy_2d(const char* call, CUstream stream, bool per_thread, const CUDA_MEMCPY2D* c) {
  if (!c) return;
  ranges::RangeList l;
  if (on_device(c->srcMemoryType)) {
    auto e = ranges::pitched_2d(c->srcXInBytes, c->srcY, c->srcPitch, c->WidthInBytes, c->Height);
    l.add(c->srcDevice + e.offset, e.bytes, ranges::kRead);
  }
  if (on_device(c->dstMemoryType)) {
    auto e = ranges::pitched_2d(c->dstXInBytes, c->dstY, c->dstPitch, c->WidthInBytes, c->Height);
    l.add(c->dstDevice + e.offset, e.bytes, ranges::kWrite);
  }
  note(RecordKind::kCopy, call, stream, per_thread, l);
}

// CUDA_MEMCPY3D and CUDA_MEMCPY3D_PEER name these fields alike.
template <class Copy3D>
void note_copy_3d(const char* call, CUstream stream, bool per_thread, const Copy3D* c) {
  if (!c) return;
  ranges::RangeList l;
  if (on_device(c->srcMemoryType)) {
    auto e = ranges::pitched_3d(c->srcXInBytes, c->srcY, c->srcZ, c->srcPitch, c->srcHeight, c->WidthInBytes,
                                c->Height, c->Depth);
    l.add(c->srcDevice + e.offset, e.bytes, ranges::kRead);
  }
  if (on_device(c->dstMemoryType)) {
    auto e = ranges::pitched_3d(c->dstXInBytes, c->dstY, c->dstZ, c->dstPitch, c->dstHeight, c->WidthInBytes,
                                c->Height, c->Depth);
    l.add(c->dstDevice + e.offset, e.bytes, ranges::kWrite);
  }
  note(RecordKind::kCopy, call, stream, per_thread, l);
}

// `dense`: every byte of the range is set (no pitch gaps).
void note_set(const char* call, CUstream stream, bool per_thread, CUdeviceptr dst, uint64_t bytes, bool dense = true) {
  ranges::RangeList l;
  l.add(dst, bytes, ranges::kWrite | (dense ? ranges::kWholeWrite : 0));
  note(RecordKind::kSet, call, stream, per_thread, l);
}

void note_set_2d(const char* call, CUstream stream, bool per_thread, CUdeviceptr dst, size_t pitch, size_t width_bytes,
                 size_t height) {
  auto e = ranges::pitched_2d(0, 0, pitch, width_bytes, height);
  note_set(call, stream, per_thread, dst + e.offset, e.bytes, pitch == width_bytes || height <= 1);
}

// A program's own copy between host and device memory, told to an open
// copy window as queued, synchronous or not: the link is estimated busy for
// its bytes from now on. A synchronous call is not held as in flight for
// its length: it mostly waits for the stream's earlier work, and a window's
// close must not wait for it. Closed, it costs one relaxed load;
// `host_bytes` (the bytes that cross the link, 0: none) is asked only while
// a window is open.
class HostTransfer {
 public:
  template <class HostBytes>
  HostTransfer(bool /*async*/, HostBytes host_bytes) {
    CopyWindow& w = runtime().copy_window;
    if (__builtin_expect(!w.open(), 1)) return;
    const uint64_t bytes = host_bytes();
    if (bytes != 0) w.transfer_queued(bytes);
  }
  HostTransfer(const HostTransfer&) = delete;
  HostTransfer& operator=(const HostTransfer&) = delete;
};

// Device memory of the program: every device allocation is phos's.
bool device_memory(CUdeviceptr p) { return runtime().memory.address_range(p, nullptr, nullptr); }

// A unified-address copy crosses the link where one side is device memory
// and the other is not.
uint64_t unified_host_bytes(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return device_memory(dst) != device_memory(src) ? n : 0;
}

bool on_host(CUmemorytype t, CUdeviceptr unified) {
  return t == CU_MEMORYTYPE_HOST || (t == CU_MEMORYTYPE_UNIFIED && !device_memory(unified));
}

// A 2D or 3D copy of `bytes` crosses the link where one side is on the host.
template <class Copy>
uint64_t pitched_host_bytes(const Copy* c, uint64_t bytes) {
  if (!c) return 0;
  return on_host(c->srcMemoryType, c->srcDevice) != on_host(c->dstMemoryType, c->dstDevice) ? bytes : 0;
}
uint64_t host_bytes_2d(const CUDA_MEMCPY2D* c) {
  return c ? pitched_host_bytes(c, uint64_t(c->WidthInBytes) * c->Height) : 0;
}
template <class Copy3D>
uint64_t host_bytes_3d(const Copy3D* c) {
  return c ? pitched_host_bytes(c, uint64_t(c->WidthInBytes) * c->Height * c->Depth) : 0;
}

// A batch of linear copies, one record each.
void note_batch(const char* call, CUstream stream, bool per_thread, const CUdeviceptr* dsts, const CUdeviceptr* srcs,
                const size_t* sizes, size_t count) {
  if (!dsts || !srcs || !sizes) return;
  for (size_t i = 0; i < count; i++) note_copy(call, stream, per_thread, dsts[i], srcs[i], sizes[i]);
}

}  // namespace

// A hook that records `what` (a statement) before the real call.
#define PHOS_RECORDED_HOOK(name, params, args, what)   \
  extern "C" PHOS_EXPORT CUresult name params {        \
    GatePass pass(runtime().gate);                     \
    if (tracked()) what;                               \
    auto real = PHOS_REAL(name);                       \
    return real ? real args : CUDA_ERROR_NOT_FOUND;    \
  }

// The same for a copy that may cross the host's link: `async`, and the
// expression of its bytes that do (HostTransfer).
#define PHOS_TRANSFER_HOOK(name, params, args, what, async, host_bytes)    \
  extern "C" PHOS_EXPORT CUresult name params {                            \
    GatePass pass(runtime().gate);                                         \
    if (tracked()) what;                                                   \
    HostTransfer transfer(async, [&]() -> uint64_t { return host_bytes; }); \
    auto real = PHOS_REAL(name);                                           \
    return real ? real args : CUDA_ERROR_NOT_FOUND;                        \
  }

// Each entry point in its legacy-stream and per-thread-stream forms; the
// synchronous ones run on the default stream (nullptr).
#define PHOS_SYNC_HOOKS(macro, name) macro(name, false, nullptr) macro(name##_ptds, true, nullptr)
#define PHOS_ASYNC_HOOKS(macro, name) macro(name, false, s) macro(name##_ptsz, true, s)

#define PHOS_COPY_DTOD(name, per_thread, stream) \
  PHOS_RECORDED_HOOK(name, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n), \
                     note_copy(#name, stream, per_thread, dst, src, n))
#define PHOS_COPY_DTOD_ASYNC(name, per_thread, stream) \
  PHOS_RECORDED_HOOK(name, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), \
                     note_copy(#name, stream, per_thread, dst, src, n))
// Unified addresses: either side may be host memory.
#define PHOS_COPY_UNIFIED(name, per_thread, stream) \
  PHOS_TRANSFER_HOOK(name, (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n), \
                     note_copy(#name, stream, per_thread, dst, src, n), false, unified_host_bytes(dst, src, n))
#define PHOS_COPY_UNIFIED_ASYNC(name, per_thread, stream) \
  PHOS_TRANSFER_HOOK(name, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), \
                     note_copy(#name, stream, per_thread, dst, src, n), true, unified_host_bytes(dst, src, n))
PHOS_SYNC_HOOKS(PHOS_COPY_UNIFIED, cuMemcpy)
PHOS_ASYNC_HOOKS(PHOS_COPY_UNIFIED_ASYNC, cuMemcpyAsync)
PHOS_SYNC_HOOKS(PHOS_COPY_DTOD, cuMemcpyDtoD_v2)
PHOS_ASYNC_HOOKS(PHOS_COPY_DTOD_ASYNC, cuMemcpyDtoDAsync_v2)

#define PHOS_COPY_HTOD(name, per_thread, stream) \
  PHOS_TRANSFER_HOOK(name, (CUdeviceptr dst, const void* src, size_t n), (dst, src, n), \
                     note_copy(#name, stream, per_thread, dst, 0, n), false, n)
#define PHOS_COPY_HTOD_ASYNC(name, per_thread, stream) \
  PHOS_TRANSFER_HOOK(name, (CUdeviceptr dst, const void* src, size_t n, CUstream s), (dst, src, n, s), \
                     note_copy(#name, stream, per_thread, dst, 0, n), true, n)
PHOS_SYNC_HOOKS(PHOS_COPY_HTOD, cuMemcpyHtoD_v2)
PHOS_ASYNC_HOOKS(PHOS_COPY_HTOD_ASYNC, cuMemcpyHtoDAsync_v2)

#define PHOS_COPY_DTOH(name, per_thread, stream) \
  PHOS_TRANSFER_HOOK(name, (void* dst, CUdeviceptr src, size_t n), (dst, src, n), \
                     note_copy(#name, stream, per_thread, 0, src, n), false, n)
#define PHOS_COPY_DTOH_ASYNC(name, per_thread, stream) \
  PHOS_TRANSFER_HOOK(name, (void* dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s), \
                     note_copy(#name, stream, per_thread, 0, src, n), true, n)
PHOS_SYNC_HOOKS(PHOS_COPY_DTOH, cuMemcpyDtoH_v2)
PHOS_ASYNC_HOOKS(PHOS_COPY_DTOH_ASYNC, cuMemcpyDtoHAsync_v2)

#define PHOS_COPY_PEER(name, per_thread, stream)                                                               \
  PHOS_RECORDED_HOOK(name, (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n),      \
                     (dst, dctx, src, sctx, n), note_copy(#name, stream, per_thread, dst, src, n))
#define PHOS_COPY_PEER_ASYNC(name, per_thread, stream)                                                         \
  PHOS_RECORDED_HOOK(name,                                                                                     \
                     (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream s), \
                     (dst, dctx, src, sctx, n, s), note_copy(#name, stream, per_thread, dst, src, n))
PHOS_SYNC_HOOKS(PHOS_COPY_PEER, cuMemcpyPeer)
PHOS_ASYNC_HOOKS(PHOS_COPY_PEER_ASYNC, cuMemcpyPeerAsync)

#define PHOS_COPY_ATOD(name, per_thread, stream) \
  PHOS_RECORDED_HOOK(name, (CUdeviceptr dst, CUarray a, size_t offset, size_t n), (dst, a, offset, n), \
                     note_copy(#name, stream, per_thread, dst, 0, n))
#define PHOS_COPY_DTOA(name, per_thread, stream) \
  PHOS_RECORDED_HOOK(name, (CUarray a, size_t offset, CUdeviceptr src, size_t n), (a, offset, src, n), \
                     note_copy(#name, stream, per_thread, 0, src, n))
PHOS_SYNC_HOOKS(PHOS_COPY_ATOD, cuMemcpyAtoD_v2)
PHOS_SYNC_HOOKS(PHOS_COPY_DTOA, cuMemcpyDtoA_v2)

#define PHOS_COPY_2D(name, per_thread, stream) \
  PHOS_TRANSFER_HOOK(name, (const CUDA_MEMCPY2D* c), (c), note_copy_2d(#name, stream, per_thread, c), false, \
                     host_bytes_2d(c))
#define PHOS_COPY_2D_ASYNC(name, per_thread, stream) \
  PHOS_TRANSFER_HOOK(name, (const CUDA_MEMCPY2D* c, CUstream s), (c, s), note_copy_2d(#name, stream, per_thread, c), \
                     true, host_bytes_2d(c))
PHOS_SYNC_HOOKS(PHOS_COPY_2D, cuMemcpy2D_v2)
PHOS_SYNC_HOOKS(PHOS_COPY_2D, cuMemcpy2DUnaligned_v2)
PHOS_ASYNC_HOOKS(PHOS_COPY_2D_ASYNC, cuMemcpy2DAsync_v2)

#define PHOS_COPY_3D(name, per_thread, stream, type) \
  PHOS_TRANSFER_HOOK(name, (const type* c), (c), note_copy_3d(#name, stream, per_thread, c), false, host_bytes_3d(c))
#define PHOS_COPY_3D_ASYNC(name, per_thread, stream, type) \
  PHOS_TRANSFER_HOOK(name, (const type* c, CUstream s), (c, s), note_copy_3d(#name, stream, per_thread, c), true, \
                     host_bytes_3d(c))
PHOS_COPY_3D(cuMemcpy3D_v2, false, nullptr, CUDA_MEMCPY3D)
PHOS_COPY_3D(cuMemcpy3D_v2_ptds, true, nullptr, CUDA_MEMCPY3D)
PHOS_COPY_3D_ASYNC(cuMemcpy3DAsync_v2, false, s, CUDA_MEMCPY3D)
PHOS_COPY_3D_ASYNC(cuMemcpy3DAsync_v2_ptsz, true, s, CUDA_MEMCPY3D)
PHOS_COPY_3D(cuMemcpy3DPeer, false, nullptr, CUDA_MEMCPY3D_PEER)
PHOS_COPY_3D(cuMemcpy3DPeer_ptds, true, nullptr, CUDA_MEMCPY3D_PEER)
PHOS_COPY_3D_ASYNC(cuMemcpy3DPeerAsync, false, s, CUDA_MEMCPY3D_PEER)
PHOS_COPY_3D_ASYNC(cuMemcpy3DPeerAsync_ptsz, true, s, CUDA_MEMCPY3D_PEER)

// Sets of N elements of 1, 2 or 4 bytes, and their pitched 2D forms.
#define PHOS_SET(name, per_thread, stream, type, bytes) \
  PHOS_RECORDED_HOOK(name, (CUdeviceptr dst, type v, size_t n), (dst, v, n), \
                     note_set(#name, stream, per_thread, dst, uint64_t(n) * bytes))
#define PHOS_SET_ASYNC(name, per_thread, stream, type, bytes) \
  PHOS_RECORDED_HOOK(name, (CUdeviceptr dst, type v, size_t n, CUstream s), (dst, v, n, s), \
                     note_set(#name, stream, per_thread, dst, uint64_t(n) * bytes))
#define PHOS_SET_2D(name, per_thread, stream, type, bytes)                                                     \
  PHOS_RECORDED_HOOK(name, (CUdeviceptr dst, size_t pitch, type v, size_t w, size_t h), (dst, pitch, v, w, h), \
                     note_set_2d(#name, stream, per_thread, dst, pitch, uint64_t(w) * bytes, h))
#define PHOS_SET_2D_ASYNC(name, per_thread, stream, type, bytes)                                  \
  PHOS_RECORDED_HOOK(name, (CUdeviceptr dst, size_t pitch, type v, size_t w, size_t h, CUstream s), \
                     (dst, pitch, v, w, h, s), note_set_2d(#name, stream, per_thread, dst, pitch, uint64_t(w) * bytes, h))
#define PHOS_SET_FAMILY(bits, type)                                                  \
  PHOS_SET(cuMemsetD##bits##_v2, false, nullptr, type, bits / 8)                     \
  PHOS_SET(cuMemsetD##bits##_v2_ptds, true, nullptr, type, bits / 8)                 \
  PHOS_SET_ASYNC(cuMemsetD##bits##Async, false, s, type, bits / 8)                   \
  PHOS_SET_ASYNC(cuMemsetD##bits##Async_ptsz, true, s, type, bits / 8)               \
  PHOS_SET_2D(cuMemsetD2D##bits##_v2, false, nullptr, type, bits / 8)                \
  PHOS_SET_2D(cuMemsetD2D##bits##_v2_ptds, true, nullptr, type, bits / 8)            \
  PHOS_SET_2D_ASYNC(cuMemsetD2D##bits##Async, false, s, type, bits / 8)              \
  PHOS_SET_2D_ASYNC(cuMemsetD2D##bits##Async_ptsz, true, s, type, bits / 8)
PHOS_SET_FAMILY(8, unsigned char)
PHOS_SET_FAMILY(16, unsigned short)
PHOS_SET_FAMILY(32, unsigned int)

// A stream that waits for a value in device memory reads it: an on-demand
// restore fills it first.
void note_wait_value(const char* call, CUstream stream, bool per_thread, CUdeviceptr addr, uint64_t bytes) {
  ranges::RangeList l;
  l.add(addr, bytes, ranges::kRead);
  note(RecordKind::kCopy, call, stream, per_thread, l);
}

// Stream memory operations on 4 or 8 bytes at `addr`: a write (note_set)
// or a wait (note_wait_value).
#define PHOS_STREAM_VALUE(name, per_thread, type, bytes, noted)                                                  \
  PHOS_RECORDED_HOOK(name, (CUstream s, CUdeviceptr addr, type value, unsigned int flags), (s, addr, value, flags), \
                     noted(#name, s, per_thread, addr, bytes))
PHOS_STREAM_VALUE(cuStreamWriteValue32_v2, false, cuuint32_t, 4, note_set)
PHOS_STREAM_VALUE(cuStreamWriteValue32_v2_ptsz, true, cuuint32_t, 4, note_set)
PHOS_STREAM_VALUE(cuStreamWriteValue64_v2, false, cuuint64_t, 8, note_set)
PHOS_STREAM_VALUE(cuStreamWriteValue64_v2_ptsz, true, cuuint64_t, 8, note_set)
PHOS_STREAM_VALUE(cuStreamWaitValue32_v2, false, cuuint32_t, 4, note_wait_value)
PHOS_STREAM_VALUE(cuStreamWaitValue32_v2_ptsz, true, cuuint32_t, 4, note_wait_value)
PHOS_STREAM_VALUE(cuStreamWaitValue64_v2, false, cuuint64_t, 8, note_wait_value)
PHOS_STREAM_VALUE(cuStreamWaitValue64_v2_ptsz, true, cuuint64_t, 8, note_wait_value)

#define PHOS_COPY_BATCH(name, per_thread)                                                                     \
  PHOS_RECORDED_HOOK(name,                                                                                     \
                     (CUdeviceptr * dsts, CUdeviceptr * srcs, size_t * sizes, size_t count, CUmemcpyAttributes * attrs, \
                      size_t * attrs_idxs, size_t num_attrs, CUstream s),                                      \
                     (dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, s),                              \
                     note_batch(#name, s, per_thread, dsts, srcs, sizes, count))
PHOS_COPY_BATCH(cuMemcpyBatchAsync_v2, false)
PHOS_COPY_BATCH(cuMemcpyBatchAsync_v2_ptsz, true)

// Write sets not read: they wait for a copy window to close.
#define PHOS_UNKNOWN_WRITES_HOOK(name, params, args)  \
  extern "C" PHOS_EXPORT CUresult name params {       \
    GatePass pass(runtime().gate);                    \
    runtime().copy_window.before_unknown_call();      \
    auto real = PHOS_REAL(name);                      \
    return real ? real args : CUDA_ERROR_NOT_FOUND;   \
  }
PHOS_UNKNOWN_WRITES_HOOK(cuStreamBatchMemOp_v2, (CUstream s, unsigned int count, CUstreamBatchMemOpParams* ops, unsigned int flags),
                         (s, count, ops, flags))
PHOS_UNKNOWN_WRITES_HOOK(cuStreamBatchMemOp_v2_ptsz,
                         (CUstream s, unsigned int count, CUstreamBatchMemOpParams* ops, unsigned int flags),
                         (s, count, ops, flags))
PHOS_UNKNOWN_WRITES_HOOK(cuMemcpy3DBatchAsync_v2,
                         (size_t count, CUDA_MEMCPY3D_BATCH_OP* ops, unsigned long long flags, CUstream s),
                         (count, ops, flags, s))
PHOS_UNKNOWN_WRITES_HOOK(cuMemcpy3DBatchAsync_v2_ptsz,
                         (size_t count, CUDA_MEMCPY3D_BATCH_OP* ops, unsigned long long flags, CUstream s),
                         (count, ops, flags, s))
