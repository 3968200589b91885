// Kernel launches: counted, and recorded (launch_log.h) and speculated
// (launch_speculation.h) while a protocol needs it. A launch with a feature
// on looks its kernel up once in the kernel registry (kernel_registry.h)
// and hands the entry to each; with none on it looks nothing up.
#include "driver/driver.h"
#include "fault/gpu_fault.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;

namespace {

// What the launch hooks use: the gate, the counters, the kernel registry
// and the features it serves (launch log, speculation, validation), a
// dump's copy window, the stream captures.
struct LaunchDeps : RuntimeView {
  using RuntimeView::captures;
  using RuntimeView::copy_window;
  using RuntimeView::counters;
  using RuntimeView::gate;
  using RuntimeView::kernels;
  using RuntimeView::launches;
  using RuntimeView::speculation;
  using RuntimeView::validation;
};

// Every launch: counted; recorded and speculated while that is on. A launch
// into a stream being captured runs later, with its graph (counted there).
// `writes` (while validating, or a copy window is open) gets the launch's
// speculated write set. The kernel's registry entry where it was looked up;
// null where nothing was on.
inline Kernel* seen(LaunchDeps rt, bool capturing, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                    unsigned by, unsigned bz, unsigned shmem, CUstream stream, void** params, void** extra,
                    WriteRanges* writes = nullptr) {
  if (__builtin_expect(capturing, 0)) {
    rt.counters().count(Counter::kCapturedLaunches);
    return nullptr;
  }
  rt.counters().count(Counter::kLaunches);
  bool recording = rt.launches().enabled(), speculating = rt.speculation().active();
  if (__builtin_expect(!recording && !speculating, 1)) return nullptr;
  Kernel& kernel = rt.kernels().get(f);
  LaunchSet set;
  if (speculating) rt.speculation().on_kernel(kernel, params, extra, recording ? &set : nullptr, writes);
  if (recording) {
    const uint32_t grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    rt.launches().record(kernel, grid, block, shmem, stream, params, extra, speculating ? &set : nullptr);
  }
  return &kernel;
}

// While validation is on, a kernel with a twin runs as its twin, and one
// validated at the SASS level runs in its patched module
// (launch_validation.h), with the write set seen() speculated (known only
// then, and never for a captured launch) for `kernel`, the entry seen()
// looked up (null where it looked none up); `launch_twin` launches a
// function with kernelParams. True with *result when that launch was made;
// false: the caller launches the original, holding *unvalidated (a
// SASS-validated kernel's launch that is not validated this time must not
// run inside another launch's table window: the table is set per function).
template <class LaunchTwin>
bool ran_as_twin(LaunchDeps rt, bool validating, Kernel* kernel, CUfunction f, void** params, void** extra,
                 uint32_t shmem, CUstream stream, const WriteRanges& writes, LaunchTwin&& launch_twin,
                 CUresult* result, std::unique_lock<std::mutex>* unvalidated) {
  if (__builtin_expect(!validating, 1)) return false;
  LaunchValidation::Prepared twin;
  if (kernel && writes.known && rt.validation().prepare(*kernel, params, extra, shmem, writes, &twin)) {
    *result = launch_twin(twin.launch, twin.launch_params);
    if (rt.validation().finish(twin, *result, stream)) return true;
  }
  *unvalidated = rt.validation().hold_unvalidated(kernel ? kernel : rt.kernels().find(f));
  return false;
}

// On-demand restore with validation on: a kernel with a fill twin waits
// only for its speculated sets, then runs as the twin, checked against the
// memory that is in, and is waited for; one that touched memory not yet in
// ends the process (copy_window.h). False: the caller launches the
// original, which waits for the whole fill.
template <class Launch>
bool ran_as_fill_twin(LaunchDeps rt, Kernel* kernel, void** params, void** extra, uint32_t shmem, CUstream stream,
                      const WriteRanges& sets, Launch&& launch, CUresult* result) {
  if (!kernel || !sets.known || !rt.validation().active()) return false;
  auto allowed = rt.copy_window().before_fill_twin(sets);
  if (!allowed) return false;
  LaunchValidation::Prepared twin;
  if (!rt.validation().prepare_fill(*kernel, params, extra, shmem, *allowed, &twin)) return false;
  *result = launch(twin.launch, twin.launch_params, nullptr);
  auto v = rt.validation().finish_fill(twin, *result, stream);
  if (!v && *result != CUDA_SUCCESS) return false;  // not launched: the original goes after the whole fill
  // Launched, but what it touched cannot be known: it may have computed on
  // memory not yet in.
  if (!v) rt.copy_window().fill_failed(v.error());
  if (v->count) rt.copy_window().touched_unfilled(rt.validation().kernel_name(twin), v->first_address, v->count);
  return true;
}

// A launch through cuLaunchKernel or cuLaunchKernelEx: seen(), then while
// validating its twin or patched run (ran_as_twin), else the original.
// `launch(f, params, extra)` makes the real call with the hook's other
// arguments.
template <class Launch>
inline CUresult launch_kernel(LaunchDeps rt, bool per_thread, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                              unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream stream, void** params,
                              void** extra, Launch&& launch) {
  if (gpu_fault::fails()) return CUDA_ERROR_ILLEGAL_ADDRESS;  // PHOS_FAULT=gpu-error (gpu_fault.h)
  const bool capturing = rt.captures().capturing(stream, per_thread);
  const bool validating = rt.validation().active();
  // A launch into a capture runs with its graph (which waits there).
  const bool window = __builtin_expect(rt.copy_window().open(), 0) && !capturing;
  WriteRanges writes;
  Kernel* kernel = seen(rt, capturing, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra,
                        validating || window ? &writes : nullptr);
  CUresult r;
  if (window && rt.copy_window().filling_open() &&
      ran_as_fill_twin(rt, kernel, params, extra, shmem, stream, writes, launch, &r))
    return r;
  std::unique_lock<std::mutex> unvalidated;
  auto launch_twin = [&](CUfunction twin, void** twin_params) {
    if (window) rt.copy_window().before_kernel(writes, /*validated=*/true, kernel);
    return launch(twin, twin_params, nullptr);
  };
  if (ran_as_twin(rt, validating, kernel, f, params, extra, shmem, stream, writes, launch_twin, &r, &unvalidated))
    return r;
  if (window) rt.copy_window().before_kernel(writes, /*validated=*/false, kernel);
  return launch(f, params, extra);
}

}  // namespace

