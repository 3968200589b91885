// On unless PHOS_SHRINK_DRIVER_STATE=0 (issue 30, part 2): the driver's
// checkpoint copies each context's device state into the process, criu
// then dumps it as CPU pages, and the driver's restore copies it back. Part
// of that state is sized by the context's limits: the local memory (the
// stack limit times every thread the device can hold; it only grows, with
// each kernel that needs more), the printf FIFO and the malloc heap. With
// the gate closed and the GPU drained, before the driver's checkpoint,
// lower() sets each of them to the least the driver takes, keeping what
// they were; restore() sets them back after the driver's restore (or the
// give-back), before the gate opens: the program runs with its own limits.
// The driver refuses the FIFO and the heap once a kernel used printf or
// malloc (their contents live there): those stay as they are.
#pragma once

#include <cuda.h>

#include <mutex>
#include <string>
#include <vector>

#include "phos/support/result.h"

namespace phos::hooks {

class DriverLimits {
 public:
  // Unless PHOS_SHRINK_DRIVER_STATE=0 (read once).
  static bool wanted();

  // Each context's limits lowered; what they were kept for restore(). A
  // limit the driver refuses is left as it is (said in the returned line).
  // Returns a line for the log: each limit, before -> after.
  Result<std::string> lower(const std::vector<CUcontext>& contexts);
  // What lower() changed, set back; nothing where nothing was lowered (a
  // second call, or a gate opened without a checkpoint).
  Result<std::string> restore();

 private:
  struct Saved {
    CUcontext ctx;
    CUlimit limit;
    size_t value;
  };
  std::mutex mu_;
  std::vector<Saved> saved_;
};

}  // namespace phos::hooks
