// The engine: moves device memory between the application's GPU allocations
// and the image directory, from inside criu. Dump: each allocation, reached
// through the fd the agent exported, is mapped into criu's own CUDA context;
// worker threads, each with its own stream and pinned buffer, copy it
// device-to-host chunk by chunk and write the chunks, checksummed, into the
// data file (whose writer reserves each chunk's extent atomically). Restore:
// each allocation is created anew on its device and the workers fill it from
// the image; the memory is handed on as an fd for the agent to map at its
// original address.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "agent_client.h"
#include "cuda_api.h"
#include "phos/images/data_file.h"
#include "phos/images/manifest.h"
#include "phos/images/result.h"
#include "phos/images/unique_fd.h"

namespace phos::plugin {

class Engine {
 public:
  // workers 0: one per two cores, at most 8.
  static Result<std::unique_ptr<Engine>> start(uint32_t chunk_size = image::kDefaultChunkSize, unsigned workers = 0);
  ~Engine();

  // A dump of one process's device memory: prepared (every allocation
  // imported and mapped into criu, so the process may let go of its own)
  // while criu's freeze timer runs, copied after, off that timer.
  struct SaveJob;
  Result<std::unique_ptr<SaveJob>> prepare_save(int dirfd, int32_t vpid, const std::vector<AgentAllocation>& allocs,
                                                const std::vector<UniqueFd>& fds, image::Manifest& m);
  // Copies into data file 0 of the process; fills the manifest's allocations,
  // data files and copy statistics. Unmaps what prepare_save mapped.
  Result<void> run_save(SaveJob& job);

  // Checks that this host has the image's GPU models at the same ordinals.
  Result<void> check_devices(const image::Manifest& m, const std::string& manifest_name);
  // Creates and fills each allocation of `m`; one fd per allocation, in order.
  Result<std::vector<UniqueFd>> load(int dirfd, const image::Manifest& m);

 private:
  Engine(const CudaApi& cu, uint32_t chunk_size, unsigned workers)
      : cu_(cu), chunk_size_(chunk_size), workers_(workers) {}
  CUcontext context(int ordinal, Result<void>& err);
  Result<CUdeviceptr> map(CUmemGenericAllocationHandle h, size_t size, int device);
  void unmap(CUdeviceptr va, size_t size);
  Result<image::Device> describe(int ordinal);

  // A piece of work for the workers: `size` bytes at `offset` of mapping `va`.
  struct Piece {
    size_t allocation;  // index in the allocation list
    size_t chunk;       // index of the chunk in that allocation
    uint64_t offset;    // in the allocation
    size_t size;
    int device;
  };
  // Runs fn(piece, pinned staging buffer, stream of the piece's device,
  // worker index) over all pieces on the workers; the first error stops them.
  Result<void> run_workers(const std::vector<Piece>& pieces,
                           const std::function<Result<void>(const Piece&, void*, CUstream, unsigned)>& fn);

  const CudaApi& cu_;
  uint32_t chunk_size_;
  unsigned workers_;
  std::map<int, CUcontext> contexts_;
  std::mutex run_mu_;  // one copy at a time (the workers share the engine's contexts)
};

struct Engine::SaveJob {
  int32_t vpid = 0;
  std::vector<AgentAllocation> allocs;
  std::vector<CUdeviceptr> vas;
  std::vector<Piece> pieces;
  std::vector<std::vector<image::Chunk>> chunks;
  std::unique_ptr<image::DataFileWriter> writer;
  image::Manifest* manifest = nullptr;
  Engine* engine = nullptr;
  ~SaveJob();  // unmaps what is still mapped
};

}  // namespace phos::plugin
