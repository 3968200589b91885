#include "driver/driver_checkpoint.h"

#include <unistd.h>

#include <functional>
#include <optional>
#include <string>

#include "driver/cuda_api.h"
#include "phos/plugin/proc.h"
#include "common/stopped_thread.h"

namespace phos::plugin {
namespace {

Result<void> with_restore_thread(pid_t pid, const char* what, const std::function<CUresult(const CudaApi&)>& fn) {
  auto cu = CudaApi::get();
  if (!cu) return cu.error();
  const CudaApi& api = **cu;
  int tid = 0;
  PHOS_CU(api, api.cuCheckpointProcessGetRestoreThreadId(pid, &tid),
          ("process " + std::to_string(pid) + ": restore thread").c_str());
  std::optional<StoppedThreadRun> run;
  auto tracer = tracer_of(pid, tid);
  if (tracer && *tracer == ::getpid()) {
    auto started = StoppedThreadRun::start(tid);
    if (!started) return started.error();
    run.emplace(std::move(*started));
  }
  CUresult r = fn(api);
  if (run) PHOS_TRY(run->stop());
  if (r != CUDA_SUCCESS) return make_error(api.error(("process " + std::to_string(pid) + ": driver " + what).c_str(), r), EIO);
  return {};
}

}  // namespace

Result<CUprocessState> driver_state(pid_t pid) {
  auto cu = CudaApi::get();
  if (!cu) return cu.error();
  CUprocessState state;
  PHOS_CU(**cu, (*cu)->cuCheckpointProcessGetState(pid, &state), "driver state");
  return state;
}

bool has_driver_state(pid_t pid) {
  auto cu = CudaApi::get();
  int tid = 0;
  return cu && (*cu)->cuCheckpointProcessGetRestoreThreadId(pid, &tid) == CUDA_SUCCESS && tid > 0;
}

Result<void> driver_lock(pid_t pid, unsigned timeout_ms) {
  auto cu = CudaApi::get();
  if (!cu) return cu.error();
  CUcheckpointLockArgs args{};
  args.timeoutMs = timeout_ms;
  PHOS_CU(**cu, (*cu)->cuCheckpointProcessLock(pid, &args), ("process " + std::to_string(pid) + ": driver lock").c_str());
  return {};
}

Result<void> driver_checkpoint(pid_t pid) {
  return with_restore_thread(pid, "checkpoint", [&](const CudaApi& api) {
    CUcheckpointCheckpointArgs args{};
    return api.cuCheckpointProcessCheckpoint(pid, &args);
  });
}

Result<void> driver_restore_and_unlock(pid_t pid, const std::vector<CUcheckpointGpuPair>& gpu_pairs) {
  return with_restore_thread(pid, "restore", [&](const CudaApi& api) {
    CUcheckpointRestoreArgs args{};
    if (!gpu_pairs.empty()) {
      args.gpuPairs = const_cast<CUcheckpointGpuPair*>(gpu_pairs.data());
      args.gpuPairsCount = unsigned(gpu_pairs.size());
    }
    CUresult r = api.cuCheckpointProcessRestore(pid, &args);
    if (r != CUDA_SUCCESS) return r;
    CUcheckpointUnlockArgs unlock{};
    return api.cuCheckpointProcessUnlock(pid, &unlock);
  });
}

Result<void> driver_unlock(pid_t pid) {
  return with_restore_thread(pid, "unlock", [&](const CudaApi& api) {
    CUcheckpointUnlockArgs args{};
    return api.cuCheckpointProcessUnlock(pid, &args);
  });
}

}  // namespace phos::plugin
