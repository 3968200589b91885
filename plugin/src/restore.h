// The restore side of the plugin: one Restorer per `criu restore`.
//
//   init(RESTORE)            every GPU image in the directory is read and
//                            checked; any problem stops the restore before
//                            CRIU creates a process
//   RESUME_DEVICES_LATE(pid) the restored process is still stopped: its
//                            agent remaps and opens the gate; on failure the
//                            process is killed, never left running
#pragma once

#include <sys/types.h>

#include <map>

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
  size_t image_count() const { return images_.size(); }

 private:
  int dirfd_;
  PluginOptions options_;
  std::map<pid_t, image::ProcessImage> images_;  // by pid in the process's namespace
};

}  // namespace phos::plugin
