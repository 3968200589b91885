// The hooks' side of a concurrent dump's copy window (images/copy_state.h):
// while the engine in criu copies the process's device memory, every call
// that writes device memory first makes sure the memory it writes is safe to
// change. Soft copy-on-write: a chunk the engine has not copied yet is
// copied device to device into a pool slot first (the pool is device memory
// the engine exported), and the engine takes it from there. Calls whose
// write set is unknown, or not trusted (agent::CopyTrust), wait until the
// window closes. Soft recopy (the table's protocol): a write marks its
// chunks dirty, for the engine to copy again once the gate is closed; an
// unknown or untrusted set marks every chunk; nothing waits. With
// cow_trust=checksum the engine checks every copy against the freeze's
// fingerprints: speculated sets are trusted, the kernels launched on them
// are counted (a refused image names them), and recopy counts an untrusted
// call instead of marking every chunk (its final pass copies again what
// changed, whatever the marks say). On-demand
// restore (the table's fill protocol): a call waits until the memory it
// reads and writes is filled (an exact set's ranges; a kernel's speculated
// set only where it is exact), every other call until the whole fill is in;
// a call that overwrites whole chunks takes them as filled. A fill that
// cannot complete ends the process: it must never compute on memory that is
// not restored.
//
// The program's own host<->device transfers are told to a dump's window
// (copy-on-write, recopy), for the engine to pause its copy meanwhile (PhOS
// §5); not to a fill window: there the program's calls wait for the fill,
// which is then the program's own priority.
//
// Closed (no dump running), each call pays one relaxed load, and only where
// it already described its set (recording or speculating is on).
#pragma once

#include <cuda.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "phos/hooks/call_ranges.h"
#include "phos/hooks/window_account.h"
#include "phos/images/agent_messages.h"
#include "phos/images/copy_state.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::hooks {

struct WriteRanges;
class Kernel;

class CopyWindow {
 public:
  bool open() const { return open_.load(std::memory_order_relaxed); }
  // The number of windows opened so far: the open one's, while one is.
  uint64_t sequence() const { return sequence_.load(std::memory_order_acquire); }
  agent::CopyTrust trust() const { return trust_; }

  // The agent: `fds` holds the table's memfd, then one fd per pool of
  // q.pools; each pool is mapped in the primary context of its GPU.
  // `allocations`: the process's, for the GPU of each of the table's
  // regions (a chunk is saved into the pool on its region's GPU).
  Result<void> start(const agent::OpenCopyWindowRequest& q, std::vector<UniqueFd> fds,
                     const std::vector<agent::Allocation>& allocations);
  // The agent: stops consulting the table once no call is inside, lets go
  // of the pool; the statistics (without the validation's part), the calls
  // that waited longest, and the launches that could have written
  // `missed_chunks` (window_account.h).
  agent::CloseCopyWindowReply finish(const std::vector<agent::AddressRange>& missed_chunks = {});

  // Before a call with an exact set (copies, memsets, library calls):
  // ranges that are written, or whose extent is unknown. `call` names it
  // for the longest waits (a string that lives on).
  void before_exact(const ranges::RangeList& l, const char* call = "a copy or set");
  // Before a library call (cuBLAS, NCCL) with its exact set. An on-demand
  // restore waits for the whole fill: the set names the matrices and the
  // workspace, not pointers the call may also follow (alpha and beta in
  // device memory, cublasLt's bias, scale and amax).
  void before_library(const ranges::RangeList& l, const char* call = "a library call");
  // Before a kernel launch: `validated` when it runs validated (a twin or
  // a patched module checks its writes against `writes`); `kernel`, where
  // known, is counted when its speculated set is trusted.
  void before_kernel(const WriteRanges& writes, bool validated, const Kernel* kernel = nullptr);
  // On-demand restore, before a kernel that has a fill twin: waits for its
  // speculated read and write sets, then returns the memory that is in (the
  // complement of the chunks not filled), for the twin's table; nothing
  // where no fill window is open (the kernel then launches as usual).
  std::optional<std::vector<std::pair<uint64_t, uint64_t>>> before_fill_twin(const WriteRanges& sets);
  // The fill twin of `kernel` touched memory not yet filled (first at
  // `address`): it may have computed on it, the process ends here.
  [[noreturn]] void touched_unfilled(const std::string& kernel, uint64_t address, uint64_t count);
  // The restored memory cannot be made whole, or a kernel may have computed
  // on memory not yet in: the process ends here, saying why.
  [[noreturn]] void fill_failed(const Error& e);
  bool filling_open() const { return open() && fill_.load(std::memory_order_relaxed); }
  // Before a call whose write set is unknown (a graph launch).
  void before_unknown(const char* call = "a call with an unknown write set");
  // The same where a window may be open: one load where none is.
  void before_unknown_call(const char* call) {
    if (__builtin_expect(open(), 0)) before_unknown(call);
  }
  // The program let go of the memory at `address` (its unit, whose memory
  // lives on in the engine's mapping).
  void unit_dropped(uint64_t address);
  // The program queued (or made) a host<->device transfer of `bytes`.
  void transfer_queued(uint64_t bytes);
  // The program's allocation of `bytes` (by `call`) found the GPU full: with
  // a copy-on-write pool open, asks the engine for it, waits until it is
  // given back (at most cow_timeout_ms) and unmaps this side's mapping.
  // True when memory may have come free: the caller tries again.
  bool give_pool_back(const char* call, uint64_t bytes);

