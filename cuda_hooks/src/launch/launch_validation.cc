#include "launch/launch_validation.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "driver/driver.h"
#include "modules/kernel_info.h"
#include "phos/ptx/range_table.h"
#include "phos/ptx/twin.h"
#include "phos/speculation/fatbin.h"
#include "phos/support/clock.h"

namespace phos::hooks {

namespace {

// The PTX Triton kept beside the cubin identical to `image` in its cache
// directory `dir` (one level of <hash>/ folders); empty if none.
std::string cached_ptx(const std::filesystem::path& dir, const void* image, size_t size) {
  std::error_code ec;
  for (const auto& folder : std::filesystem::directory_iterator(dir, ec)) {
    for (const auto& file : std::filesystem::directory_iterator(folder.path(), ec)) {
      if (file.path().extension() != ".cubin" || file.file_size(ec) != size) continue;
      std::ifstream in(file.path(), std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (bytes.size() != size || std::memcmp(bytes.data(), image, size) != 0) continue;
      std::filesystem::path ptx = file.path();
      ptx.replace_extension(".ptx");
      std::ifstream text(ptx);
      return std::string((std::istreambuf_iterator<char>(text)), std::istreambuf_iterator<char>());
    }
  }
  return {};
}

}  // namespace

std::string LaunchValidation::triton_ptx(const void* image, size_t size) {
  const char* dir = std::getenv("TRITON_CACHE_DIR");
  const char* home = std::getenv("HOME");
  std::filesystem::path cache = dir && *dir ? std::filesystem::path(dir)
                                : home ? std::filesystem::path(home) / ".triton" / "cache" : std::filesystem::path();
  return cache.empty() ? std::string() : cached_ptx(cache, image, size);
}

void LaunchValidation::set_active(bool on) {
  active_.store(on, std::memory_order_relaxed);
  if (on) {
    ever_active_.store(true, std::memory_order_relaxed);
    return;
  }
  // No SASS launch is between its patch and its launch now; those that come
  // see validation off (prepare() checks under this lock).
  std::lock_guard<std::mutex> launches(sass_launch_mu_);
  sass_.unpatch_all();
}

void LaunchValidation::cubin_loaded(uint64_t id, uint64_t hash, const void* image, size_t size) {
  if (validators_ == Validators::kSass) return;
  std::string ptx = triton_ptx(image, size);
  if (ptx.empty()) return;
  auto m = std::make_shared<Module>();
  m->hash = hash;
  m->ptx = std::move(ptx);
  PHOS_REAL(cuCtxGetCurrent)(&m->load_ctx);
  std::lock_guard<std::mutex> lock(mu_);
  modules_[id] = m;
  totals_.modules++;
  queue_build_locked(m);
}

void LaunchValidation::module_loaded(uint64_t id, uint64_t hash, const void* image, bool is_ptx) {
  if (validators_ == Validators::kSass) return;
  auto m = std::make_shared<Module>();
  m->hash = hash;
  if (is_ptx) {
    m->ptx = static_cast<const char*>(image);
  } else {
    auto ptx = speculation::module_ptx(image, current_device_arch());
    if (!ptx) return;  // no PTX to twin
    m->ptx = std::move(*ptx);
  }
  PHOS_REAL(cuCtxGetCurrent)(&m->load_ctx);
  std::lock_guard<std::mutex> lock(mu_);
  modules_[id] = m;
  totals_.modules++;
  queue_build_locked(m);
}

void LaunchValidation::set_background_builds(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  background_builds_ = on;
}

void LaunchValidation::queue_build_locked(const std::shared_ptr<Module>& m) {
  if (!background_builds_ || !m->load_ctx) return;  // built at its first launch
  m->build = Build::kQueued;
  queue_job_locked(BuildJob{m, false});
}

namespace {
LaunchValidation* g_builder_owner = nullptr;  // for the atexit handler (one runtime)
}  // namespace

void LaunchValidation::queue_job_locked(BuildJob job) {
  if (builder_stopping_) {  // exiting: a first launch (if any) builds it
    if (job.fill) job.module->fill_pending = false;
    else job.module->build = Build::kNone;
    return;
  }
  build_queue_.push_back(std::move(job));
  if (!builder_started_) {
    builder_started_ = true;
    // Detached: it sleeps on the queue for the process's life (the runtime
    // is never destroyed). At exit, stop_builder() waits for a build in the
    // driver: registered now, after the driver's own exit handlers, it runs
    // before them.
    g_builder_owner = this;
    std::atexit([] { g_builder_owner->stop_builder(); });
    std::thread([this] { builder_loop(); }).detach();
  }
  build_cv_.notify_all();
}

void LaunchValidation::stop_builder() {
  std::unique_lock<std::mutex> lock(mu_);
  builder_stopping_ = true;
  for (BuildJob& job : build_queue_) {
    if (job.fill) job.module->fill_pending = false;
    else if (job.module->build == Build::kQueued) job.module->build = Build::kNone;
  }
  build_queue_.clear();
  build_cv_.wait(lock, [&] { return !job_running_; });
}

void LaunchValidation::builder_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    build_cv_.wait(lock, [&] { return !build_queue_.empty(); });
    BuildJob job = std::move(build_queue_.front());
    build_queue_.pop_front();
    run_job(job, lock);
  }
}

