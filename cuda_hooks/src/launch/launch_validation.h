// Validation of the speculation with PTX twins (ptx/): while it
// is on (PHOS_VALIDATE=1), a kernel from a module the program loaded as PTX
// text (Triton, NVRTC, cuModuleLoadData of PTX) is launched as its twin,
// with a range table holding the launch's speculated write set; the twin
// checks every store, atomic and bulk copy against it, counts the ones that
// fall outside into the table and still performs them. The table lives in
// pinned host memory mapped into the device, so the count is read on the
// host once the launch has completed (an event), with no copy.
//
// Kernels that have no twin to run go to the SASS-level validator
// (sass_validation.h) when it is attached: kernels of modules loaded as
// cubins (cuBLAS, cuDNN, PyTorch's own), twins that are incomplete (indirect
// calls, instructions phos does not know), kernels that use module-scope
// variables (a separately loaded twin module has its own copies: running
// it would change what the program does). They run as they are, in their
// patched module, with the same range table.
//
// On-demand restore (copy_window.h, fill mode): each module also gets fill
// twins, which check loads as well as stores. While a restore fills the
// process's memory, a kernel with a fill twin waits only for its speculated
// sets, then runs as its fill twin with a table of the memory that is in
// (everything but the chunks not yet filled); the launch is waited for and
// an access outside it ends the process (prepare_fill, finish_fill).
//
// Twins are built off the launch path: a module's twins (the PTX rewritten,
// then loaded, which the driver JIT-compiles: tens of ms a module) are
// built by a thread of their own as soon as the module is loaded, into the
// context current at its load; a first launch waits only for what is left
// of that build, or builds them itself where none was started (no context
// current at the load, background builds off).
//
// What is not validated runs as it is: launches whose set is unknown,
// launches into a stream being captured, the packed-argument form, and
// kernels neither validator can take (the reason is in the statistics).
#pragma once

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "launch/launch_speculation.h"
#include "phos/hooks/gate.h"
#include "phos/hooks/kernel_registry.h"
#include "phos/hooks/sass_validation.h"
#include "phos/ptx/range_table.h"
#include "phos/ptx/twin.h"
#include "phos/support/result.h"

namespace phos::hooks {

class LaunchValidation {
 public:
  // `gate`: what background builds pass (set_background_builds).
  LaunchValidation(KernelRegistry& kernels, Gate& gate) : kernels_(kernels), gate_(gate) {}

  bool active() const { return active_.load(std::memory_order_relaxed); }
  // Off: the patched modules are unpatched.
  void set_active(bool on);
  bool ever_active() const { return ever_active_.load(std::memory_order_relaxed); }
  // PHOS_VALIDATE: "1" or "all" (twins, then SASS for the rest), "ptx"
  // (twins only), "sass" (SASS only). SASS needs attach_sass() before the
  // first CUDA call.
  enum class Validators { kPtxAndSass, kPtx, kSass };
  void set_validators(Validators v) { validators_ = v; }
  // PHOS_FILL_TWINS=0: no fill twins (an on-demand restore then makes
  // every kernel wait for the whole fill), for programs that pay for their
  // build at each module's first launch.
  void set_fill_twins(bool on) { fill_twins_ = on; }
  Result<void> attach_sass() { return sass_.attach(); }
  bool sass_attached() const { return sass_.attached(); }

  // A module loaded (module registry id `id`) from `image`: PTX text
  // (NUL-terminated) when is_ptx, else a fatbin (or cudart's wrapper of
  // one), whose newest PTX entry this GPU can run is taken; nothing to
  // validate without one. Its kernels find it through their registry entry.
  void module_loaded(uint64_t id, uint64_t hash, const void* image, bool is_ptx);
  // A module loaded from an ELF cubin of `size` bytes: Triton assembles its
  // kernels itself and loads the cubin, keeping the PTX beside it in its
  // cache (TRITON_CACHE_DIR, else ~/.triton/cache: <hash>/<name>.cubin and
  // <name>.ptx); a cubin found there byte for byte brings its PTX.
  void cubin_loaded(uint64_t id, uint64_t hash, const void* image, size_t size);
  // The module or library under `handle` (module registry id `id`, 0 where
  // not known) was unloaded: its twins and patched modules go with it. Its
  // kernels' state went with their registry entries.
  void module_unloaded(const void* handle, uint64_t id);

