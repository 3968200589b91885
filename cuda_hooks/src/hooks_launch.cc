// Kernel launches, counted here; the speculation issue adds the launch record.
#include "driver.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;

#define PHOS_LAUNCH_HOOK(name, params, args)    \
  extern "C" PHOS_EXPORT CUresult name params { \
    GatePass pass(runtime().gate);              \
    runtime().count(Counter::kLaunches);        \
    return PHOS_REAL(name) args;                \
  }

PHOS_LAUNCH_HOOK(cuLaunchKernel,
                 (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                  unsigned int bz, unsigned int shmem, CUstream stream, void** params, void** extra),
                 (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra))
PHOS_LAUNCH_HOOK(cuLaunchKernel_ptsz,
                 (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                  unsigned int bz, unsigned int shmem, CUstream stream, void** params, void** extra),
                 (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra))
PHOS_LAUNCH_HOOK(cuLaunchKernelEx, (const CUlaunchConfig* config, CUfunction f, void** params, void** extra),
                 (config, f, params, extra))
PHOS_LAUNCH_HOOK(cuLaunchKernelEx_ptsz, (const CUlaunchConfig* config, CUfunction f, void** params, void** extra),
                 (config, f, params, extra))
PHOS_LAUNCH_HOOK(cuLaunchCooperativeKernel,
                 (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                  unsigned int bz, unsigned int shmem, CUstream stream, void** params),
                 (f, gx, gy, gz, bx, by, bz, shmem, stream, params))
PHOS_LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz,
                 (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                  unsigned int bz, unsigned int shmem, CUstream stream, void** params),
                 (f, gx, gy, gz, bx, by, bz, shmem, stream, params))
