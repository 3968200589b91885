#include "restore/restore.h"

#include "phos/plugin/job_env.h"
#include "phos/plugin/job_record.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>

#include "driver/driver_checkpoint.h"
#include "common/fault.h"
#include "common/traced_kill.h"
#include "phos/plugin/log.h"
#include "phos/plugin/agent_client.h"
#include "phos/plugin/proc.h"
#include "phos/support/clock.h"

namespace phos::plugin {

namespace {

double ms(uint64_t ns) { return double(ns) / 1e6; }

// The process had GPU state: memory of its own (its devices), or only
// other processes' memory mapped through CUDA IPC.
bool on_gpu(const image::Manifest& m) { return !m.devices.empty() || !m.ipc_mappings.empty(); }

}  // namespace

// The image directory's fd is our own: criu closes its own before an
// on-demand fill, which outlives the restore, has read every data file.
Restorer::Restorer(int image_dirfd, PluginOptions options)
    : own_dir_(::fcntl(image_dirfd, F_DUPFD_CLOEXEC, 0)),
      dirfd_(own_dir_.valid() ? own_dir_.get() : image_dirfd),
      options_(options),
      init_ns_(monotonic_ns()) {
  using Lazy = PluginOptions::LazyRestore;
  lazy_ = options_.lazy_restore == Lazy::kOn || (options_.lazy_restore == Lazy::kAuto && criu_restores_lazily());
  if (lazy_ && !own_dir_.valid()) {
    PHOS_WARN("cannot duplicate the image directory's fd (%s): the memory is restored before the process runs",
              std::strerror(errno));
    lazy_ = false;
  }
}

uint64_t Restorer::since_init_ns() const { return monotonic_ns() - init_ns_; }

Result<void> Restorer::load() {
  // A host's part of a job across hosts goes back only with the others.
  const auto& job = job_run_of_process();
  if (!job) return job.error();
  PHOS_TRY(check_restore_of_job(dirfd_, *job));
  auto pids = image::list_process_images(dirfd_);
  if (!pids) return pids.error();
  const auto kernel_gpus = kernel_driver_gpus();
  const bool criu_sees_all = !std::getenv("CUDA_VISIBLE_DEVICES");
  for (pid_t vpid : *pids) {
    auto img = image::open_process_image(dirfd_, vpid, /*require_complete=*/true);
    if (!img) return img.error();
    // In place first: the load job keeps a pointer to the manifest.
    Loaded& l = images_[vpid];
    l.image = std::move(*img);
    const image::Manifest& m = l.image.manifest;
    if (m.kept) {
      PHOS_TRY(take_kept(vpid, l));
    } else if (!m.devices.empty() || !m.allocations.empty()) {
      l.needs_memory = true;
      l.stage = Stage::kLoaded;
      l.stays_on_its_gpus = image_stays_on_its_gpus(m.devices, kernel_gpus, !options_.gpu_map.empty(), criu_sees_all);
    }
    PHOS_INFO("%s: %zu devices, %zu allocations, written by phos %s", l.image.manifest_name.c_str(),
              m.devices.size(), m.allocations.size(), m.writer_version.c_str());
  }
  const bool any_memory = std::any_of(images_.begin(), images_.end(), [](const auto& e) { return e.second.needs_memory; });
  if (!options_.restore_overlap) {
    // The order before: criu waits for the memory; a failure stops the
    // restore before a process exists.
    prepare_all();
    for (auto& [vpid, l] : images_)
      if (!l.prepared) return l.prepared.error();
  }
  // Every phos process needs its driver restore at RESUME_DEVICES_LATE,
  // GPU memory or not: the keeper watches from here on.
  if (!images_.empty()) {
    auto k = KeeperLink::start(dirfd_, options_.agent_timeout_ms);
    if (k) {
      keeper_.emplace(std::move(*k));
      if (auto told = keeper_->restore_started(); !told)
        PHOS_WARN("phos-keeper: %s; if criu dies before RESUME_DEVICES_LATE, the processes it forked stay",
                  told.error().message.c_str());
    } else
      PHOS_WARN("%s: if criu dies during this restore, a process it leaves half-restored stays", k.error().message.c_str());
  }
  // The GPUs placed, the memory created and filled while criu restores the
  // CPU side (with restore_overlap): a failure here fails the process's
  // RESUME_DEVICES_LATE, which kills it before it runs.
  if (any_memory)
    filler_ = std::thread([this] {
      if (options_.restore_overlap) prepare_all();
      fill_all();
    });
  for (auto& [vpid, l] : images_)
    if (l.kept && !l.image.manifest.devices.empty()) {
      kept_placer_ = std::thread([this] { place_kept(); });
      break;
    }
  init_done_ns_ = since_init_ns();
  return {};
}

Result<void> Restorer::start_engine() {
  if (engine_) return {};
  auto engine = Engine::start(EngineSettings::from(options_));
  if (!engine) return engine.error();
  engine_ = std::move(*engine);
  return {};
}

Result<void> Restorer::place(Loaded& l) {
  const image::Manifest& m = l.image.manifest;
  if (auto started = start_engine(); !started)
    return make_error(l.image.manifest_name + ": " + started.error().message, started.error().code);
  const uint64_t started_ns = since_init_ns();
  auto placement = engine_->place_devices(m, l.image.manifest_name, options_.gpu_map, l.host);
  if (!placement) return placement.error();
  l.placement = std::move(*placement);
  for (const auto& p : l.placement)
    if (p.moved())
      PHOS_INFO("%s: device %u (%s) restored onto GPU %d (%s)", l.image.manifest_name.c_str(), p.image_ordinal,
                format_gpu_uuid(p.image_uuid).c_str(), p.host_ordinal, format_gpu_uuid(p.host_uuid).c_str());
  l.placed_ns = since_init_ns();
  PHOS_INFO("%s: GPUs placed at %.1f ms after the plugin's init (criu's CUDA up at %.1f)", l.image.manifest_name.c_str(),
            ms(l.placed_ns), ms(started_ns));
  return {};
}

Result<void> Restorer::create(Loaded& l) {
  const image::Manifest& m = l.image.manifest;
  if (fault("slow-memory-create")) {
    PHOS_WARN("fault injection (PHOS_FAULT): the creation of %s's device memory holds for 1.5 s",
              l.image.manifest_name.c_str());
    ::usleep(1'500'000);
  }
  auto job = engine_->prepare_load(m, l.placement);
  if (!job) return make_error(l.image.manifest_name + ": " + job.error().message, job.error().code);
  l.job = std::move(*job);
  if (lazy_) {
    // The allocations the recorded launches touched first (the dump's
    // quiesce reply); empty where nothing was recorded.
    const std::vector<uint64_t>& first = m.fill_order;
    if (auto opened = engine_->open_fill(*l.job, first); !opened)
      return make_error(l.image.manifest_name + ": " + opened.error().message, opened.error().code);
    PHOS_INFO("%s: on-demand restore: %zu allocations in the recorded order first, then the rest",
              l.image.manifest_name.c_str(), first.size());
  }
  l.created_ns = since_init_ns();
  PHOS_INFO("%s: GPU memory created at %.1f ms after the plugin's init (%zu allocations)", l.image.manifest_name.c_str(),
            ms(l.created_ns), m.allocations.size());
  return {};
}

// All placements first: a process's driver restore waits only for its
// GPUs' placement, not for other images' memory.
void Restorer::prepare_all() {
  for (auto& [vpid, l] : images_) {
    if (!l.needs_memory) continue;
    if (auto placed = place(l); !placed) {
      // Without overlap the init reports it, now; with it, the process's
      // resume fails on it later.
      if (options_.restore_overlap) PHOS_ERR("cannot restore: %s", placed.error().message.c_str());
      advance(l, Stage::kDone, placed);
    } else {
      advance(l, Stage::kPlaced);
    }
  }
  for (auto& [vpid, l] : images_) {
    {
      std::lock_guard<std::mutex> lock(stage_mu_);
      if (l.stage != Stage::kPlaced) continue;
    }
    if (auto created = create(l); !created) {
      if (options_.restore_overlap) PHOS_ERR("cannot restore: %s", created.error().message.c_str());
      l.job.reset();  // by the thread that made it
      advance(l, Stage::kDone, created);
    } else {
      advance(l, Stage::kCreated);
    }
  }
}

void Restorer::advance(Loaded& l, Stage stage, Result<void> failed) {
  {
    std::lock_guard<std::mutex> lock(stage_mu_);
    l.stage = stage;
    if (!failed) l.prepared = std::move(failed);
  }
  stage_cv_.notify_all();
}

Result<void> Restorer::wait_for(Loaded& l, Stage stage) {
  std::unique_lock<std::mutex> lock(stage_mu_);
  stage_cv_.wait(lock, [&] { return l.stage >= stage; });
  return l.prepared;
}

void Restorer::place_kept() {
  Result<void> started;
  if (auto engine = Engine::start(EngineSettings::from(options_)); engine)
    kept_engine_ = std::move(*engine);
  else
    started = engine.error();
  for (auto& [vpid, l] : images_) {
    const image::Manifest& m = l.image.manifest;
    if (!l.kept || m.devices.empty()) continue;
    if (!started) {
      l.filled = make_error(l.image.manifest_name + ": " + started.error().message, started.error().code);
      continue;
    }
    GpuMapSpec spec;
    for (const auto& d : m.devices)
      spec.push_back({std::to_string(d.ordinal), format_gpu_uuid(m.kept->target_of(d.ordinal).uuid)});
    auto placement = kept_engine_->place_devices(m, l.image.manifest_name, spec, l.host);
    if (!placement) {
      l.filled = placement.error();
      continue;
    }
    l.placement = std::move(*placement);
  }
}

Result<void> Restorer::take_kept(pid_t vpid, Loaded& l) {
  const image::Manifest& m = l.image.manifest;
  const std::string& name = l.image.manifest_name;
  const image::KeptMemory& kept = *m.kept;
  auto link = KeptMemoryLink::take(kept.migration, vpid, options_.agent_timeout_ms);
  if (!link) return make_error(name + ": " + link.error().message, link.error().code);
  // What the keeper holds must be what the image lists (the keeper is
  // another process: its word is checked).
  const auto& got = link->allocations;
  if (got != std::vector<agent::Allocation>(m.allocations.begin(), m.allocations.end())) {  // without their chunks
    (void)link->taken(false);
    return make_error(name + ": phos-keeper's kept memory (" + std::to_string(got.size()) +
                          " allocations) is not what the image lists (" + std::to_string(m.allocations.size()) + ")",
                      EPROTO);
  }
  l.fds = std::move(link->fds);
  l.kept.emplace(std::move(*link));
  // The memory is on the GPU the dump moved it to: the image's device goes
  // there, whatever gpu_map says (place_kept, in the background); each
  // device to its own for a process on several GPUs.
  if (!m.devices.empty() && !options_.gpu_map.empty())
    PHOS_WARN("%s: gpu_map=%s ignored: a migration's memory is on GPU %s", name.c_str(),
              describe_gpu_map(options_.gpu_map).c_str(), format_gpu_uuid(kept.device.uuid).c_str());
  uint64_t bytes = 0;
  for (const auto& a : m.allocations) bytes += a.size;
  std::string where = "GPU " + format_gpu_uuid(kept.device.uuid) + " (" + kept.device.name + ")";
  if (!kept.targets.empty()) {
    where = "GPUs";
    for (const auto& [ordinal, d] : kept.targets)
      where += (ordinal == kept.targets.begin()->first ? " " : ", ") + std::string("device ") + std::to_string(ordinal) +
               "'s on " + format_gpu_uuid(d.uuid);
  }
  PHOS_INFO("%s: migration %s: %zu allocations (%.1f MiB) taken from phos-keeper, on %s%s", name.c_str(),
            kept.migration.c_str(), m.allocations.size(), double(bytes) / (1 << 20), where.c_str(),
            kept.in_place ? ", where the process left it" : "");
  l.created_ns = l.filled_ns = since_init_ns();
  return {};
}

Restorer::~Restorer() {
  if (filler_.joinable()) filler_.join();
  if (kept_placer_.joinable()) kept_placer_.join();
  if (keeper_) (void)keeper_->done();
}

// The jobs are released by the thread that made them (resume), not here:
// criu clones restored tasks while this runs, and a free into the main
// thread's malloc arena could hold its lock at that moment.
void Restorer::fill_all() {
  if (fault("stall-in-fill")) {
    PHOS_WARN("fault injection (PHOS_FAULT): the fill of device memory holds for 60 s");
    ::sleep(60);
  }
  for (auto& [vpid, l] : images_) {
    if (!l.job) continue;  // none, or its creation failed
    l.fill_from_ns = since_init_ns();
    auto fds = engine_->run_load(dirfd_, *l.job);
    l.filled_ns = since_init_ns();
    if (!fds) l.filled = make_error(l.image.manifest_name + ": " + fds.error().message, fds.error().code);
    if (!l.job->fill) {
      if (fds) l.fds = std::move(*fds);
      advance(l, Stage::kDone);
      continue;
    }
    advance(l, Stage::kDone);
    // On-demand: the table says how it ended (an aborted one lets no call
    // go on), then the process's window.
    l.job->fill->close(fds ? copystate::Window::kClosed : copystate::Window::kAborted);
    if (fds) PHOS_INFO("%s: all GPU data in at %.1f ms after the plugin's init", l.image.manifest_name.c_str(), ms(l.filled_ns));
    std::lock_guard<std::mutex> lock(window_mu_);
    l.fill_ended = true;
    if (l.window_pid) end_fill_window(l);
  }
}

std::vector<CUcheckpointGpuPair> Restorer::driver_pairs(const Loaded& l, std::string* said) const {
  // UUID pairs only when a GPU moves; then for every GPU (gpu_map.h), the
  // ones CUDA_VISIBLE_DEVICES hides from criu included.
  std::vector<CUcheckpointGpuPair> pairs;
  if (l.stays_on_its_gpus) return pairs;  // known without the placement, which may not be made yet
  for (const auto& [from, to] : driver_gpu_pairs(l.placement, l.host, kernel_driver_gpus())) {
    CUcheckpointGpuPair pair{};
    std::memcpy(pair.oldUuid.bytes, from.data(), 16);
    std::memcpy(pair.newUuid.bytes, to.data(), 16);
    pairs.push_back(pair);
    // Each pair, since the driver's refusal of a set names none of them.
    if (said) *said += (said->empty() ? " onto the mapped GPUs: " : ", ") + format_gpu_uuid(from) + " -> " + format_gpu_uuid(to);
  }
  return pairs;
}

// The restored processes are criu's descendants that criu traces (stopped
// at their last system call); criu's own helpers are not traced.
void Restorer::driver_restores() {
  driver_restores_made_ = true;
  std::vector<pid_t> tree{::getpid()};
  for (size_t i = 0; i < tree.size(); i++)
    for (pid_t c : children_of(tree[i])) tree.push_back(c);
  std::vector<DriverRestore> restores;
  std::vector<Loaded*> loaded;
  for (size_t i = 1; i < tree.size(); i++) {
    const pid_t pid = tree[i];
    auto tracer = tracer_of(pid, pid);
    auto vpid = ns_pid(pid);
    if (!tracer || *tracer != ::getpid() || !vpid) continue;
    auto it = images_.find(*vpid);
    if (it == images_.end() || !on_gpu(it->second.image.manifest) || !has_driver_state(pid)) continue;
    Loaded& l = it->second;
    if (l.kept) {
      if (kept_placer_.joinable()) kept_placer_.join();  // where its GPUs went
      if (!l.filled) continue;  // its resume fails, saying why
    }
    if (!wait_for(l, Stage::kPlaced)) continue;  // likewise
    restores.push_back({pid, driver_pairs(l)});
    loaded.push_back(&l);
  }
  if (restores.size() < 2) return;  // resume() makes it, as for one process
  if (keeper_) {
    // Each process may run from now on: phos-keeper ends it should criu die.
    std::lock_guard<std::mutex> lock(window_mu_);
    for (const auto& r : restores) (void)keeper_->restoring(r.pid, false);
  }
  const uint64_t t0 = monotonic_ns(), from = since_init_ns();
  auto results = driver_restore_and_unlock_all(restores, options_.driver_parallel);
  const uint64_t took = monotonic_ns() - t0;
  for (size_t i = 0; i < restores.size(); i++) {
    loaded[i]->driver_restored = results[i];
    loaded[i]->driver_ns = took;
    loaded[i]->driver_from_ns = from;
    loaded[i]->driver_to_ns = from + took;
  }
  PHOS_INFO("driver restore of %zu processes %s: %.1f ms", restores.size(),
            options_.driver_parallel ? "at once" : "one after another", double(took) / 1e6);
}

Result<void> Restorer::driver_restore(pid_t pid, Loaded& l) {
  if (l.driver_restored) return *l.driver_restored;  // made with the other processes'
  if (!on_gpu(l.image.manifest) || !has_driver_state(pid)) return {};
  // (Not cuCheckpointProcessGetState: it hangs on a process criu holds stopped.)
  std::string said;
  auto pairs = driver_pairs(l, &said);
  PHOS_INFO("process %d: driver restore%s", pid, said.c_str());
  const uint64_t t = monotonic_ns();
  l.driver_from_ns = since_init_ns();
  PHOS_TRY(driver_restore_and_unlock(pid, pairs));
  l.driver_ns = monotonic_ns() - t;
  l.driver_to_ns = since_init_ns();
  PHOS_INFO("process %d: driver restored and unlocked", pid);
  return {};
}

Result<void> Restorer::resume(pid_t pid, pid_t vpid, Loaded& l) {
  const uint64_t hook_ns = since_init_ns();
  const bool lazy = lazy_ && l.needs_memory;
  if (l.kept && kept_placer_.joinable()) kept_placer_.join();  // its placement (l.filled says if it failed)
  auto failed = [](const Error& e) {
    PHOS_ERR("cannot restore: %s", e.message.c_str());
    return e;
  };
  // The driver's restore needs only where the GPUs went: with
  // restore_overlap it runs while the memory is still being created and
  // filled. (A placement or creation that failed was logged by the thread.)
  if (l.needs_memory && !l.stays_on_its_gpus) PHOS_TRY(wait_for(l, Stage::kPlaced));
  if (l.kept && !l.filled) return failed(l.filled.error());
  if (options_.restore_overlap) PHOS_TRY(driver_restore(pid, l));
  if (lazy) {
    PHOS_TRY(wait_for(l, Stage::kCreated));
  } else if (l.needs_memory || !l.image.manifest.ipc_mappings.empty()) {
    // All images filled (criu calls this hook one process at a time): the
    // owners of its CUDA IPC mappings too.
    if (filler_.joinable()) filler_.join();
    l.job.reset();
    PHOS_TRY(l.prepared);
    if (!l.filled) return failed(l.filled.error());
  }
  // On-demand: the fill's end is checked under window_mu_ before the gate
  // opens (the filling thread writes l.filled).
  const uint64_t waited_ns = since_init_ns();
  if (!options_.restore_overlap) PHOS_TRY(driver_restore(pid, l));
  const auto& recorded = l.image.manifest.allocations;
  std::vector<agent::Allocation> allocs(recorded.begin(), recorded.end());  // without their chunks
  const auto& shared = l.image.manifest.ipc_mappings;
  allocs.insert(allocs.end(), shared.begin(), shared.end());
  auto fds = mapping_fds(l, lazy);
  if (!fds) return fds.error();
  uint64_t remap_ns = 0;
  PHOS_TRY(with_agent(pid, options_.agent_timeout_ms, [&](AgentClient& c) -> Result<void> {
    if (c.hello().pid != vpid)
      return make_error("agent reports pid " + std::to_string(c.hello().pid) + ", the image is for " +
                        std::to_string(vpid));
    const uint64_t t = monotonic_ns();
    auto mapped = c.remap_all(allocs, *fds);
    if (!mapped) return mapped.error();
    remap_ns = monotonic_ns() - t;
    PHOS_INFO("process %d: %.1f MiB mapped at the original addresses", pid, double(*mapped) / (1 << 20));
    for (const auto& a : shared)
      PHOS_INFO("process %d: allocation #%llu of process %d (pid in its namespace) mapped again at 0x%llx through "
                "CUDA IPC (the same memory as its owner's)",
                pid, (unsigned long long)a.ipc->owner_allocation, a.ipc->owner_pid, (unsigned long long)a.address);
    if (lazy) {
      std::lock_guard<std::mutex> lock(window_mu_);
      // A fill that failed meanwhile: the process must not run at all.
      if (l.fill_ended && !l.filled) return l.filled.error();
      if (!l.fill_ended) PHOS_TRY(open_fill_window(pid, l, c));
    }
    l.gate_asked_open = true;
    return c.resume();
  }));
  log_breakdown(pid, l, lazy, hook_ns, waited_ns, l.driver_ns, remap_ns);
  return {};
}

// criu's log stamps each line with the time since criu started; these are
// since the plugin's init. The first part keeps its old form (scripts read
// it: bench_coldstart.sh, job_breakdown.py); the second says what ran
// beside what, and what the gate waited for last.
void Restorer::log_breakdown(pid_t pid, const Loaded& l, bool lazy, uint64_t hook_ns, uint64_t waited_ns,
                             uint64_t driver_ns, uint64_t remap_ns) const {
  uint64_t bytes = 0;
  for (const auto& a : l.image.manifest.allocations) bytes += a.size;
  std::string rate;
  if (!lazy && l.filled_ns && bytes && l.filled_ns > l.fill_from_ns)
    rate = " at " + std::to_string(double(bytes) / double(l.filled_ns - l.fill_from_ns)) + " GB/s";
  const std::string filled = lazy ? "behind the running process" : std::to_string(ms(l.filled_ns));
  // What the gate's opening waited for last: criu's CPU restore (its hook),
  // the driver's restore, or the memory (created, then filled).
  const uint64_t driver_end = l.driver_to_ns;  // 0: none made
  const uint64_t memory_end = lazy ? l.created_ns : l.filled_ns;
  const char* bound = !l.needs_memory ? "criu's CPU restore"
                      : memory_end > std::max(hook_ns, driver_end)
                          ? (lazy ? "the GPU memory's creation" : "the GPU data fill")
                      : driver_end > hook_ns ? "the driver restore"
                                             : "criu's CPU restore";
  char driver[96] = "none";
  if (driver_end) std::snprintf(driver, sizeof(driver), "%.1f-%.1f", ms(l.driver_from_ns), ms(driver_end));
  PHOS_INFO("process %d: restore breakdown (ms after the plugin's init): GPU memory created %.1f, filled %s "
            "(%.1f MiB%s), resume hook %.1f, waited for the fill until %.1f, driver restore %.1f ms, remap %.1f ms, "
            "gate open %.1f; overlap=%s: init returned %.1f, GPUs placed %.1f, fill %.1f-%.1f, criu's CPU restore "
            "done %.1f, driver restore %s; the gate waited last for %s",
            pid, ms(l.created_ns), filled.c_str(), double(bytes) / (1 << 20), rate.c_str(), ms(hook_ns), ms(waited_ns),
            ms(driver_ns), ms(remap_ns), ms(since_init_ns()), options_.restore_overlap ? "on" : "off",
            ms(init_done_ns_), ms(l.placed_ns), ms(l.fill_from_ns), ms(l.filled_ns), ms(hook_ns), driver, bound);
}

Result<void> Restorer::open_fill_window(pid_t pid, Loaded& l, AgentClient& c) {
  // Exact sets only: without read validation a speculated set does not say
  // everything a kernel may read (such a launch waits for the whole fill).
  agent::OpenCopyWindowRequest q{
      .trust = agent::CopyTrust::kExact, .timeout_ms = options_.lazy_timeout_ms, .pools = {}};
  const int fd = l.job->fill->fd();
  auto opened = c.open_copy_window(q, std::vector<int>{fd});
  if (!opened) return make_error("open the on-demand fill window: " + opened.error().message, opened.error().code);
  l.window_pid = pid;
  PHOS_INFO("process %d: on-demand restore: the process runs while its memory is filled", pid);
  return {};
}

void Restorer::end_fill_window(Loaded& l) {
  const pid_t pid = l.window_pid;
  if (!l.filled) {
    // The window is aborted: the process ends at its next call that needs
    // memory; it must not run on at all.
    PHOS_ERR("process %d: on-demand restore failed: %s; killing it", pid, l.filled.error().message.c_str());
    ::kill(pid, SIGKILL);
    failed_ = true;
    return;
  }
  agent::CloseCopyWindowReply account;
  auto closed = with_agent(pid, options_.agent_timeout_ms, [&](AgentClient& c) -> Result<void> {
    auto r = c.close_copy_window();
    if (!r) return r.error();
    account = *r;
    return {};
  });
  if (!closed && !process_alive(pid)) {
    // It ended itself: a kernel touched memory not yet in (its own message
    // says which), or it exited; either way the restore did not give a
    // running process.
    PHOS_ERR("process %d ended while its memory was filled on demand (its output says why)", pid);
    failed_ = true;
    return;
  }
  if (!closed) {
    PHOS_WARN("process %d: close the on-demand fill window: %s", pid, closed.error().message.c_str());
  } else {
    PHOS_INFO("process %d: on-demand restore: %llu calls checked, %llu waited (%llu for the whole fill), %.1f ms "
              "waited in all",
              pid, (unsigned long long)account.counters.calls_checked,
              (unsigned long long)account.counters.calls_waited, (unsigned long long)account.counters.unknown_waits,
              double(account.counters.wait_ns) / 1e6);
  }
  if (keeper_) (void)keeper_->restoring(pid, true);
}

void Restorer::finish() {
  if (filler_.joinable()) filler_.join();  // it closed every fill window
  for (auto& [vpid, l] : images_) {
    l.job.reset();
    l.fds.clear();
  }
}

bool Restorer::ipc_owner(pid_t vpid) const {
  for (const auto& [v, l] : images_)
    for (const auto& a : l.image.manifest.ipc_mappings)
      if (a.ipc && a.ipc->owner_pid == vpid) return true;
  return false;
}

namespace {

Result<UniqueFd> dup_fd(const UniqueFd& fd, const std::string& what) {
  UniqueFd dup(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!dup.valid()) return errno_error("duplicate the fd of " + what);
  return dup;
}

}  // namespace

Result<std::vector<UniqueFd>> Restorer::mapping_fds(const Loaded& l, bool lazy) const {
  auto fds_of = [lazy](const Loaded& x) -> const std::vector<UniqueFd>& { return lazy && x.job ? x.job->fds : x.fds; };
  std::vector<UniqueFd> out;
  for (const auto& fd : fds_of(l)) {
    auto dup = dup_fd(fd, l.image.manifest_name);
    if (!dup) return dup.error();
    out.push_back(std::move(*dup));
  }
  for (const auto& a : l.image.manifest.ipc_mappings) {
    const std::string what = "allocation #" + std::to_string(a.ipc->owner_allocation) + " of process " +
                             std::to_string(a.ipc->owner_pid) + " (CUDA IPC)";
    auto owner = images_.find(a.ipc->owner_pid);
    if (owner == images_.end())
      return make_error(l.image.manifest_name + ": maps " + what + ", whose image is not in this directory", ENOENT);
    if (owner->second.kept || (lazy && !owner->second.job))
      return make_error(l.image.manifest_name + ": maps " + what + ": not restored through a migration or "
                        "on demand yet", ENOTSUP);
    const auto& owned = owner->second.image.manifest.allocations;
    const auto& owner_fds = fds_of(owner->second);
    size_t i = 0;
    while (i < owned.size() && owned[i].id != a.ipc->owner_allocation) i++;
    if (i == owned.size() || i >= owner_fds.size() || owned[i].size != a.size)
      return make_error(l.image.manifest_name + ": maps " + what + ", which " + owner->second.image.manifest_name +
                        " does not hold with that size", ENOENT);
    auto dup = dup_fd(owner_fds[i], what);
    if (!dup) return dup.error();
    out.push_back(std::move(*dup));
  }
  return out;
}

Result<bool> Restorer::resume_late(pid_t pid) {
  auto vpid = ns_pid(pid);
  if (!vpid) return vpid.error();
  auto it = images_.find(*vpid);
  if (it == images_.end()) {
    // No GPU state to give: whole once criu is done with it (the keeper
    // leaves it be should criu die now).
    std::lock_guard<std::mutex> lock(window_mu_);
    if (keeper_) (void)keeper_->restoring(pid, true);
    return false;
  }
  if (fault("stall-before-resume")) {
    // Where criu is while it restores the process's CPU side: the keeper
    // does not know the pid yet.
    PHOS_WARN("fault injection (PHOS_FAULT): RESUME_DEVICES_LATE holds for 60 s before phos-keeper hears of process %d",
              pid);
    ::sleep(60);
  }
  if (keeper_) {
    std::lock_guard<std::mutex> lock(window_mu_);
    (void)keeper_->restoring(pid, false);
  }
  if (!driver_restores_made_) driver_restores();
  if (auto r = resume(pid, *vpid, it->second); !r) {
    // CRIU only logs a failing RESUME_DEVICES_LATE and would let the process
    // run on without its GPU state: it must not run at all.
    PHOS_ERR("process %d: restore of GPU state failed: %s; killing it", pid, r.error().message.c_str());
    kill_traced(pid);  // criu then fails the restore, and must not hang in it
    failed_ = true;
    // Kept for another restore, unless the process may have run on it.
    if (it->second.kept) (void)it->second.kept->taken(false, it->second.gate_asked_open);
    return r.error();
  }
  if (!ipc_owner(*vpid)) it->second.fds.clear();  // else at finish(): an importer may come later
  if (it->second.kept) {
    if (auto told = it->second.kept->taken(true); !told)
      PHOS_WARN("process %d: could not tell phos-keeper that it has its kept memory: %s", pid,
                told.error().message.c_str());
    it->second.kept.reset();
  }
  // On-demand: the keeper hears at the end of the fill (end_fill_window).
  {
    std::lock_guard<std::mutex> lock(window_mu_);
    if (keeper_ && !it->second.window_pid) (void)keeper_->restoring(pid, true);
  }
  PHOS_INFO("process %d (pid %d in its namespace): GPU state restored, gate open", pid, *vpid);
  return true;
}

}  // namespace phos::plugin