 private:
  class Use;  // a call inside the window (finish() waits for none)
  // The window's state from here on (mu_ held); open from then on.
  // A copy-on-write pool on one GPU, mapped in the process, with its
  // context and a stream for the saves: slot s of the table (first_slot <=
  // s < first_slot + slots) at va + (s - first_slot) * chunk size.
  struct DevicePool {
    CUdevice device = 0;
    CUcontext ctx = nullptr;
    CUdeviceptr va = 0;
    uint64_t bytes = 0;
    uint32_t first_slot = 0;
    uint32_t slots = 0;
    CUstream stream = nullptr;
    // The save kernel (gpu/chunk_save.cu) loaded in ctx; null: saves go
    // through cuMemcpyDtoDAsync.
    CUmodule save_module = nullptr;
    CUfunction save_kernel = nullptr;
  };
  // Maps q.pools[i] from `fd` into `out` (its context retained).
  static Result<void> map_pool(const agent::CopyPool& pool, int fd, DevicePool& out);
  static void unmap_pool(DevicePool& p);
  // Each region's slots: those of the pool on its GPU (none without one).
  static Result<void> assign_slots(copystate::CopyState& table, const std::vector<DevicePool>& pools,
                                   const std::vector<agent::Allocation>& allocations);
  void begin(copystate::CopyState table, const agent::OpenCopyWindowRequest& q, std::vector<DevicePool> pools);
  // One call's cost, summed over its written ranges, counted once it is done.
  struct CallCost {
    uint64_t since_ns = 0;
    uint64_t waited = 0;  // chunks it waited for
    uint64_t saved = 0;   // chunks it saved into the pool
    uint64_t save_ns = 0;         // of its wait: launching its saves and waiting for them
    uint64_t engine_wait_ns = 0;  // of its wait: chunks the engine copies waited for
    bool whole_window = false;  // it waited for the window to close
  };
  void write(uint64_t address, uint64_t bytes, CallCost& cost);
  void settle(const CallCost& cost, const char* call, const Kernel* kernel, bool unknown_set);
  // A call whose set is unknown or not trusted: copy-on-write waits until
  // the window closes; recopy marks every chunk dirty.
  void untrusted(bool unknown_set, const char* call, const Kernel* kernel = nullptr);
  void give_up(const Error& e);
  // One call's saves not launched yet: chunks that follow each other in
  // memory and in their pool go in one launch (a launch whose set spans a
  // 64 GiB buffer saved 13464 chunks, 16.7 us each one at a time).
  struct SaveRun {
    const DevicePool* pool = nullptr;
    CUdeviceptr pool_va = 0;  // the pool's mapping then: given back since, the run is not launched
    uint64_t src = 0, dst = 0, bytes = 0;
    // A run that failed to launch: its chunks were never copied, so the
    // call's completion fails too (none of its batch is taken as saved).
    std::optional<Error> failed;
  };
  // Adds the copy of a chunk into pool slot `slot` to `run`, launching the
  // run before where the chunk does not follow it (`used` gets the pool, for
  // complete_saves).
  Result<void> save(uint64_t address, uint64_t bytes, uint32_t slot, std::vector<const DevicePool*>& used,
                    SaveRun& run);
  // Launches `run` on its pool's stream, and empties it (keeping a failure).
  Result<void> launch_run(SaveRun& run);
  Result<void> launch_now(const SaveRun& run);
  // Returns once the copies save() started into the pools of `used` are done.
  Result<void> complete_saves(const std::vector<const DevicePool*>& used);
  static void load_save_kernel(DevicePool& pool, const std::string& gpu);
  static void unmap_va(DevicePool& p);
  void count_wait(uint64_t since_ns, bool waited, bool unknown_set);
  // On-demand restore: a kernel's read and write sets filled.
  void await_sets(const WriteRanges& sets);
  // On-demand restore: an exact call's ranges.
  void use_exact(const ranges::RangeList& l);
  bool filling() const { return table_->protocol() == CopyProtocol::kOnDemandFill; }
  // The kernels that could have written `missed` (a refused image), for the
  // close's reply; what the reply cannot carry said in the process's log.
  std::vector<agent::KernelLaunches> suspects(const std::vector<agent::AddressRange>& missed) const;
  // On-demand restore: waits until [address, address + bytes) is filled.
  void await_filled(uint64_t address, uint64_t bytes, bool overwrite);

  std::atomic<bool> open_{false};
  std::atomic<uint64_t> sequence_{0};
  std::atomic<bool> fill_{false};  // the open window is an on-demand restore's
  std::atomic<int64_t> users_{0};
  agent::CopyTrust trust_ = agent::CopyTrust::kValidated;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<copystate::CopyState> table_;
  std::vector<DevicePool> pools_;  // copy-on-write: one per GPU with a pool
  std::mutex save_mu_;  // one save at a time
  std::atomic<uint64_t> checked_{0}, waited_{0}, unknown_waits_{0}, wait_ns_{0};
  std::atomic<uint64_t> unmarked_{0};  // recopy under checksum: untrusted calls not marked
  // Launches on a trusted speculated set (and the buffers they pointed
  // into, checksum), the longest waits.
  WindowAccount account_;
  std::mutex mu_;
  std::string abort_reason_;
};

}  // namespace phos::hooks
