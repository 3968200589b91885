#include "phos/plugin/ipc_sharing.h"

#include <fcntl.h>

#include <map>
#include <set>
#include <string>

#include "phos/images/format.h"

namespace phos::plugin {

bool is_ipc_mapping(const agent::Allocation& a) { return (a.flags & image::kAllocIpcImported) && a.ipc; }

bool shares_ipc(const agent::StatusReply& status, const std::vector<agent::Allocation>& allocations) {
  if (!status.ipc_exports.empty()) return true;
  for (const auto& a : allocations)
    if (is_ipc_mapping(a)) return true;
  return false;
}

Result<void> own_allocations(const std::vector<agent::Allocation>& all, const std::vector<UniqueFd>& fds,
                             std::vector<agent::Allocation>* own, std::vector<UniqueFd>* own_fds) {
  own->clear();
  own_fds->clear();
  for (size_t i = 0; i < all.size(); i++) {
    if (is_ipc_mapping(all[i])) continue;
    own->push_back(all[i]);
    if (i >= fds.size()) continue;  // listed without fds
    UniqueFd dup(::fcntl(fds[i].get(), F_DUPFD_CLOEXEC, 0));
    if (!dup.valid()) return errno_error("duplicate the fd of allocation " + std::to_string(all[i].id));
    own_fds->push_back(std::move(dup));
  }
  return {};
}

std::vector<agent::Allocation> ipc_mappings(const std::vector<agent::Allocation>& all) {
  std::vector<agent::Allocation> out;
  for (const auto& a : all)
    if (is_ipc_mapping(a)) out.push_back(a);
  return out;
}

std::set<uint64_t> shared_allocations(const agent::StatusReply& status, const std::vector<agent::Allocation>& own) {
  std::set<uint64_t> exported, out;
  for (const auto& e : status.ipc_exports) exported.insert(e.allocation);
  for (const auto& a : own)
    if (!is_ipc_mapping(a) && exported.count(a.id)) out.insert(a.id);
  return out;
}

Result<void> check_ipc_tree(const std::vector<IpcParty>& parties) {
  std::map<int32_t, const IpcParty*> by_vpid;
  for (const auto& p : parties) by_vpid[p.vpid] = &p;
  for (const auto& p : parties) {
    for (const auto& e : p.status->ipc_exports)
      if (!by_vpid.count(e.importer_pid))
        return make_error("process " + std::to_string(p.pid) + ": its allocation #" + std::to_string(e.allocation) +
                              " is open through CUDA IPC in " +
                              (e.importer_pid ? "process " + std::to_string(e.importer_pid) + " (pid in its namespace)"
                                              : std::string("a process outside its pid namespace")) +
                              ", which is not in the dumped tree: dump both in one tree, or close the handle there "
                              "(cuIpcCloseMemHandle) first",
                          EBUSY);
    for (const auto& a : *p.allocations) {
      if (!is_ipc_mapping(a)) continue;
      auto owner = by_vpid.find(a.ipc->owner_pid);
      const std::string what = "process " + std::to_string(p.pid) + " maps allocation #" +
                               std::to_string(a.ipc->owner_allocation) + " of process " +
                               std::to_string(a.ipc->owner_pid) + " (pid in its namespace) through CUDA IPC";
      if (owner == by_vpid.end())
        return make_error(what + ", which is not in the dumped tree: dump both in one tree", EBUSY);
      bool found = false;
      for (const auto& o : *owner->second->allocations)
        found = found || (o.id == a.ipc->owner_allocation && !is_ipc_mapping(o) && o.size == a.size);
      if (!found) return make_error(what + ", which that process no longer has as such", ESRCH);
    }
  }
  return {};
}

}  // namespace phos::plugin
