#include "driver/driver_checkpoint.h"

#include <unistd.h>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "driver/cuda_api.h"
#include "phos/plugin/proc.h"
#include "common/stopped_thread.h"

namespace phos::plugin {
namespace {

using DriverCall = std::function<CUresult(const CudaApi&, size_t)>;

std::string process_name(pid_t pid) { return "process " + std::to_string(pid); }

// Whether the driver takes the checkpoint calls without cuInit in this
// process: -1 not known yet, 0 it does, 1 it does not. Without it, criu's
// own CUDA start-up on another thread (cuInit: 11 ms in a dump, beside the
// dumped process; 100-210 ms in a restore, alone on the GPU) would hold up
// a dump's driver lock and checkpoint, and a restore's driver restore,
// which can otherwise run beside it.
std::atomic<int> checkpoint_needs_init{-1};

// The API for the checkpoint calls: without cuInit where a first call
// found the driver takes them so; initialized until one has looked.
Result<const CudaApi*> checkpoint_api() {
  return checkpoint_needs_init.load() == 0 ? CudaApi::loaded() : CudaApi::get();
}

// A question to the driver about a process. The first one is asked without
// cuInit: the answer tells whether the driver takes the checkpoint calls
// so, and where it refused (CUDA_ERROR_NOT_INITIALIZED) it is asked again
// with cuInit, as every later call is.
Result<CUresult> ask_driver(const std::function<CUresult(const CudaApi&)>& call) {
  if (checkpoint_needs_init.load() < 0) {
    auto lib = CudaApi::loaded();
    if (!lib) return lib.error();
    CUresult r = call(**lib);
    if (r != CUDA_ERROR_NOT_INITIALIZED) {
      checkpoint_needs_init = 0;
      return r;
    }
    checkpoint_needs_init = 1;
  }
  auto cu = checkpoint_api();
  if (!cu) return cu.error();
  return call(**cu);
}

// Lets the driver's restore thread of `pid` run, where this criu holds it
// stopped; nothing where no one (or another tracer) does. On the calling
// thread: ptrace requests must come from the tracer's own thread.
Result<std::optional<StoppedThreadRun>> run_restore_thread(const CudaApi& api, pid_t pid) {
  int tid = 0;
  PHOS_CU(api, api.cuCheckpointProcessGetRestoreThreadId(pid, &tid), (process_name(pid) + ": restore thread").c_str());
  auto tracer = tracer_of(pid, tid);
  if (!tracer || *tracer != ::getpid()) return std::optional<StoppedThreadRun>();
  auto started = StoppedThreadRun::start(tid);
  if (!started) return started.error();
  return std::optional<StoppedThreadRun>(std::move(*started));
}

// `call(api, i)` for each of `pids`, with its restore thread running. The
// driver's work for one process does not wait on another's, so with several
// processes (a job's ranks) and `parallel`, each runs on a thread of its
// own: the job waits for the slowest, not the sum. Results in `pids`' order.
// `driver_done` (where given): whether the driver's call itself succeeded,
// apart from letting the thread run and stopping it again, which may fail
// on their own.
std::vector<Result<void>> with_restore_threads(const std::vector<pid_t>& pids, const char* what, bool parallel,
                                               const DriverCall& call, std::vector<bool>* driver_done = nullptr) {
  std::vector<Result<void>> results(pids.size());
  if (driver_done) driver_done->assign(pids.size(), false);
  auto cu = checkpoint_api();
  if (!cu) {
    for (auto& r : results) r = cu.error();
    return results;
  }
  const CudaApi& api = **cu;
  std::vector<std::optional<StoppedThreadRun>> runs(pids.size());
  std::vector<CUresult> codes(pids.size(), CUDA_SUCCESS);
  std::vector<size_t> ready;
  for (size_t i = 0; i < pids.size(); i++) {
    auto run = run_restore_thread(api, pids[i]);
    if (!run) {
      results[i] = run.error();
      continue;
    }
    if (*run) runs[i].emplace(std::move(**run));
    ready.push_back(i);
  }
  if (parallel && ready.size() > 1) {
    std::vector<std::thread> threads;
    threads.reserve(ready.size());
    for (size_t i : ready) threads.emplace_back([&, i] { codes[i] = call(api, i); });
    for (auto& t : threads) t.join();
  } else {
    for (size_t i : ready) codes[i] = call(api, i);
  }
  for (size_t i : ready) {
    Result<void> stopped = runs[i] ? runs[i]->stop() : Result<void>();
    if (driver_done) (*driver_done)[i] = codes[i] == CUDA_SUCCESS;
    if (codes[i] != CUDA_SUCCESS)
      results[i] = make_error(api.error((process_name(pids[i]) + ": driver " + what).c_str(), codes[i]), EIO);
    else if (!stopped)
      results[i] = stopped.error();
  }
  return results;
}

Result<void> with_restore_thread(pid_t pid, const char* what, const std::function<CUresult(const CudaApi&)>& fn) {
  return with_restore_threads({pid}, what, false, [&](const CudaApi& api, size_t) { return fn(api); })[0];
}

CUresult restore_and_unlock(const CudaApi& api, pid_t pid, const std::vector<CUcheckpointGpuPair>& gpu_pairs) {
  CUcheckpointRestoreArgs args{};
  if (!gpu_pairs.empty()) {
    args.gpuPairs = const_cast<CUcheckpointGpuPair*>(gpu_pairs.data());
    args.gpuPairsCount = unsigned(gpu_pairs.size());
  }
  CUresult r = api.cuCheckpointProcessRestore(pid, &args);
  if (r != CUDA_SUCCESS) return r;
  CUcheckpointUnlockArgs unlock{};
  return api.cuCheckpointProcessUnlock(pid, &unlock);
}

CUresult checkpoint(const CudaApi& api, pid_t pid) {
  CUcheckpointCheckpointArgs args{};
  return api.cuCheckpointProcessCheckpoint(pid, &args);
}

}  // namespace

Result<CUprocessState> driver_state(pid_t pid) {
  CUprocessState state;
  auto r = ask_driver([&](const CudaApi& api) { return api.cuCheckpointProcessGetState(pid, &state); });
  if (!r) return r.error();
  if (*r != CUDA_SUCCESS) return make_error((*CudaApi::loaded())->error("driver state", *r), EIO);
  return state;
}

// (A restore asks this first: the state hangs on a process criu holds stopped.)
bool has_driver_state(pid_t pid) {
  int tid = 0;
  auto r = ask_driver([&](const CudaApi& api) { return api.cuCheckpointProcessGetRestoreThreadId(pid, &tid); });
  return r && *r == CUDA_SUCCESS && tid > 0;
}

Result<void> driver_lock(pid_t pid, unsigned timeout_ms) {
  auto cu = checkpoint_api();
  if (!cu) return cu.error();
  CUcheckpointLockArgs args{};
  args.timeoutMs = timeout_ms;
  PHOS_CU(**cu, (*cu)->cuCheckpointProcessLock(pid, &args), ("process " + std::to_string(pid) + ": driver lock").c_str());
  return {};
}

Result<void> driver_checkpoint(pid_t pid) {
  return with_restore_thread(pid, "checkpoint", [&](const CudaApi& api) { return checkpoint(api, pid); });
}

std::vector<Result<void>> driver_checkpoint_all(const std::vector<pid_t>& pids, bool parallel,
                                                std::vector<bool>* checkpointed) {
  return with_restore_threads(
      pids, "checkpoint", parallel, [&](const CudaApi& api, size_t i) { return checkpoint(api, pids[i]); },
      checkpointed);
}

Result<void> driver_restore_and_unlock(pid_t pid, const std::vector<CUcheckpointGpuPair>& gpu_pairs) {
  return with_restore_thread(pid, "restore", [&](const CudaApi& api) { return restore_and_unlock(api, pid, gpu_pairs); });
}

std::vector<Result<void>> driver_restore_and_unlock_all(const std::vector<DriverRestore>& restores, bool parallel) {
  std::vector<pid_t> pids;
  for (const auto& r : restores) pids.push_back(r.pid);
  return with_restore_threads(pids, "restore", parallel, [&](const CudaApi& api, size_t i) {
    return restore_and_unlock(api, restores[i].pid, restores[i].gpu_pairs);
  });
}

Result<void> driver_unlock(pid_t pid) {
  return with_restore_thread(pid, "unlock", [&](const CudaApi& api) {
    CUcheckpointUnlockArgs args{};
    return api.cuCheckpointProcessUnlock(pid, &args);
  });
}

}  // namespace phos::plugin
