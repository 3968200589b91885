// What the agent asks of the process it lives in. The CUDA hooks implement it
// over their allocation table (cuda_backend.h); tests use fakes.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <sys/types.h>
#include <vector>

#include "phos/images/agent_messages.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::hooks {

// The NCCL communicators destroyed before the gate closes for a checkpoint
// (nccl_release in hooks/nccl.h, AgentBackend::nccl_release): how many, in
// how long (QuiesceReply's nccl_released, nccl_release_ns).
struct NcclReleased {
  uint32_t communicators = 0;
  uint64_t ns = 0;  // from the first ticket waited for to the last destroy
};

class AgentBackend {
 public:
  virtual ~AgentBackend() = default;
  // The status reply but for gate_open, which the agent fills in: it owns
  // the gate.
  virtual agent::StatusReply status() = 0;
  virtual std::vector<agent::Allocation> allocations() = 0;
  // A new fd for the allocation's physical memory; the caller closes it.
  virtual Result<UniqueFd> export_allocation(uint64_t id) = 0;
  // With the gate closed: wait for all submitted GPU work.
  virtual Result<void> drain(std::chrono::milliseconds timeout) = 0;
  // drop_handles: the memory itself goes too (see ReleaseMappingsRequest).
  virtual Result<uint64_t> release_mappings(bool drop_handles) = 0;
  // Map allocations back: the same memory when fds is empty, else fds[i] for ids[i].
  virtual Result<uint64_t> remap(std::span<const uint64_t> ids, std::vector<UniqueFd> fds) = 0;
  // With the gate closed: the allocation ids in the order the recorded
  // launches first touched them (QuiesceReply::touch_order); none where
  // nothing is recorded.
  virtual std::vector<uint64_t> touch_order() { return {}; }
  // Read/write-set speculation of every launch on or off (statistics are kept).
  virtual Result<void> set_speculation(bool on) = 0;
  // Validation of the speculation on (speculation with it) or off
  // (statistics are kept). True when the SASS-level validator is attached.
  virtual Result<bool> set_validation(bool on) = 0;
  // A concurrent dump's copy window (copy_window.h): opened with the
  // table's fd and the pool's; closed with what it cost and whether a
  // validated launch wrote outside its set meanwhile. A backend without
  // device memory has nothing to protect.
  virtual Result<agent::OpenCopyWindowReply> open_copy_window(const agent::OpenCopyWindowRequest&,
                                                              std::vector<UniqueFd>) {
    return make_error("this process has no copy window", ENOTSUP);
  }
  // `missed_chunks`: chunks whose copy differed from the freeze; the reply
  // names the launches that could have written them.
  virtual Result<agent::CloseCopyWindowReply> close_copy_window(const std::vector<agent::AddressRange>& missed_chunks) {
    (void)missed_chunks;
    return make_error("this process has no copy window", ENOTSUP);
  }
  // A job-wide quiesce's stop on the NCCL communicators of `job_id`
  // (nccl_communicators.h): armed at `at_call`, or disarmed without; true
  // where armed. A backend without NCCL has none.
  virtual Result<bool> nccl_stop(uint64_t job_id, std::optional<uint64_t> at_call) {
    (void)job_id;
    (void)at_call;
    return make_error("this process has no NCCL communicators", ENOTSUP);
  }
  // Before the gate closes for a checkpoint: the NCCL communicators
  // destroyed; after it opens again: made again behind the program's
  // handles (how many). A backend without NCCL has none.
  virtual Result<NcclReleased> nccl_release(std::chrono::milliseconds timeout) {
    (void)timeout;
    return NcclReleased{};
  }
  // `nonce`: the resuming criu run's (ResumeRequest.nccl_nonce).
  virtual Result<uint32_t> nccl_rebuild(std::optional<uint64_t> nonce) {
    (void)nonce;
    return 0u;
  }
  // CUDA IPC: an fd of allocation `id`'s memory for process `importer`
  // (its pid here), recorded as an importer until ipc_close or its end.
  virtual Result<agent::IpcOpenReply> ipc_open(uint64_t id, pid_t importer, UniqueFd* fd) {
    (void)id;
    (void)importer;
    (void)fd;
    return make_error("this process serves no CUDA IPC", ENOTSUP);
  }
  virtual Result<void> ipc_close(uint64_t id, pid_t importer) {
    (void)id;
    (void)importer;
    return make_error("this process serves no CUDA IPC", ENOTSUP);
  }
  // The gate is about to open after a checkpoint (ResumeRequest), still
  // closed: what was set aside for the checkpoint goes back.
  virtual void gate_opening() {}
  // A job-wide quiesce's second step (NcclStopRequest.pend_release).
  virtual Result<bool> nccl_pend_release(bool pend) {
    (void)pend;
    return make_error("this process has no NCCL communicators", ENOTSUP);
  }
};

}  // namespace phos::hooks