#define PHOS_LAUNCH_HOOK(name, per_thread)                                                                     \
  extern "C" PHOS_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,       \
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,  \
                                       CUstream stream, void** params, void** extra) {                         \
    const LaunchDeps rt;                                                                                       \
    GatePass pass(rt.gate(), PHOS_CALL_KIND(name));                                                            \
    return launch_kernel(rt, per_thread, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra,              \
                         [&](CUfunction fn, void** p, void** e) {                                              \
                           return PHOS_REAL(name)(fn, gx, gy, gz, bx, by, bz, shmem, stream, p, e);            \
                         });                                                                                   \
  }
PHOS_LAUNCH_HOOK(cuLaunchKernel, false)
PHOS_LAUNCH_HOOK(cuLaunchKernel_ptsz, true)

#define PHOS_LAUNCH_EX_HOOK(name, per_thread)                                                                \
  extern "C" PHOS_EXPORT CUresult name(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) { \
    const LaunchDeps rt;                                                                                     \
    GatePass pass(rt.gate(), PHOS_CALL_KIND(name));                                                          \
    if (!c) {                                                                                                \
      rt.counters().count(Counter::kLaunches);                                                               \
      return PHOS_REAL(name)(c, f, params, extra);                                                           \
    }                                                                                                        \
    return launch_kernel(rt, per_thread, f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX,            \
                         c->blockDimY, c->blockDimZ, c->sharedMemBytes, c->hStream, params, extra,           \
                         [&](CUfunction fn, void** p, void** e) { return PHOS_REAL(name)(c, fn, p, e); });   \
  }
PHOS_LAUNCH_EX_HOOK(cuLaunchKernelEx, false)
PHOS_LAUNCH_EX_HOOK(cuLaunchKernelEx_ptsz, true)

#define PHOS_LAUNCH_COOP_HOOK(name, per_thread)                                                                \
  extern "C" PHOS_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,       \
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,  \
                                       CUstream stream, void** params) {                                       \
    const LaunchDeps rt;                                                                                       \
    GatePass pass(rt.gate(), PHOS_CALL_KIND(name));                                                            \
    const bool capturing = rt.captures().capturing(stream, per_thread);                                        \
    const bool window = __builtin_expect(rt.copy_window().open(), 0) && !capturing;                            \
    WriteRanges writes;                                                                                        \
    Kernel* kernel =                                                                                           \
        seen(rt, capturing, f, gx, gy, gz, bx, by, bz, shmem, stream, params, nullptr, window ? &writes : nullptr); \
    if (window) rt.copy_window().before_kernel(writes, /*validated=*/false, kernel);                           \
    return PHOS_REAL(name)(f, gx, gy, gz, bx, by, bz, shmem, stream, params);                                  \
  }
PHOS_LAUNCH_COOP_HOOK(cuLaunchCooperativeKernel, false)
PHOS_LAUNCH_COOP_HOOK(cuLaunchCooperativeKernel_ptsz, true)

// Captures: begun and ended, so launches know when to ask about their stream.
#define PHOS_CAPTURE_BEGIN_HOOK(name, params, args)  \
  extern "C" PHOS_EXPORT CUresult name params {      \
    const LaunchDeps rt;                             \
    GatePass pass(rt.gate(), PHOS_CALL_KIND(name)); \
    CUresult r = PHOS_REAL(name) args;               \
    if (r == CUDA_SUCCESS) rt.captures().begun();    \
    return r;                                        \
  }
PHOS_CAPTURE_BEGIN_HOOK(cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode mode), (s, mode))
PHOS_CAPTURE_BEGIN_HOOK(cuStreamBeginCapture_v2_ptsz, (CUstream s, CUstreamCaptureMode mode), (s, mode))
PHOS_CAPTURE_BEGIN_HOOK(cuStreamBeginCaptureToGraph,
                        (CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data, size_t n,
                         CUstreamCaptureMode mode),
                        (s, g, deps, data, n, mode))
PHOS_CAPTURE_BEGIN_HOOK(cuStreamBeginCaptureToGraph_ptsz,
                        (CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data, size_t n,
                         CUstreamCaptureMode mode),
                        (s, g, deps, data, n, mode))

// A capture ends with this call whether or not it succeeds.
#define PHOS_CAPTURE_END_HOOK(name)                                  \
  extern "C" PHOS_EXPORT CUresult name(CUstream s, CUgraph* graph) { \
    const LaunchDeps rt;                                             \
    GatePass pass(rt.gate(), PHOS_CALL_KIND(name));                  \
    CUresult r = PHOS_REAL(name)(s, graph);                          \
    rt.captures().ended();                                           \
    return r;                                                        \
  }
PHOS_CAPTURE_END_HOOK(cuStreamEndCapture)
PHOS_CAPTURE_END_HOOK(cuStreamEndCapture_ptsz)
