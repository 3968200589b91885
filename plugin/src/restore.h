// The restore side of the plugin: one Restorer per `criu restore`.
//
//   init(RESTORE)            every GPU image in the directory is read and
//                            checked, the GPUs too, and its device memory is
//                            created: a problem there stops the restore
//                            before CRIU creates a process. A thread then
//                            fills the memory while criu restores the CPU
//                            side
//   RESUME_DEVICES_LATE(pid) the restored process is still stopped: once its
//                            memory is filled, the driver restores and
//                            unlocks it, its agent maps the memory at the
//                            original addresses and opens the gate; on
//                            failure (a chunk that fails its checksum, too)
//                            the process is killed, never left running, and
//                            criu's exit status says so (failed()); if criu
//                            dies meanwhile, phos-keeper ends the process
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <thread>

#include <optional>

#include "engine.h"
#include "keeper_link.h"
#include "phos/images/image_dir.h"
#include "phos/plugin/options.h"
#include "phos/support/result.h"

namespace phos::plugin {

class Restorer {
 public:
  Restorer(int image_dirfd, PluginOptions options) : dirfd_(image_dirfd), options_(options) {}
  // Waits for the thread that fills device memory.
  ~Restorer();

  Result<void> load();
  // false: no GPU image for this process (the hook answers -ENOTSUP).
  Result<bool> resume_late(pid_t pid);
  // Whether a process was killed because its GPU state could not be restored.
  bool failed() const { return failed_; }

 private:
  struct Loaded {
    image::ProcessImage image;
    std::vector<UniqueFd> fds;  // one per allocation, filled device memory
    std::vector<GpuPlacement> placement;  // where each of the image's GPUs went
    std::vector<HostGpu> host;            // this host's GPUs
    std::unique_ptr<Engine::LoadJob> job;  // its device memory, until filled
    Result<void> filled;                   // by the filling thread
  };
  Result<void> resume(pid_t pid, pid_t vpid, Loaded& l);
  // Fills every image's device memory (the thread's work).
  void fill_all();

  int dirfd_;
  PluginOptions options_;
  std::unique_ptr<Engine> engine_;
  std::map<pid_t, Loaded> images_;  // by pid in the process's namespace
  std::thread filler_;
  bool failed_ = false;
  // Ends a process criu leaves half-restored (dying between RESUME_DEVICES_LATE
  // and its end); started at init, before criu reaps every child it has.
  std::optional<KeeperLink> keeper_;
};

}  // namespace phos::plugin
