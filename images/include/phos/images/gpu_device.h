// A GPU, as every part of phos describes one: what the agent reports of
// the process's GPUs, what an image records of them, this host's GPUs that
// the plugin places an image on, and the GPU that keeps a migration's
// memory. One type, so that a GPU found in one place is matched to another
// by the same fields (its UUID first: ordinals differ between processes
// under CUDA_VISIBLE_DEVICES).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace phos {

struct GpuDevice {
  // The CUdevice, in the numbering of whoever described it (the process,
  // or this host for the plugin's own view).
  uint32_t ordinal = 0;
  std::array<uint8_t, 16> uuid{};  // as cuDeviceGetUuid gives it
  // Empty, or 0, where the describer did not say (the agent reports
  // ordinals and UUIDs only; a migration's keeper GPU, its UUID and name).
  std::string name{};
  uint64_t total_memory = 0;  // bytes
  uint32_t compute_major = 0;
  uint32_t compute_minor = 0;
  bool operator==(const GpuDevice&) const = default;
};

}  // namespace phos
