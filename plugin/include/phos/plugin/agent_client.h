// The plugin's (and phosctl's) side of the agent protocol.
#pragma once

#include <functional>
#include <optional>

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "phos/images/agent_protocol.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::plugin {

// Bounds on what an agent may list.
inline constexpr uint64_t kMaxAllocations = 1u << 20;
inline constexpr uint64_t kMaxAllocationBytes = 1ull << 40;  // 1 TiB
inline constexpr uint64_t kPageBytes = 4096;
inline constexpr uint64_t kUserAddressEnd = 1ull << 57;  // x86-64 and arm64 user space, 5-level paging included
inline constexpr uint32_t kMaxDevices = 1024;

// An allocation list as a dump may take it: each allocation non-empty, at
// most 1 TiB, page-aligned, in user address space, its id once, none
// overlapping another. The error names the allocation and what is wrong.
Result<void> check_allocations(const std::vector<agent::Allocation>& allocs);
// `fd` as the memory of allocation `a`: not a regular file (/proc/self/mem
// included), directory, socket, pipe, link or block device.
Result<void> check_memory_fd(int fd, const agent::Allocation& a);

// Random, drawn once per process (one criu run): the name under which the
// ranks of an NCCL job resumed by this run find their new unique id. Under
// PHOS_JOB (one host's criu of a job across hosts, job_env.h), the job's
// run instead, the same on every host.
uint64_t nccl_nonce();

class AgentClient {
 public:
  // Called every kWatchStepMs while a reply is waited for, with that step:
  // a text ends the wait with it as the error (why no answer can come).
  using Watch = std::function<std::optional<std::string>(int step_ms)>;
  static constexpr int kWatchStepMs = 50;

  // Finds the agent of `pid`, connects (in the target's network namespace,
  // where its abstract socket lives) and says hello. ENOENT: no agent.
  static Result<AgentClient> connect(pid_t pid, int timeout_ms, Watch watch = {});

  const agent::HelloReply& hello() const { return hello_; }
  Result<agent::StatusReply> status();
  Result<agent::QuiesceReply> quiesce(uint32_t timeout_ms);
  // Every allocation, checked (check_allocations; with fds, check_memory_fd):
  // the agent runs in the process being dumped and is not trusted.
  Result<std::vector<agent::Allocation>> list_allocations(bool with_fds, std::vector<UniqueFd>* fds);
  Result<uint64_t> release_mappings(bool release_handles = false);
  Result<uint64_t> remap(const std::vector<uint64_t>& ids, const std::vector<int>& fds);
  // Maps `allocs` back with their fds (fds[i] for allocs[i]), a frame's worth
  // at a time; with no allocations, the same memory as before (no fds).
  Result<uint64_t> remap_all(const std::vector<agent::Allocation>& allocs, const std::vector<UniqueFd>& fds);
  // Sends nccl_nonce(): the process's NCCL communicators with ranks in
  // other processes meet again under it.
  Result<void> resume();
  // The same, the ranks meeting under `run` (phosctl job's give-back of
  // ranks criu never paused).
  Result<void> resume(uint64_t run);
  // Read/write-set speculation of launches on or off (off: validation too).
  Result<void> set_speculation(bool on);
  // Validation on (speculation with it) or off (speculation stays on). True
  // when the process has the SASS-level validator attached; an agent that
  // does not know validation is an error.
  Result<bool> set_validation(bool on);
  // A concurrent dump's copy window (copy_state.h): `fds` are the table's
  // memfd, then the pool's fd where q.pool_bytes is not 0.
  Result<agent::OpenCopyWindowReply> open_copy_window(const agent::OpenCopyWindowRequest& q,
                                                      std::span<const int> fds);
  // `missed`: the engine found a copy that differs from the freeze (the
  // agent remembers it: StatusReply::cow_missed).
  // `missed_chunks`: the chunks whose copy differed from the freeze (the
  // reply names the launches that could have written them).
  Result<agent::CloseCopyWindowReply> close_copy_window(bool missed = false,
                                                        std::vector<agent::AddressRange> missed_chunks = {});
  // A job-wide quiesce's stop on the communicators of `job_id`: armed at
  // `at_call` (true where armed), or disarmed without. With `lease_ms`
  // (and `at_call`), the agent lifts it itself unless it is armed again
  // within that long (agent.proto NcclStopRequest.lease_ms).
  Result<bool> nccl_stop(uint64_t job_id, std::optional<uint64_t> at_call,
                         std::optional<uint32_t> lease_ms = std::nullopt);
  // A release of the process's NCCL communicators made pending, or no
  // longer (agent.proto NcclStopRequest.pend_release).
  Result<void> nccl_pend_release(uint64_t job_id, bool pend);
  // Asks the agent to close its end and waits until it has, so that the
  // target holds no socket to us when CRIU dumps its files.
  Result<void> goodbye();

 private:
  AgentClient(UniqueFd sock, int timeout_ms, Watch watch)
      : sock_(std::move(sock)), timeout_ms_(timeout_ms), watch_(std::move(watch)) {}
  // Waits until a reply can be read, `timeout_ms` at most, asking watch_
  // meanwhile; its answer is the error.
  Result<void> wait_readable(const agent::Request& request, int timeout_ms);
  // Sends `request` (with `fds`) and returns its reply, which must be a
  // `R`; an Error reply is the error. The fds that came with the reply go
  // to `reply_fds`. The reply is waited for the client's timeout plus
  // `longer_ms`.
  template <class R>
  Result<R> call(const agent::Request& request, std::span<const int> fds = {},
                 std::vector<UniqueFd>* reply_fds = nullptr, int longer_ms = 0);
  Result<agent::SpeculateReply> speculate_request(bool on, std::optional<bool> validate);

  UniqueFd sock_;
  int timeout_ms_;
  Watch watch_;
  agent::HelloReply hello_;
};

}  // namespace phos::plugin

#include <functional>

namespace phos::plugin {

// Talks to the agent of `pid`, connects, runs `fn` and says goodbye. When
// criu holds the process stopped under ptrace, the agent thread alone is let
// run meanwhile and stopped again after.
Result<void> with_agent(pid_t pid, int timeout_ms, const std::function<Result<void>(AgentClient&)>& fn);

}  // namespace phos::plugin
