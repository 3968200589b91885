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
//
// phos-keeper (keeper_link.h), started at the first pause, holds a second
// reference to the memory and learns each step before it is taken, so a
// criu that dies mid-dump does not leave a process without its GPU state.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "agent_client.h"
#include "engine.h"
#include "keeper_link.h"
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
    uint32_t taken = 0;  // Taken bits (give_back.h): what to give back
    std::vector<std::byte> manifest_file;  // once written
  };
  Result<void> pause_target(pid_t pid, AgentClient& client, Target& t);
  // Waits for the copy of `t` to end; its result.
  Result<void> copy_done(Target& t);
  void give_back(pid_t pid, Target& t);
  // Records that the dump is about to take `step` from the process: in the
  // target, and with the keeper, before it happens.
  void taking(pid_t pid, Target& t, uint32_t step);
  // The engine, started once, with contexts on devices 0..devices-1.
  Result<void> start_engine(int devices);
  // Starts phos-keeper once per dump; a dump goes on without one (warned).
  void start_keeper();

  int dirfd_;
  PluginOptions options_;
  std::unique_ptr<Engine> engine_;
  std::map<pid_t, Target> targets_;
  std::optional<KeeperLink> keeper_;
  bool keeper_tried_ = false;
};

}  // namespace phos::plugin
