// The agent's view of a process that runs with the CUDA hooks.
#pragma once

#include <map>
#include <string>

#include "memory/driver_limits.h"
#include "phos/hooks/agent_backend.h"
#include "runtime.h"

namespace phos::hooks {

class CudaBackend final : public AgentBackend {
 public:
  // What the agent reads and drives: the device memory, the module
  // registry, the launch log, the speculation and the validation, a dump's
  // copy window, the NCCL communicators, the counters, the calls that make
  // a checkpoint impossible, whether CUDA was used, and the call counter.
  struct Deps : RuntimeView {
    using RuntimeView::call_cycles;
    using RuntimeView::copy_window;
    using RuntimeView::counters;
    using RuntimeView::cuda_used;
    using RuntimeView::launches;
    using RuntimeView::memory;
    using RuntimeView::modules;
    using RuntimeView::nccl;
    using RuntimeView::speculation;
    using RuntimeView::unsupported;
    using RuntimeView::validation;
  };
  explicit CudaBackend(Deps rt) : rt_(rt) {}

  agent::StatusReply status() override;
  std::vector<agent::Allocation> allocations() override;
  Result<UniqueFd> export_allocation(uint64_t id) override;
  Result<void> drain(std::chrono::milliseconds timeout) override;
  Result<uint64_t> release_mappings(bool drop_handles) override;
  Result<uint64_t> remap(std::span<const uint64_t> ids, std::vector<UniqueFd> fds) override;
  std::vector<uint64_t> touch_order() override;
  Result<void> set_speculation(bool on) override;
  Result<bool> set_validation(bool on) override;
  Result<agent::OpenCopyWindowReply> open_copy_window(const agent::OpenCopyWindowRequest& q,
                                                      std::vector<UniqueFd> fds) override;
  Result<agent::CloseCopyWindowReply> close_copy_window(const std::vector<agent::AddressRange>& missed) override;
  Result<bool> nccl_stop(uint64_t job_id, std::optional<uint64_t> at_call) override;
  Result<NcclReleased> nccl_release(std::chrono::milliseconds timeout) override;
  Result<uint32_t> nccl_rebuild(std::optional<uint64_t> nonce) override;
  Result<bool> nccl_pend_release(bool pend) override;
  Result<agent::IpcOpenReply> ipc_open(uint64_t id, pid_t importer, UniqueFd* fd) override;
  Result<void> ipc_close(uint64_t id, pid_t importer) override;
  void gate_opening() override;

 private:
  // PHOS_SHRINK_DRIVER_STATE (driver_limits.h): lowered once the memory is
  // released for the driver's checkpoint, set back before the gate opens.
  void shrink_driver_state();
  void restore_driver_state();

  const Deps rt_;
  DriverLimits limits_;
  // Validation's counts when the window opened: what a close compares.
  uint64_t violations_at_open_ = 0;
  std::map<std::string, uint64_t> kernel_violations_at_open_;
};

}  // namespace phos::hooks
