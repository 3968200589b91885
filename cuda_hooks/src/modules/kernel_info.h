// What the driver says about a kernel: its name and where its parameters
// lie. cudart launches context-independent kernels (CUkernel) through
// cuLaunchKernel; the CUfunction queries refuse those and the CUkernel ones
// answer, so both are asked.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "phos/hooks/kernel_registry.h"

namespace phos::hooks {

std::string kernel_name(CUfunction f);
// SM version (major * 10 + minor) of the current context's device; 0 if
// there is no current context.
uint32_t current_device_arch();
// Every parameter's offset and size; nullopt where the driver answers for
// neither form (not even for parameter 0 of a kernel that has one).
std::optional<std::vector<ParamSlot>> kernel_param_slots(CUfunction f);
// Both, for the kernel registry (kernel_registry.h): `handle` is a CUfunction or a CUkernel.
KernelDescription describe_kernel(const void* handle);
// The handle a registry entry was made for, as the launch passed it.
inline CUfunction function_of(const Kernel& k) { return static_cast<CUfunction>(const_cast<void*>(k.handle)); }

// The packed argument buffer of a launch's `extra` array ({BUFFER_POINTER,
// buf, BUFFER_SIZE, &size, END}); {nullptr, 0} where it names none. At most
// kMaxExtraPairs pairs are read, each slot only after the bound is checked.
struct PackedArgs {
  const std::byte* data = nullptr;
  size_t size = 0;
};
inline constexpr size_t kMaxExtraPairs = 8;
PackedArgs packed_args(void* const* extra);

}  // namespace phos::hooks
