// The dump side of the plugin: one Checkpointer per `criu dump`.
//
//   PAUSE_DEVICES(pid)       the process still runs: agent hello, status,
//                            quiesce (gate closed, work drained), allocations
//   CHECKPOINT_DEVICES(pid)  the process is frozen: the manifest is written
//   exit(DUMP, ret)          success: completion markers; then every process
//                            that lives on (--leave-running, or a failed dump)
//                            gets its gate opened again
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <vector>

#include "agent_client.h"
#include "options.h"
#include "phos/images/result.h"

namespace phos::plugin {

class Checkpointer {
 public:
  Checkpointer(int image_dirfd, PluginOptions options) : dirfd_(image_dirfd), options_(options) {}

  // false: the process has no phos agent (the hook answers -ENOTSUP).
  Result<bool> pause(pid_t pid);
  Result<bool> checkpoint(pid_t pid);
  // Never fails the dump further; logs what it could not do.
  void finish(bool dump_succeeded);

 private:
  struct Target {
    pid_t vpid = 0;
    AgentHello hello;
    AgentStatus status;
    std::vector<AgentAllocation> allocations;
    uint64_t quiesce_ns = 0;
    uint64_t paused_at_ns = 0;
    std::vector<std::byte> manifest_file;  // once written
  };
  Result<void> resume(pid_t pid);

  int dirfd_;
  PluginOptions options_;
  std::map<pid_t, Target> targets_;
};

}  // namespace phos::plugin
