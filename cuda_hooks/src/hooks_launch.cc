// Kernel launches: counted, and recorded (launch_log.h) and speculated
// (launch_speculation.h) while a protocol needs it.
#include "driver.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;

namespace {

inline void seen(bool per_thread, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                 unsigned bz, unsigned shmem, CUstream stream, void** params, void** extra) {
  if (__builtin_expect(stream_capturing(stream, per_thread), 0)) return runtime().count(Counter::kCapturedLaunches);
  runtime().count(Counter::kLaunches);
  bool recording = runtime().launches.enabled(), speculating = runtime().speculation.active();
  if (__builtin_expect(!recording && !speculating, 1)) return;
  LaunchSet set;
  if (speculating) runtime().speculation.on_kernel(f, params, extra, recording ? &set : nullptr);
  if (recording) {
    const uint32_t grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    runtime().launches.record(f, grid, block, shmem, stream, params, extra, speculating ? &set : nullptr);
  }
}

inline void seen_ex(bool per_thread, const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  if (!c) return runtime().count(Counter::kLaunches);
  seen(per_thread, f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ, c->sharedMemBytes,
       c->hStream, params, extra);
}

}  // namespace

// While validation is on, a kernel with a twin runs as its twin
// (launch_validation.h); not into a stream being captured.
inline bool validating(bool per_thread, CUstream stream) {
  return __builtin_expect(runtime().validation.active(), 0) && !stream_capturing(stream, per_thread);
}

#define PHOS_LAUNCH_HOOK(name, per_thread)                                                                     \
  extern "C" PHOS_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,       \
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,  \
                                       CUstream stream, void** params, void** extra) {                         \
    GatePass pass(runtime().gate);                                                                             \
    seen(per_thread, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);                                 \
    LaunchValidation::Prepared twin;                                                                           \
    if (validating(per_thread, stream) && runtime().validation.prepare(f, params, extra, shmem, &twin)) {     \
      CUresult r = PHOS_REAL(name)(twin.twin, gx, gy, gz, bx, by, bz, shmem, stream, twin.params.data(), nullptr); \
      if (runtime().validation.finish(twin, r, stream)) return r;                                              \
    }                                                                                                          \
    return PHOS_REAL(name)(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);                           \
  }
PHOS_LAUNCH_HOOK(cuLaunchKernel, false)
PHOS_LAUNCH_HOOK(cuLaunchKernel_ptsz, true)

#define PHOS_LAUNCH_EX_HOOK(name, per_thread)                                                           \
  extern "C" PHOS_EXPORT CUresult name(const CUlaunchConfig* config, CUfunction f, void** params,     \
                                       void** extra) {                                                  \
    GatePass pass(runtime().gate);                                                                      \
    seen_ex(per_thread, config, f, params, extra);                                                      \
    LaunchValidation::Prepared twin;                                                                    \
    if (config && validating(per_thread, config->hStream) &&                                            \
        runtime().validation.prepare(f, params, extra, config->sharedMemBytes, &twin)) {                \
      CUresult r = PHOS_REAL(name)(config, twin.twin, twin.params.data(), nullptr);                     \
      if (runtime().validation.finish(twin, r, config->hStream)) return r;                              \
    }                                                                                                   \
    return PHOS_REAL(name)(config, f, params, extra);                                                   \
  }
PHOS_LAUNCH_EX_HOOK(cuLaunchKernelEx, false)
PHOS_LAUNCH_EX_HOOK(cuLaunchKernelEx_ptsz, true)

#define PHOS_LAUNCH_COOP_HOOK(name, per_thread)                                                                \
  extern "C" PHOS_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,       \
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,  \
                                       CUstream stream, void** params) {                                       \
    GatePass pass(runtime().gate);                                                                             \
    seen(per_thread, f, gx, gy, gz, bx, by, bz, shmem, stream, params, nullptr);                               \
    return PHOS_REAL(name)(f, gx, gy, gz, bx, by, bz, shmem, stream, params);                                  \
  }
PHOS_LAUNCH_COOP_HOOK(cuLaunchCooperativeKernel, false)
PHOS_LAUNCH_COOP_HOOK(cuLaunchCooperativeKernel_ptsz, true)

// Captures: begun and ended, so launches know when to ask about their stream.
#define PHOS_CAPTURE_BEGIN_HOOK(name, params, args)                                          \
  extern "C" PHOS_EXPORT CUresult name params {                                              \
    GatePass pass(runtime().gate);                                                           \
    CUresult r = PHOS_REAL(name) args;                                                       \
    if (r == CUDA_SUCCESS) runtime().captures_active.fetch_add(1, std::memory_order_relaxed); \
    return r;                                                                                \
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
#define PHOS_CAPTURE_END_HOOK(name)                                                        \
  extern "C" PHOS_EXPORT CUresult name(CUstream s, CUgraph* graph) {                       \
    GatePass pass(runtime().gate);                                                         \
    CUresult r = PHOS_REAL(name)(s, graph);                                                \
    int active = runtime().captures_active.load();                                         \
    while (active > 0 && !runtime().captures_active.compare_exchange_weak(active, active - 1)) { \
    }                                                                                      \
    return r;                                                                              \
  }
PHOS_CAPTURE_END_HOOK(cuStreamEndCapture)
PHOS_CAPTURE_END_HOOK(cuStreamEndCapture_ptsz)
