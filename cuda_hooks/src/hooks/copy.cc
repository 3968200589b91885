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
// (over PCIe) also tell it of themselves (host_transfer), so that the engine
// can give way to them (PhOS §5): HtoD and DtoH, unified-address copies
// with one side in device memory, 2D and 3D copies with one side on the
// host. Device-to-device and peer copies do not cross the host's link;
// copies to and from CUDA arrays and batches of copies are not told.
//
// The hooks are written by gen_driver_table.py from copy_hooks.txt, one
// line per function: how it is recorded and what crosses the link, with
// cuda.h's prototype and per-thread-stream variants; the helpers they call
// are here.
#include "driver/driver.h"
#include "fault/gpu_fault.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;
namespace ranges = phos::hooks::ranges;

namespace {

// What the copy and set hooks use: the gate; the launch log and the
// speculation, which record them; a dump's copy window, told of their
// writes and of their transfers over the host's link; the device memory, to
// tell device pointers from host ones; the stream captures.
struct CopyDeps : RuntimeView {
  using RuntimeView::captures;
  using RuntimeView::copy_window;
  using RuntimeView::gate;
  using RuntimeView::launches;
  using RuntimeView::memory;
  using RuntimeView::speculation;
};

// Copies and sets are described only while recording or speculating (a
// copy window turns speculation on).
inline bool tracked(CopyDeps rt) {
  return __builtin_expect(rt.launches().enabled() || rt.speculation().active(), 0);
}

// Work queued into a stream being captured runs later, as part of a graph.
void note(CopyDeps rt, RecordKind kind, const char* call, CUstream stream, bool per_thread,
          const ranges::RangeList& l) {
  if (rt.captures().capturing(stream, per_thread)) return;
  if (rt.launches().enabled()) rt.launches().record_call(kind, call, stream, l);
  if (rt.speculation().active()) rt.speculation().on_call(l);
  if (rt.copy_window().open()) rt.copy_window().before_exact(l, call);
}

void note_copy(CopyDeps rt, const char* call, CUstream stream, bool per_thread, CUdeviceptr dst, CUdeviceptr src,
               size_t n) {
  ranges::RangeList l;
  if (src) l.add(src, n, ranges::kRead);
  if (dst) l.add(dst, n, ranges::kWrite | ranges::kWholeWrite);
  note(rt, RecordKind::kCopy, call, stream, per_thread, l);
}

bool on_device(CUmemorytype t) { return t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED; }

void note_copy_2d(CopyDeps rt, const char* call, CUstream stream, bool per_thread, const CUDA_MEMCPY2D* c) {
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
  note(rt, RecordKind::kCopy, call, stream, per_thread, l);
}

// CUDA_MEMCPY3D and CUDA_MEMCPY3D_PEER name these fields alike.
template <class Copy3D>
void note_copy_3d(CopyDeps rt, const char* call, CUstream stream, bool per_thread, const Copy3D* c) {
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
  note(rt, RecordKind::kCopy, call, stream, per_thread, l);
}

// `dense`: every byte of the range is set (no pitch gaps).
void note_set(CopyDeps rt, const char* call, CUstream stream, bool per_thread, CUdeviceptr dst, uint64_t bytes,
              bool dense = true) {
  ranges::RangeList l;
  l.add(dst, bytes, ranges::kWrite | (dense ? ranges::kWholeWrite : 0));
  note(rt, RecordKind::kSet, call, stream, per_thread, l);
}

void note_set_2d(CopyDeps rt, const char* call, CUstream stream, bool per_thread, CUdeviceptr dst, size_t pitch,
                 size_t width_bytes, size_t height) {
  auto e = ranges::pitched_2d(0, 0, pitch, width_bytes, height);
  note_set(rt, call, stream, per_thread, dst + e.offset, e.bytes, pitch == width_bytes || height <= 1);
}

// A stream that waits for a value in device memory reads it: an on-demand
// restore fills it first.
void note_wait_value(CopyDeps rt, const char* call, CUstream stream, bool per_thread, CUdeviceptr addr,
                     uint64_t bytes) {
  ranges::RangeList l;
  l.add(addr, bytes, ranges::kRead);
  note(rt, RecordKind::kCopy, call, stream, per_thread, l);
}

// A batch of linear copies, one record each.
void note_batch(CopyDeps rt, const char* call, CUstream stream, bool per_thread, const CUdeviceptr* dsts,
                const CUdeviceptr* srcs, const size_t* sizes, size_t count) {
  if (!dsts || !srcs || !sizes) return;
  for (size_t i = 0; i < count; i++) note_copy(rt, call, stream, per_thread, dsts[i], srcs[i], sizes[i]);
}

// A program's own copy between host and device memory, told to an open
// copy window as queued, synchronous or not: the link is estimated busy for
// its bytes from now on. A synchronous call is not held as in flight for
// its length: it mostly waits for the stream's earlier work, and a window's
// close must not wait for it. Closed, it costs one relaxed load; the bytes
// that cross the link (host_bytes_*, 0: none) are asked only while a window
// is open.
inline bool window_open(CopyDeps rt) { return __builtin_expect(rt.copy_window().open(), 0); }
void host_transfer(CopyDeps rt, uint64_t bytes) {
  if (bytes != 0) rt.copy_window().transfer_queued(bytes);
}

// Device memory of the program: every device allocation is phos's.
bool device_memory(CopyDeps rt, CUdeviceptr p) { return rt.memory().address_range(p, nullptr, nullptr); }

// A copy whose every byte crosses the link (host to device, device to host).
uint64_t host_bytes_all(CopyDeps, size_t n) { return n; }

// A unified-address copy crosses the link where one side is device memory
// and the other is not.
uint64_t host_bytes_unified(CopyDeps rt, CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return device_memory(rt, dst) != device_memory(rt, src) ? n : 0;
}

bool on_host(CopyDeps rt, CUmemorytype t, CUdeviceptr unified) {
  return t == CU_MEMORYTYPE_HOST || (t == CU_MEMORYTYPE_UNIFIED && !device_memory(rt, unified));
}

// A 2D or 3D copy of `bytes` crosses the link where one side is on the host.
template <class Copy>
uint64_t pitched_host_bytes(CopyDeps rt, const Copy* c, uint64_t bytes) {
  if (!c) return 0;
  return on_host(rt, c->srcMemoryType, c->srcDevice) != on_host(rt, c->dstMemoryType, c->dstDevice) ? bytes : 0;
}
uint64_t host_bytes_pitched_2d(CopyDeps rt, const CUDA_MEMCPY2D* c) {
  return c ? pitched_host_bytes(rt, c, uint64_t(c->WidthInBytes) * c->Height) : 0;
}
template <class Copy3D>
uint64_t host_bytes_pitched_3d(CopyDeps rt, const Copy3D* c) {
  return c ? pitched_host_bytes(rt, c, uint64_t(c->WidthInBytes) * c->Height * c->Depth) : 0;
}

}  // namespace

// The hooks themselves, one per line of copy_hooks.txt and per
// per-thread-stream variant: pass the gate, note the call while tracked(),
// tell an open window of a transfer, call the driver.
#include "copy_hooks.inc"
