// CUDA IPC at dump time: memory that processes of the dumped tree share
// through phos's IPC handles (cuda_hooks/src/hooks/ipc.cc) is stored once,
// in its owner's image; each importer's image records where it maps it
// (Manifest::ipc_mappings). A process outside the tree that holds a shared
// allocation, or an owner outside the tree, makes the dump refuse.
#pragma once

#include <sys/types.h>

#include <set>
#include <vector>

#include "phos/images/agent_messages.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::plugin {

// One process of the dump, as the IPC check sees it.
struct IpcParty {
  pid_t pid = 0;    // criu's
  int32_t vpid = 0; // in its pid namespace: what IPC handles name
  const agent::StatusReply* status = nullptr;          // its importers (ipc_exports)
  const std::vector<agent::Allocation>* allocations = nullptr;  // with its IPC mappings
};

bool is_ipc_mapping(const agent::Allocation& a);
// The process shares memory through CUDA IPC, as owner or importer.
bool shares_ipc(const agent::StatusReply& status, const std::vector<agent::Allocation>& allocations);
// The allocations the process owns (what its image stores), their fds
// duplicated; and its IPC mappings (what its image only names).
Result<void> own_allocations(const std::vector<agent::Allocation>& all, const std::vector<UniqueFd>& fds,
                             std::vector<agent::Allocation>* own, std::vector<UniqueFd>* own_fds);
std::vector<agent::Allocation> ipc_mappings(const std::vector<agent::Allocation>& all);
// The ids of the process's own allocations that other processes map
// (status.ipc_exports): their writes pass no hook of this one, so a
// copy-on-write dump copies these while every process that shares them is
// stopped, and the window leaves them alone.
std::set<uint64_t> shared_allocations(const agent::StatusReply& status, const std::vector<agent::Allocation>& own);
// Every importer of every party's memory is a party, and every IPC mapping's
// owner is a party that has that allocation; the error names the process
// and the allocation otherwise.
Result<void> check_ipc_tree(const std::vector<IpcParty>& parties);

}  // namespace phos::plugin