// Called and returning with the lock held; the build itself runs without.
void LaunchValidation::run_job(BuildJob& job, std::unique_lock<std::mutex>& lock) {
  Module& m = *job.module;
  auto wanted = [&] { return !m.unloaded && (job.fill ? m.fill_pending : m.build == Build::kQueued); };
  if (!wanted()) return;  // a first launch built it already, or the module is gone
  std::string ptx = m.ptx;
  // An exit waits from here on (stop_builder): the rewrite uses the
  // process's statics, which exit destroys.
  job_running_ = true;
  auto done = [&] {
    job_running_ = false;
    build_cv_.notify_all();
  };
  lock.unlock();
  // The rewrite is the CPU's: before the gate, so that a checkpoint's
  // quiesce waits for the driver's load only.
  Rewritten rewritten = rewrite(ptx, job.fill);
  lock.lock();
  if (builder_stopping_ || !wanted()) return done();
  lock.unlock();
  // Through the gate before the module counts as being built: a launch
  // that waits for a build must never wait for one held at a closed gate
  // (the gate's quiesce would wait for that launch in turn). Meanwhile it
  // stays queued, and a first launch builds it itself.
  GatePass pass(gate_);
  lock.lock();
  if (builder_stopping_ || !wanted()) return done();
  CUcontext ctx = job.fill ? m.ctx : m.load_ctx;
  if (!job.fill) m.build = Build::kBuilding;
  lock.unlock();
  PHOS_REAL(cuCtxSetCurrent)(ctx);
  if (job.fill) {
    FillTwins f = load_fill_twins(rewritten);
    lock.lock();
    publish_fill_locked(m, std::move(f));
  } else {
    Twins t = load_twins(rewritten);
    lock.lock();
    totals_.background_builds++;
    publish_locked(m, std::move(t));
    schedule_fill_locked(job.module);
  }
  done();
}

void LaunchValidation::before_fork() { mu_.lock(); }

void LaunchValidation::after_fork_in_parent() { mu_.unlock(); }

void LaunchValidation::after_fork_in_child() {
  // Held since before_fork(), by this thread. The condition variable may
  // count the parent's builder as a waiter: a fresh one.
  std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
  build_cv_.~condition_variable();
  new (&build_cv_) std::condition_variable();
  builder_started_ = false;
  job_running_ = false;
  build_queue_.clear();
  for (auto& [id, m] : modules_) {
    if (m->build == Build::kQueued) m->build = Build::kNone;
    if (m->build == Build::kBuilding) {
      m->build = Build::kDone;
      m->unusable = "its twins were being built when the process forked";
    }
    m->fill_pending = false;
  }
}

void LaunchValidation::module_unloaded(const void* handle, uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  sass_.unloaded(handle);
  auto it = modules_.find(id);
  if (!id || it == modules_.end()) return;
  // Its kernels' entries are retired (they keep the module alive, shared_ptr,
  // for their statistics); the twins go with the program's module.
  std::shared_ptr<Module> m = it->second;
  modules_.erase(it);
  m->unloaded = true;  // a build under way drops its twins when it is done
  m->fill_pending = false;
  if (m->twins) PHOS_REAL(cuModuleUnload)(m->twins);
  if (m->fill_twins) PHOS_REAL(cuModuleUnload)(m->fill_twins);
  m->twins = m->fill_twins = nullptr;
}

// The twins of every kernel of the module, loaded as a module of their own
// into the current context. A kernel whose twin is incomplete or names
// module-scope variables is not validated (see the header).
LaunchValidation::Rewritten LaunchValidation::rewrite(const std::string& ptx, bool fill) {
  uint64_t started = monotonic_ns();
  ptx::TwinOptions options;
  if (fill) {
    options.loads = true;
    options.suffix = "__phos_fill";
  }
  Rewritten r{ptx::make_twins(ptx, options), 0};
  r.ns = monotonic_ns() - started;
  return r;
}