  struct Table {
    uint64_t* host = nullptr;
    CUdeviceptr device = 0;
    CUevent done = nullptr;
    void* kernel = nullptr;  // the ValidatedKernel it validates
    bool keep_out = false;   // its function may still hand it out: never reused
  };
  // A launch to make: the twin with kernelParams the original ones plus
  // the table's device address; or, validated at the SASS level, the
  // original function with its own parameters in its patched module.
  struct Prepared {
    CUfunction launch = nullptr;  // the twin, or the original (SASS)
    std::vector<void*> params;
    void** launch_params = nullptr;
    bool sass = false;
    SassPatcher::Patched sass_handles;  // its module, and the function the table is set on
    CUdeviceptr table_address = 0;
    Table table;
  };
  // True when `k`'s launch can be validated: the caller launches
  // out->launch with out->launch_params instead, then calls finish(). A SASS
  // launch holds a lock from prepare() to finish(): a patched kernel's table
  // is set per function, for the launches that follow.
  // `shared_bytes`: the launch's dynamic shared memory; above the default
  // 48 KiB the twin gets the same opt-in the original must have had.
  // `writes`: the launch's speculated write set (LaunchSpeculation::on_kernel).
  bool prepare(Kernel& k, void** params, void** extra, uint32_t shared_bytes, const WriteRanges& writes,
               Prepared* out);
  // False when the twin's launch failed: the kernel is not validated from
  // then on, and the caller launches the original (validation must never
  // change what the program gets). A SASS launch was the original: true.
  bool finish(Prepared& p, CUresult launched, CUstream stream);

  // On-demand restore: true when `k` has a fill twin and its table of
  // `allowed` ranges ([start, end), the memory that is in) fits; the caller
  // launches out->launch with out->launch_params, then calls finish_fill().
  bool prepare_fill(Kernel& k, void** params, void** extra, uint32_t shared_bytes,
                    const std::vector<std::pair<uint64_t, uint64_t>>& allowed, Prepared* out);
  // Waits for the fill twin's launch and returns its violations (an
  // error where it could not be launched or waited for: the caller then
  // launches the original, after the whole fill).
  Result<ptx::Violations> finish_fill(Prepared& p, CUresult launched, CUstream stream);
  // The kernel a prepared launch is for, by name (for messages).
  std::string kernel_name(const Prepared& p);

  // A launch of `k` that is not validated: when k is validated at the SASS
  // level, the lock validated launches hold while k's table is set, so that
  // this launch passes no table; empty for every other kernel (and for null,
  // a kernel not in the registry).
  std::unique_lock<std::mutex> hold_unvalidated(const Kernel* k);

  struct KernelStats {
    std::string name;
    uint64_t validated = 0, violations = 0, launches_with_violations = 0;
    uint64_t first_address = 0, first_site = 0;  // site: the twin's check ordinal, or the SASS pc
    std::string validator;  // "ptx" or "sass"
    std::string skipped;  // why this kernel is not validated; empty if it is
  };
  // Builds twins in a thread of their own from each module's load on,
  // passing the gate (a checkpoint's quiesce waits for a build in the
  // driver, and holds the next); off: at each module's first launch only.
  void set_background_builds(bool on);
  // Around fork() (pthread_atfork): the lock held across it, so that the
  // child does not inherit it held by a thread it does not have; in the
  // child, the builder thread is not there: queued builds are left to the
  // first launch, one under way is given up.
  void before_fork();
  void after_fork_in_parent();
  void after_fork_in_child();
  // At exit (an atexit handler registered when the builder starts, so it
  // runs before the driver's teardown): no build is started any more, and
  // the one in the driver is waited for; a process ending mid-JIT crashed
  // in the driver.
  void stop_builder();

  struct Totals {
    uint64_t validated = 0, pending = 0, violations = 0, modules = 0, twins = 0, incomplete = 0;
    uint64_t twin_build_ns = 0, twin_build_max_ns = 0;
    uint64_t background_builds = 0;  // modules whose twins the builder thread made
    uint64_t first_launch_wait_max_ns = 0;  // the longest a first launch built or waited for twins
    bool sass_attached = false;
    SassPatcher::Totals sass;
  };
  // Reads the tables of completed launches first.
  Totals totals();
  // Live kernels first, then those of unloaded modules.
  std::vector<KernelStats> kernels();

