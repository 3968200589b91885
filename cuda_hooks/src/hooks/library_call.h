// Library functions libphos.so stands in for (cuBLAS, NCCL): the real one is
// always called; while launches are recorded, the call is recorded first with
// the ranges it reads and writes, and the work it issues names it. They do
// not pass the gate: the driver calls they make do. Each hook opens a count
// of its own (PHOS_LIBRARY_SCOPE, call_cycles.h), around the real call of
// which phos's clock stops (the driver calls the library makes there count
// for themselves).
#pragma once

#include <optional>

#include "driver/library_next.h"
#include "runtime.h"

namespace phos::hooks {

// What a library call uses: the launch log and the speculation, which
// record it, a dump's copy window, the stream captures.
struct LibraryDeps : RuntimeView {
  using RuntimeView::captures;
  using RuntimeView::copy_window;
  using RuntimeView::launches;
  using RuntimeView::speculation;
};

struct LibraryCall {
  CUstream stream = nullptr;
  ranges::RangeList ranges;
};

// `describe` (-> LibraryCall) runs only while recording or speculating; the
// kernels the call issues are covered by its exact set, which must hold
// every byte they may write: besides the buffers the arguments name, the
// library's scratch memory (a cuBLAS GEMM's: the handle's workspace and the
// memory cuBLAS allocated for itself, library_memory.h). A write outside it
// is seen by nothing until checksum trust refuses the image.
template <class Describe, class Real>
auto library_call(const char* call, Describe&& describe, Real&& real) {
  const LibraryDeps rt;
  bool recording = rt.launches().enabled(), speculating = rt.speculation().active();
  if (__builtin_expect(!recording && !speculating, 1)) return forwarded_call(kInnermostScope, real);
  LibraryCall c = describe();
  // Queued into a graph being captured: it runs later, with the graph.
  if (rt.captures().capturing(c.stream, false)) return forwarded_call(kInnermostScope, real);
  std::optional<LibraryCallScope> scope;
  if (recording) scope.emplace(rt.launches().record_call(RecordKind::kLibrary, call, c.stream, c.ranges));
  if (!speculating) return forwarded_call(kInnermostScope, real);
  rt.speculation().on_call(c.ranges);
  // The window's number read first: one that opens in between is checked
  // again at the call's first kernel (CopyWindow::before_kernel), never missed.
  const uint64_t window = rt.copy_window().sequence();
  uint64_t checked = 0;
  if (rt.copy_window().open()) {
    rt.copy_window().before_library(c.ranges, call);
    checked = window;
  }
  LaunchSpeculation::ExactScope exact(&c.ranges, call, checked);
  return forwarded_call(kInnermostScope, real);
}

inline uint64_t address_of(const void* p) { return reinterpret_cast<uint64_t>(p); }

}  // namespace phos::hooks