LaunchValidation::Twins LaunchValidation::load_twins(const Rewritten& rewritten) {
  Twins t;
  uint64_t started = monotonic_ns();
  const Result<ptx::TwinResult>& made = rewritten.twins;
  if (!made) {
    t.unusable = "no twins: " + made.error().message;
  } else {
    const ptx::TwinResult& twins = *made;
    for (const ptx::TwinKernel& k : twins.kernels) {
      t.kernels[k.name] = k.twin_name;
      if (!k.complete) t.skip[k.name] = "twin incomplete: " + k.reason;
      else if (!k.module_variables.empty()) t.skip[k.name] = "uses module variable " + k.module_variables[0];
    }
    PHOS_REAL(cuCtxGetCurrent)(&t.ctx);
    CUresult r = PHOS_REAL(cuModuleLoadData)(&t.twins, twins.ptx.c_str());
    if (r != CUDA_SUCCESS) {
      const char* what = nullptr;
      PHOS_REAL(cuGetErrorName)(r, &what);
      t.twins = nullptr;
      t.unusable = std::string("the driver refused the twin module: ") + (what ? what : "?");
    }
    t.count = twins.kernels.size();
    for (const ptx::TwinKernel& k : twins.kernels) t.incomplete += !k.complete;
  }
  t.ns = rewritten.ns + (monotonic_ns() - started);
  return t;
}

// The fill twins, from the same PTX, after the twins (schedule_fill_locked):
// the PTX is kept until they are built, so a process checkpointed before
// its builder got to them builds them once restored; until then (and for a
// kernel without one) an on-demand fill makes its launches wait for the
// whole fill.
LaunchValidation::FillTwins LaunchValidation::load_fill_twins(const Rewritten& rewritten) {
  FillTwins f;
  const Result<ptx::TwinResult>& made = rewritten.twins;
  if (!made) return f;
  for (const ptx::TwinKernel& k : made->kernels)
    if (k.complete && k.module_variables.empty()) f.kernels[k.name] = k.twin_name;
  if (PHOS_REAL(cuModuleLoadData)(&f.module, made->ptx.c_str()) != CUDA_SUCCESS) {
    f.module = nullptr;
    f.kernels.clear();
  }
  return f;
}

void LaunchValidation::publish_locked(Module& m, Twins t) {
  m.build = Build::kDone;
  totals_.twins += t.count;
  totals_.incomplete += t.incomplete;
  totals_.twin_build_ns += t.ns;
  totals_.twin_build_max_ns = std::max(totals_.twin_build_max_ns, t.ns);
  if (m.unloaded) {  // the program unloaded the module meanwhile
    if (t.twins) PHOS_REAL(cuModuleUnload)(t.twins);
    m.unusable = "unloaded";
    return;
  }
  m.ctx = t.ctx;
  m.twins = t.twins;
  m.skip = std::move(t.skip);
  m.kernels = std::move(t.kernels);
  m.unusable = std::move(t.unusable);
}

void LaunchValidation::publish_fill_locked(Module& m, FillTwins f) {
  m.fill_pending = false;
  m.ptx.clear();
  m.ptx.shrink_to_fit();
  if (m.unloaded) {
    if (f.module) PHOS_REAL(cuModuleUnload)(f.module);
    return;
  }
  m.fill_twins = f.module;
  m.fill_kernels = std::move(f.kernels);
}

void LaunchValidation::schedule_fill_locked(const std::shared_ptr<Module>& m) {
  if (!fill_twins_ || m->unloaded || !m->twins) {
    publish_fill_locked(*m, {});
    return;
  }
  m->fill_pending = true;
  if (background_builds_) queue_job_locked(BuildJob{m, true});
  else publish_fill_locked(*m, load_fill_twins(rewrite(m->ptx, true)));  // PHOS_TWIN_BUILD=launch: here, as before
}

void LaunchValidation::ensure_built(const std::shared_ptr<Module>& m, std::unique_lock<std::mutex>& lock) {
  if (m->build == Build::kDone) return;
  uint64_t started = monotonic_ns();
  if (m->build == Build::kBuilding) {
    build_cv_.wait(lock, [&] { return m->build == Build::kDone; });
  } else {
    // Not started (or still queued: the builder skips it once it is done).
    publish_locked(*m, load_twins(rewrite(m->ptx, false)));
    schedule_fill_locked(m);
  }
  totals_.first_launch_wait_max_ns = std::max(totals_.first_launch_wait_max_ns, monotonic_ns() - started);
}

