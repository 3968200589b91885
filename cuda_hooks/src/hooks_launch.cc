// Kernel launches: counted, and recorded (launch_log.h) while a protocol
// needs the record.
#include "driver.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;

namespace {

inline void seen(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                 unsigned shmem, CUstream stream, void** params, void** extra) {
  runtime().count(Counter::kLaunches);
  if (__builtin_expect(runtime().launches.enabled(), 0)) {
    const uint32_t grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    runtime().launches.record(f, grid, block, shmem, stream, params, extra);
  }
}

inline void seen_ex(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  if (!c) return runtime().count(Counter::kLaunches);
  seen(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ, c->sharedMemBytes,
       c->hStream, params, extra);
}

}  // namespace

#define PHOS_LAUNCH_HOOK(name)                                                                                 \
  extern "C" PHOS_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,       \
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,  \
                                       CUstream stream, void** params, void** extra) {                         \
    GatePass pass(runtime().gate);                                                                             \
    seen(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);                                             \
    return PHOS_REAL(name)(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);                           \
  }
PHOS_LAUNCH_HOOK(cuLaunchKernel)
PHOS_LAUNCH_HOOK(cuLaunchKernel_ptsz)

#define PHOS_LAUNCH_EX_HOOK(name)                                                                       \
  extern "C" PHOS_EXPORT CUresult name(const CUlaunchConfig* config, CUfunction f, void** params,     \
                                       void** extra) {                                                  \
    GatePass pass(runtime().gate);                                                                      \
    seen_ex(config, f, params, extra);                                                                  \
    return PHOS_REAL(name)(config, f, params, extra);                                                   \
  }
PHOS_LAUNCH_EX_HOOK(cuLaunchKernelEx)
PHOS_LAUNCH_EX_HOOK(cuLaunchKernelEx_ptsz)

#define PHOS_LAUNCH_COOP_HOOK(name)                                                                            \
  extern "C" PHOS_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,       \
                                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,  \
                                       CUstream stream, void** params) {                                       \
    GatePass pass(runtime().gate);                                                                             \
    seen(f, gx, gy, gz, bx, by, bz, shmem, stream, params, nullptr);                                           \
    return PHOS_REAL(name)(f, gx, gy, gz, bx, by, bz, shmem, stream, params);                                  \
  }
PHOS_LAUNCH_COOP_HOOK(cuLaunchCooperativeKernel)
PHOS_LAUNCH_COOP_HOOK(cuLaunchCooperativeKernel_ptsz)