 private:
  enum class Build : uint8_t { kNone, kQueued, kBuilding, kDone };
  struct Module {
    uint64_t hash = 0;
    std::string ptx;
    Build build = Build::kNone;
    bool fill_pending = false;  // its fill twins are still to be built (its PTX kept until then)
    bool unloaded = false;  // while the builder had it: its twins are dropped when done
    CUcontext load_ctx = nullptr;  // current at its load: where the builder loads its twins
    CUcontext ctx = nullptr;
    CUmodule twins = nullptr;
    CUmodule fill_twins = nullptr;  // loads and stores checked (on-demand restore)
    std::map<std::string, std::string> skip;  // kernel -> why it is not validated
    std::map<std::string, std::string> kernels;  // kernel the PTX defines -> its twin's name
    std::map<std::string, std::string> fill_kernels;  // -> its fill twin's name
    std::string unusable;                     // why no kernel of it is validated; empty if some can be
  };
  // What the validation keeps per kernel, in its registry entry.
  struct ValidatedKernel final : KernelState {
    std::shared_ptr<Module> module;
    CUfunction twin = nullptr;  // null: not validated by a twin
    CUfunction fill_twin = nullptr;  // null: no read validation while a restore fills
    bool fill_resolved = false;  // looked for in the module's fill twins (built after its twins)
    bool sass = false;          // validated at the SASS level
    SassPatcher::Patched sass_handles;  // its module, the function its table is set on, its library
    uint32_t params = 0;
    uint32_t shared_opt_in = 0;  // dynamic shared memory the twin was allowed above 48 KiB
    KernelStats stats;
  };
  static constexpr size_t kTableRanges = 64;
  static constexpr size_t kTablesPerBlock = 256;

  // `k`'s state, made at its first validated launch (null: neither
  // validator can take it); builds the module's twins at the first launch of
  // any of its kernels.
  ValidatedKernel* kernel_locked(Kernel& k, std::unique_lock<std::mutex>& lock);
  void resolve_twin_locked(ValidatedKernel& v, const Kernel& k);
  void try_sass_locked(ValidatedKernel& v, Kernel& k);
  // What a build makes of a module's PTX (in the current context), before
  // it is published into its Module under the lock.
  struct Twins {
    CUcontext ctx = nullptr;
    CUmodule twins = nullptr;
    std::map<std::string, std::string> skip, kernels;
    std::string unusable;
    uint64_t count = 0, incomplete = 0, ns = 0;
  };
  // The fill twins come after (a second module for the driver to compile):
  // only an on-demand restore's fill needs them, never a first launch.
  struct FillTwins {
    CUmodule module = nullptr;
    std::map<std::string, std::string> kernels;
  };
  // A build in two steps: the PTX rewritten (the CPU's), then loaded (the
  // driver's JIT, in the current context).
  struct Rewritten {
    Result<ptx::TwinResult> twins;
    uint64_t ns = 0;
  };
  static Rewritten rewrite(const std::string& ptx, bool fill);
  static Twins load_twins(const Rewritten& rewritten);
  static FillTwins load_fill_twins(const Rewritten& rewritten);
  void publish_locked(Module& m, Twins t);
  void publish_fill_locked(Module& m, FillTwins f);
  // After its twins: the fill twins, by the builder, or now where there is
  // none; the PTX let go once nothing is left to build from it.
  void schedule_fill_locked(const std::shared_ptr<Module>& m);
  void resolve_fill_locked(ValidatedKernel& v, const std::string& name);
  // Built before `k`'s first validated launch goes on: now, or by the
  // builder (waited for, the lock released meanwhile).
  void ensure_built(const std::shared_ptr<Module>& m, std::unique_lock<std::mutex>& lock);
  struct BuildJob {
    std::shared_ptr<Module> module;
    bool fill = false;
  };
  void queue_job_locked(BuildJob job);
  void queue_build_locked(const std::shared_ptr<Module>& m);
  void builder_loop();
  void run_job(BuildJob& job, std::unique_lock<std::mutex>& lock);
  bool table_locked(Table* out);
  void collect_locked();
  std::string triton_ptx(const void* image, size_t size);

  KernelRegistry& kernels_;
  Gate& gate_;
  std::atomic<bool> active_{false}, ever_active_{false};
  Validators validators_ = Validators::kPtxAndSass;
  bool fill_twins_ = true;
  SassPatcher sass_;
  std::mutex sass_launch_mu_;  // from a SASS launch's prepare() to its finish()
  std::mutex mu_;
  // By module registry id. Kernels keep theirs (shared_ptr) in their entry.
  std::unordered_map<uint64_t, std::shared_ptr<Module>> modules_;
  // The builder thread (started with the first module it gets) and its queue.
  bool background_builds_ = false;
  bool builder_started_ = false;
  bool builder_stopping_ = false;  // exit: queue nothing more
  bool job_running_ = false;       // the builder is in a build, the lock released
  std::deque<BuildJob> build_queue_;
  std::condition_variable build_cv_;  // a module queued, or a build published
  std::vector<Table> free_;
  std::deque<Table> in_flight_;
  Totals totals_;
};

}  // namespace phos::hooks