LaunchValidation::ValidatedKernel* LaunchValidation::kernel_locked(Kernel& k, std::unique_lock<std::mutex>& lock) {
  if (auto* v = k.state<ValidatedKernel>(KernelFeature::kValidation)) return v;
  auto found = k.module.id ? modules_.find(k.module.id) : modules_.end();
  // Not from a module with PTX: the SASS validator's, if it is attached.
  if (found == modules_.end() && !sass_.attached()) return nullptr;
  std::shared_ptr<Module> m = found != modules_.end() ? found->second : nullptr;
  if (m) {
    ensure_built(m, lock);  // may wait, the lock released
    if (auto* v = k.state<ValidatedKernel>(KernelFeature::kValidation)) return v;  // another launch's meanwhile
  }
  ValidatedKernel& v = k.attach(KernelFeature::kValidation, std::make_unique<ValidatedKernel>());
  v.stats.name = k.name;
  if (m) {
    v.module = m;
    resolve_twin_locked(v, k);
  }
  if (!v.twin && sass_.attached()) try_sass_locked(v, k);
  return &v;
}

void LaunchValidation::resolve_twin_locked(ValidatedKernel& v, const Kernel& k) {
  Module& m = *v.module;
  CUcontext ctx = nullptr;
  PHOS_REAL(cuCtxGetCurrent)(&ctx);
  auto why = m.skip.find(k.name);
  auto twin_name = m.kernels.find(k.name);
  if (!m.unusable.empty()) v.stats.skipped = m.unusable;
  else if (why != m.skip.end()) v.stats.skipped = why->second;
  else if (twin_name == m.kernels.end()) v.stats.skipped = "not a kernel of the module's PTX";
  else if (ctx != m.ctx) v.stats.skipped = "launched in another context than its twins were loaded into";
  else if (PHOS_REAL(cuModuleGetFunction)(&v.twin, m.twins, twin_name->second.c_str()) != CUDA_SUCCESS) {
    v.twin = nullptr;
    v.stats.skipped = "no twin function in the twin module";
  }
  if (k.params) v.params = uint32_t(k.params->size());
  else if (v.twin) v.stats.skipped = "parameter count unknown", v.twin = nullptr;
  if (v.twin) v.stats.validator = "ptx";
  resolve_fill_locked(v, k.name);
}

// Once the module's fill twins are built (or given up), the kernel's is
// looked up, once.
void LaunchValidation::resolve_fill_locked(ValidatedKernel& v, const std::string& name) {
  if (v.fill_resolved || !v.module || v.module->fill_pending) return;
  v.fill_resolved = true;
  const Module& m = *v.module;
  auto fill = m.fill_kernels.find(name);
  if (v.twin && m.fill_twins && fill != m.fill_kernels.end() &&
      PHOS_REAL(cuModuleGetFunction)(&v.fill_twin, m.fill_twins, fill->second.c_str()) != CUDA_SUCCESS)
    v.fill_twin = nullptr;
}

// The kernel's own code, patched; the reason its twin could not be used
// stays in the statistics when this cannot be either. An unload of the
// module or library the driver names for it retires its entry, whether or
// not the module registry knows that module.
void LaunchValidation::try_sass_locked(ValidatedKernel& v, Kernel& k) {
  Result<SassPatcher::Patched> handles = sass_.resolve(function_of(k));
  if (handles) v.sass_handles = *handles;
  Result<void> patched = handles ? sass_.ensure_patched(v.sass_handles) : Result<void>(handles.error());
  if (patched) {
    v.sass = true;
    v.stats.validator = "sass";
    v.stats.skipped.clear();
    kernels_.unloaded_with(k, v.sass_handles.module);
    kernels_.unloaded_with(k, v.sass_handles.library);
  } else {
    v.stats.skipped += (v.stats.skipped.empty() ? "" : "; ") + std::string("sass: ") + patched.error().message;
  }
}

