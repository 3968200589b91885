// The plugin's end of phos-keeper (see images/proto/keeper.proto): the
// helper is started outside criu (its own session, not criu's child once it
// runs) at the first process a dump pauses (at a restore: at init, before
// criu watches its children), told each process's device
// memory (fds) and what the dump takes, step by step, before it is taken,
// and told Done when every process has what it should. If criu dies before
// Done, the keeper gives each living process back what was taken.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "phos/images/unique_fd.h"
#include "phos/plugin/agent_client.h"
#include "phos/support/result.h"

namespace phos::plugin {

class KeeperLink {
 public:
  // Starts the keeper (PHOS_KEEPER, else phos-keeper next to this plugin's
  // .so), passing it the image directory for its log.
  static Result<KeeperLink> start(int image_dirfd, int agent_timeout_ms);
  KeeperLink(KeeperLink&&) = default;
  KeeperLink& operator=(KeeperLink&&) = default;

  Result<void> hold(pid_t pid, const std::vector<agent::Allocation>& allocs, const std::vector<UniqueFd>& fds);
  Result<void> state(pid_t pid, uint32_t taken);
  // A restore: `pid` is about to get its GPU state (restored false), or has
  // it (true). A criu that dies in between leaves it for the keeper to end.
  Result<void> restoring(pid_t pid, bool restored);
  // A restore begins in this criu: the keeper watches the processes it forks.
  Result<void> restore_started();
  // A migration: the memory that holds `vpid`'s GPU data after the copy
  // (one fd per allocation), kept once committed, for `keep_s` seconds.
  Result<void> keep(pid_t pid, pid_t vpid, const std::string& migration, uint32_t keep_s,
                    const std::vector<agent::Allocation>& allocs, const std::vector<UniqueFd>& fds);
  // The dump succeeded: what keep() named outlives criu.
  Result<void> keep_committed(pid_t pid);
  // Tells the keeper to let go and exit; closes the link.
  Result<void> done();
  // Leaves the link open until criu exits, without Done: the keeper then
  // gives back what the dump took to each process that outlives criu (one
  // criu killed after the dump is gone by then).
  void hand_over() { (void)sock_.release(); }

  // The keeper's executable: PHOS_KEEPER, else next to the plugin.
  static Result<std::string> executable();

 private:
  explicit KeeperLink(UniqueFd sock) : sock_(std::move(sock)) {}
  UniqueFd sock_;
};

}  // namespace phos::plugin
