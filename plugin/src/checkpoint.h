// The dump side of the plugin: one Checkpointer per `criu dump`.
//
//   PAUSE_DEVICES(pid)       the process still runs: agent hello and status,
//                            quiesce (gate closed, work drained), allocations
//                            and their fds; the engine copies device memory
//                            into the image; the process lets go of its
//                            device memory; the driver locks the process
//   CHECKPOINT_DEVICES(pid)  the process is frozen: the driver checkpoints
//                            it (no device memory left, so this is quick);
//                            the manifest is written
//   exit(DUMP, ret)          success: completion markers. Then every process
//                            that lives on (--leave-running, or a failed dump)
//                            gets back exactly what was taken, in reverse:
//                            driver restore and unlock, its very memory mapped
//                            again (zero copy), the gate opened
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <thread>
#include <memory>
#include <vector>

#include "agent_client.h"
#include "engine.h"
#include "options.h"
#include "phos/images/manifest.h"
#include "phos/images/result.h"

namespace phos::plugin {

class Checkpointer {
 public:
  Checkpointer(int image_dirfd, PluginOptions options) : dirfd_(image_dirfd), options_(options) {}
  // Waits for copies still running (a joinable thread must not be destroyed).
  ~Checkpointer();

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
    std::vector<UniqueFd> fds;  // the device memory, while the process has let go of it
    image::Manifest manifest;
    std::unique_ptr<Engine::SaveJob> save;  // the copy, started in PAUSE_DEVICES
    std::thread copier;
    Result<void> copied;
    uint64_t paused_at_ns = 0;
    bool released = false, driver_locked = false, driver_checkpointed = false;
    std::vector<std::byte> manifest_file;  // once written
  };
  Result<void> pause_target(pid_t pid, AgentClient& client, Target& t);
  // Waits for the copy of `t` to end; its result.
  Result<void> copy_done(Target& t);
  void give_back(pid_t pid, Target& t);

  int dirfd_;
  PluginOptions options_;
  std::unique_ptr<Engine> engine_;
  std::map<pid_t, Target> targets_;
};

}  // namespace phos::plugin