// A range table from the pool, in pinned host memory the device can address.
bool LaunchValidation::table_locked(Table* out) {
  if (free_.empty()) {
    constexpr size_t kBytes = ptx::range_table_bytes(kTableRanges);
    void* block = nullptr;
    if (PHOS_REAL(cuMemHostAlloc)(&block, kBytes * kTablesPerBlock,
                                  CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS)
      return false;
    CUdeviceptr device = 0;
    if (PHOS_REAL(cuMemHostGetDevicePointer)(&device, block, 0) != CUDA_SUCCESS) {
      PHOS_REAL(cuMemFreeHost)(block);
      return false;
    }
    for (size_t i = 0; i < kTablesPerBlock; i++) {
      Table t;
      t.host = reinterpret_cast<uint64_t*>(static_cast<char*>(block) + i * kBytes);
      t.device = device + i * kBytes;
      free_.push_back(t);
    }
  }
  *out = free_.back();
  free_.pop_back();
  if (!out->done && PHOS_REAL(cuEventCreate)(&out->done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    free_.push_back(*out);
    return false;
  }
  return true;
}

bool LaunchValidation::prepare(Kernel& kernel, void** params, void** extra, uint32_t shared_bytes,
                               const WriteRanges& writes, Prepared* out) {
  if (!params || extra || !writes.known) return false;  // the packed form is not validated yet
  std::vector<uint64_t> words;
  ptx::build_range_table(writes.ranges, &words);
  if (words.size() > ptx::range_table_bytes(kTableRanges) / sizeof(uint64_t)) return false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    collect_locked();
    ValidatedKernel* k = kernel_locked(kernel, lock);
    if (!k || (!k->twin && !k->sass)) return false;
    if (!table_locked(&out->table)) return false;
    std::memcpy(out->table.host, words.data(), words.size() * sizeof(uint64_t));
    out->table.kernel = k;
    out->table_address = out->table.device;
    if (k->sass) {
      out->sass = true;
      out->launch = function_of(kernel);
      out->launch_params = params;
      out->sass_handles = k->sass_handles;
    } else {
      out->launch = k->twin;
      out->params.assign(params, params + k->params);
      out->params.push_back(&out->table_address);
      out->launch_params = out->params.data();
      if (shared_bytes > 48 * 1024 && shared_bytes > k->shared_opt_in) {
        // Never more than the original was allowed: the original's launch
        // with this size succeeds only if the program opted in as far.
        if (PHOS_REAL(cuFuncSetAttribute)(k->twin, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          int(shared_bytes)) == CUDA_SUCCESS)
          k->shared_opt_in = shared_bytes;
      }
      return true;
    }
  }
  // Held until finish(): the table is set per function, for the launches
  // that follow. Taken before mu_, never after it.
  sass_launch_mu_.lock();
  std::string why;
  // Validation may have gone off since seen(); the module is patched again
  // here if it went off and on.
  const SassPatcher::Patched& handles = out->sass_handles;
  if (active()) {
    Result<void> patched = sass_.ensure_patched(handles);
    if (patched && sass_.set_table(handles.function, out->table.device)) return true;
    if (!patched) why = patched.error().message;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!why.empty()) {
    auto* k = static_cast<ValidatedKernel*>(out->table.kernel);
    k->sass = false;
    k->stats.skipped = "sass: " + why;
  }
  free_.push_back(out->table);
  sass_launch_mu_.unlock();
  return false;
}

bool LaunchValidation::prepare_fill(Kernel& kernel, void** params, void** extra, uint32_t shared_bytes,
                                    const std::vector<std::pair<uint64_t, uint64_t>>& allowed, Prepared* out) {
  if (!params || extra) return false;
  std::vector<uint64_t> words;
  ptx::build_range_table(allowed, &words);
  if (words.size() > ptx::range_table_bytes(kTableRanges) / sizeof(uint64_t)) return false;
  std::unique_lock<std::mutex> lock(mu_);
  collect_locked();
  ValidatedKernel* k = kernel_locked(kernel, lock);
  if (k) resolve_fill_locked(*k, k->stats.name);
  if (!k || !k->fill_twin) return false;
  if (!table_locked(&out->table)) return false;
  std::memcpy(out->table.host, words.data(), words.size() * sizeof(uint64_t));
  out->table.kernel = k;
  out->table_address = out->table.device;
  out->launch = k->fill_twin;
  out->params.assign(params, params + k->params);
  out->params.push_back(&out->table_address);
  out->launch_params = out->params.data();
  if (shared_bytes > 48 * 1024)
    PHOS_REAL(cuFuncSetAttribute)(k->fill_twin, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared_bytes));
  return true;
}

