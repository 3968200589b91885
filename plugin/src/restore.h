// The restore side of the plugin: one Restorer per `criu restore`.
//
//   init(RESTORE)            every GPU image in the directory is read and
//                            checked, the GPUs too; device memory is created
//                            and filled while criu restores the CPU side.
//                            Any problem stops the restore before CRIU
//                            creates a process
//   RESUME_DEVICES_LATE(pid) the restored process is still stopped: the
//                            driver restores and unlocks it, its agent maps
//                            the memory at the original addresses and opens
//                            the gate; on failure the process is killed,
//                            never left running
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>

#include "engine.h"
#include "options.h"
#include "phos/images/image_dir.h"
#include "phos/images/result.h"

namespace phos::plugin {

class Restorer {
 public:
  Restorer(int image_dirfd, PluginOptions options) : dirfd_(image_dirfd), options_(options) {}

  Result<void> load();
  // false: no GPU image for this process (the hook answers -ENOTSUP).
  Result<bool> resume_late(pid_t pid);

 private:
  struct Loaded {
    image::ProcessImage image;
    std::vector<UniqueFd> fds;  // one per allocation, filled device memory
    std::vector<GpuPlacement> placement;  // where each of the image's GPUs went
    std::vector<HostGpu> host;            // this host's GPUs
  };
  Result<void> resume(pid_t pid, pid_t vpid, Loaded& l);

  int dirfd_;
  PluginOptions options_;
  std::unique_ptr<Engine> engine_;
  std::map<pid_t, Loaded> images_;  // by pid in the process's namespace
};

}  // namespace phos::plugin
