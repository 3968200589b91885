// The engine: moves device memory between the application's GPU allocations
// and the image directory, from inside criu. Dump: each allocation, reached
// through the fd the agent exported, is mapped into criu's own CUDA context
// and copied device-to-host through a pinned staging buffer, chunk by chunk,
// into a checksummed data file. Restore: each allocation is created anew on
// its device, filled from the image, and handed on as an fd for the agent to
// map at its original address.
//
// This first version copies on one stream with one buffer; the pinned ring,
// several streams and writer threads, and O_DIRECT come next.
#pragma once

#include <map>
#include <vector>

#include "agent_client.h"
#include "cuda_api.h"
#include "phos/images/manifest.h"
#include "phos/images/result.h"
#include "phos/images/unique_fd.h"

namespace phos::plugin {

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> start(uint32_t chunk_size = image::kDefaultChunkSize);
  ~Engine();

  // Copies every allocation into data file 0 of process `vpid`; fills the
  // manifest's devices, allocations, data files and copy statistics.
  Result<void> save(int dirfd, int32_t vpid, const std::vector<AgentAllocation>& allocs,
                    const std::vector<UniqueFd>& fds, image::Manifest& m);

  // Checks that this host has the image's GPU models at the same ordinals.
  Result<void> check_devices(const image::Manifest& m, const std::string& manifest_name);
  // Creates and fills each allocation of `m`; one fd per allocation, in order.
  Result<std::vector<UniqueFd>> load(int dirfd, const image::Manifest& m);

 private:
  explicit Engine(const CudaApi& cu, uint32_t chunk_size) : cu_(cu), chunk_size_(chunk_size) {}
  Result<void> use_device(int ordinal);
  Result<CUdeviceptr> map(CUmemGenericAllocationHandle h, size_t size, int device);
  void unmap(CUdeviceptr va, size_t size);
  Result<image::Device> describe(int ordinal);

  const CudaApi& cu_;
  uint32_t chunk_size_;
  std::map<int, CUcontext> contexts_;
  void* staging_ = nullptr;
};

}  // namespace phos::plugin