Result<ptx::Violations> LaunchValidation::finish_fill(Prepared& p, CUresult launched, CUstream stream) {
  auto give_back = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(p.table);
  };
  if (launched != CUDA_SUCCESS) {
    give_back();
    return make_error("the fill twin's launch failed (CUresult " + std::to_string(int(launched)) + ")", EIO);
  }
  // Waited for here, before the program can see what the kernel computed.
  CUresult r = PHOS_REAL(cuEventRecord)(p.table.done, stream);
  if (r == CUDA_SUCCESS) r = PHOS_REAL(cuEventSynchronize)(p.table.done);
  if (r != CUDA_SUCCESS) {
    give_back();
    return make_error("wait for the fill twin (CUresult " + std::to_string(int(r)) + ")", EIO);
  }
  ptx::Violations v = ptx::read_violations(std::span<const uint64_t>(p.table.host, ptx::kTableHeaderWords));
  give_back();
  return v;
}

std::string LaunchValidation::kernel_name(const Prepared& p) {
  std::lock_guard<std::mutex> lock(mu_);
  return p.table.kernel ? static_cast<ValidatedKernel*>(p.table.kernel)->stats.name : std::string("?");
}

std::unique_lock<std::mutex> LaunchValidation::hold_unvalidated(const Kernel* k) {
  if (!k) return {};
  {
    std::lock_guard<std::mutex> lock(mu_);
    const ValidatedKernel* v = k->state<ValidatedKernel>(KernelFeature::kValidation);
    if (!v || !v->sass) return {};
  }
  return std::unique_lock<std::mutex>(sass_launch_mu_);
}

bool LaunchValidation::finish(Prepared& p, CUresult launched, CUstream stream) {
  if (p.sass) {
    // Later launches of the function that are not validated pass no table;
    // a table that could not be taken back is never handed out again.
    p.table.keep_out = !sass_.set_table(p.sass_handles.function, 0);
    sass_launch_mu_.unlock();
  }
  std::lock_guard<std::mutex> lock(mu_);
  ValidatedKernel& k = *static_cast<ValidatedKernel*>(p.table.kernel);
  if (launched != CUDA_SUCCESS) {
    if (!p.table.keep_out) free_.push_back(p.table);
    if (p.sass) return true;  // the program's own launch: its result stands
    const char* what = nullptr;
    PHOS_REAL(cuGetErrorName)(launched, &what);
    k.twin = nullptr;
    k.stats.skipped = std::string("the twin's launch failed: ") + (what ? what : "?");
    return false;
  }
  if (PHOS_REAL(cuEventRecord)(p.table.done, stream) != CUDA_SUCCESS) {
    // The launch ran, but when it is done cannot be known: its count is lost.
    free_.push_back(p.table);
    return true;
  }
  k.stats.validated++;
  totals_.validated++;
  in_flight_.push_back(p.table);
  return true;
}

// The tables of launches that have completed: their violations counted,
// the tables back in the pool.
void LaunchValidation::collect_locked() {
  while (!in_flight_.empty()) {
    Table& t = in_flight_.front();
    if (PHOS_REAL(cuEventQuery)(t.done) == CUDA_ERROR_NOT_READY) break;
    ptx::Violations v = ptx::read_violations(std::span<const uint64_t>(t.host, ptx::kTableHeaderWords));
    ValidatedKernel& k = *static_cast<ValidatedKernel*>(t.kernel);
    if (v.count) {
      if (!k.stats.violations) {
        k.stats.first_address = v.first_address;
        k.stats.first_site = v.first_instruction;
      }
      k.stats.violations += v.count;
      k.stats.launches_with_violations++;
      totals_.violations += v.count;
    }
    if (!t.keep_out) free_.push_back(t);
    in_flight_.pop_front();
  }
}

LaunchValidation::Totals LaunchValidation::totals() {
  std::lock_guard<std::mutex> lock(mu_);
  collect_locked();
  Totals t = totals_;
  t.pending = in_flight_.size();
  t.sass_attached = sass_attached();
  t.sass = sass_.totals();
  return t;
}

std::vector<LaunchValidation::KernelStats> LaunchValidation::kernels() {
  KernelRegistry::Entries entries = kernels_.entries();
  std::lock_guard<std::mutex> lock(mu_);
  collect_locked();
  std::vector<KernelStats> out;
  for (const auto* list : {&entries.live, &entries.retired})
    for (const Kernel* k : *list)
      if (const ValidatedKernel* v = k->state<ValidatedKernel>(KernelFeature::kValidation)) out.push_back(v->stats);
  return out;
}

}  // namespace phos::hooks
