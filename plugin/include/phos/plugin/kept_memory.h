// A migration's GPU memory between its dump and its restore (migrate_to,
// images/proto/keeper.proto). The dump's plugin hands phos-keeper the
// memory that holds each process's data once copied (Keep, then
// KeepCommitted when the dump succeeded); criu ends the process and exits;
// the keeper then serves the memory on the abstract socket
// "phos-kept.<migration>" (root or its own user only) until a restore has
// taken every process's (TakeKept, Kept frames with the fds, Taken).
//
// Nothing is lost when no restore comes: after migrate_keep_s seconds, or on
// SIGTERM, the keeper writes the memory into the image directory as a dump
// would have (data files, the manifest without KeptMemory, a new
// completion marker) and lets go; the image then restores like any other.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "phos/images/agent_messages.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::plugin {

// One process's kept memory, as the keeper holds it.
struct KeptProcess {
  pid_t pid = 0;  // in criu's namespace (the dump's)
  int32_t vpid = 0;  // the image's pid
  std::string migration;
  uint32_t keep_s = 0;
  std::vector<agent::Allocation> allocations;
  std::vector<UniqueFd> fds;  // one per allocation
  bool committed = false;     // the dump succeeded
  int lent_to = -1;           // serving: the restore's connection that has it now
};

// SIGTERM and SIGINT blocked, so that they interrupt nothing: the keeper
// looks for them while it serves (and then writes the memory out). Called
// once it keeps a migration's memory.
void block_termination();

// The keeper's side: lets go of what was not committed, then serves the
// rest to any number of restores at once (a process's memory to one of them
// at a time, until it says Taken or closes) until every process's memory is
// taken. After keep_s (without a restore holding any) or on SIGTERM (after
// the restore holding some, 30 s at most) it writes what is kept into the
// image directory; what cannot be written stays kept (tried again a period
// later). Logs what it does.
void serve_kept_memory(std::vector<KeptProcess>& kept, int image_dirfd);

// The restore's side: one process's kept memory, taken from the keeper
// that serves `migration`. The link stays open until taken() says whether
// the process was restored (the keeper lets go) or not (it keeps it).
class KeptMemoryLink {
 public:
  static Result<KeptMemoryLink> take(const std::string& migration, int32_t vpid, int timeout_ms);
  KeptMemoryLink(KeptMemoryLink&&) = default;
  KeptMemoryLink& operator=(KeptMemoryLink&&) = default;

  std::vector<agent::Allocation> allocations;
  std::vector<UniqueFd> fds;

  // restored: the keeper lets go. Not: it keeps it for another restore,
  // unless `spoilt` (the process may have run on it): then it lets go and
  // removes the image's completion marker.
  Result<void> taken(bool restored, bool spoilt = false);

 private:
  KeptMemoryLink(UniqueFd sock, int32_t vpid) : sock_(std::move(sock)), vpid_(vpid) {}
  UniqueFd sock_;
  int32_t vpid_ = 0;
};

}  // namespace phos::plugin
