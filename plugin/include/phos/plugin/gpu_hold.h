// A CUDA context held on every GPU of a host (phosctl hold-gpus), so that a
// restore's criu is not the GPU's first client: the first process to start
// CUDA on an idle GPU waits 100-270 ms in cuInit, a second one 9-12 ms
// beside it (H200, persistence mode on). The 8B server's restore ran 0.20 s
// sooner beside a held context (docs/benchmarks/coldstart.md). Each
// context's stack, printf FIFO and malloc heap limits are set to their
// least, so it keeps as little GPU memory as a context can (265 MiB on an
// H200 against 529 MiB with the defaults).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "phos/support/result.h"

namespace phos::plugin {

struct HeldGpu {
  int ordinal = 0;
  std::string name;
  bool held = false;
  uint64_t free_bytes = 0;  // the GPU's free memory with the context held
  std::string why_not;      // not held: why (its compute mode, the driver's error)
};

// The primary context of every GPU the driver lists, retained, limits
// lowered (a limit the driver refuses stays as it is), one entry a GPU. A
// GPU whose compute mode is not the default is left alone: in
// exclusive-process mode a held context would keep every other process
// off it, the restore's included; a prohibited one takes none. A GPU the
// driver refuses is said, and the others are held all the same. An error
// only where the driver cannot be used at all.
Result<std::vector<HeldGpu>> hold_gpu_contexts();

// Each context held by hold_gpu_contexts() released.
void release_gpu_contexts();

}  // namespace phos::plugin
