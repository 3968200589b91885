#include "agent/cuda_backend.h"
#include "phos/hooks/stderr_line.h"
#include "agent/slow_calls.h"
#include "fault/gpu_fault.h"
#include "process/io_uring.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "driver/driver.h"
#include "hooks/nccl.h"
#include "phos/speculation/demangle.h"
#include "phos/support/clock.h"

namespace phos::hooks {
namespace {

// The driver's checkpoint refuses a process that a profiler is attached to
// (lock fails with CUDA_ERROR_NOT_SUPPORTED): say so before a dump starts.
// Profilers (Nsight Systems, Compute) inject theirs through
// CUDA_INJECTION64_PATH. libcupti merely loaded is no refusal: the driver
// checkpointed such processes until CUPTI was subscribed; the
// plugin names libcupti when the lock is refused. Looked at when the status
// is asked for, never on a CUDA call.
std::optional<std::string> profiler_attached() {
  const char* injection = std::getenv("CUDA_INJECTION64_PATH");
  if (injection && *injection) return std::string("CUPTI/profiler attached (CUDA_INJECTION64_PATH=") + injection + ")";
  return std::nullopt;
}

}  // namespace

namespace {

// NCCL closes a peer's proxy connection itself when one rank aborts only
// with cuMem host memory on (proxy.cc, the service thread's forced close);
// without it, the first rank's abort waits for every other rank's
// (measured: over 45 s). The variable that turned it off, or null.
std::optional<std::string> nccl_cumem_host_off() {
  for (const char* name : {"NCCL_CUMEM_ENABLE", "NCCL_CUMEM_HOST_ENABLE"})
    if (const char* v = std::getenv(name); v && *v && std::atoi(v) == 0) return std::string(name) + "=" + v;
  return std::nullopt;
}

}  // namespace

namespace {
// The call counter's totals, each kind named, its cycles also in ns.
agent::CallCycles call_cycle_totals(const CallCycles& counter) {
  agent::CallCycles out;
  out.cycles_per_second = counter.cycles_per_second();
  out.floor_cycles_per_call = CallCycles::floor_cycles_per_call();
  for (const auto& k : counter.totals())
    out.calls.push_back(agent::CallCost{.call = call_kind_name(k.kind),
                                        .calls = k.calls,
                                        .cycles = k.cycles,
                                        .ns = uint64_t(double(k.cycles) * 1e9 / out.cycles_per_second + 0.5)});
  return out;
}
}  // namespace

agent::StatusReply CudaBackend::status() {
  agent::StatusReply s;
  auto m = rt_.memory().stats();
  s.cuda_initialized = rt_.cuda_used().load() || driver::loaded();
  s.allocation_count = m.units;
  s.allocated_bytes = m.physical_bytes;
  s.device_count = m.devices;
  for (const auto& [dev, uuid] : m.uuids) s.devices.push_back(GpuDevice{.ordinal = uint32_t(dev), .uuid = uuid});
  s.unsupported_calls = rt_.unsupported().list();
  if (size_t n = rt_.nccl().spanning_processes(true))
    s.unsupported_calls.push_back(std::to_string(n) + " NCCL communicator(s) with ranks in other processes, " +
                                  "not held at a job-wide stop (a multi-process job: dump its whole tree with " +
                                  "one criu, which holds every rank at one collective boundary)");
  if (auto off = nccl_cumem_host_off(); off && rt_.nccl().spanning_processes())
    s.unsupported_calls.push_back("NCCL communicator(s) with ranks in other processes and cuMem host memory off (" +
                                  *off +
                                  "): NCCL's abort of one rank then waits for the others, and a job's ranks are "
                                  "released one after another");
  for (auto& why : rt_.nccl().not_recreatable()) s.unsupported_calls.push_back(std::move(why));
  if (rt_.nccl().rebuilding())
    s.unsupported_calls.push_back("NCCL communicators still being made again after the last checkpoint");
  if (const char* ras = std::getenv("NCCL_RAS_ENABLE"); ras && std::atoi(ras) != 0 && !rt_.nccl().list().empty())
    s.unsupported_calls.push_back(std::string("NCCL's RAS (NCCL_RAS_ENABLE=") + ras +
                                  ": its sockets live as long as the process; phos turns it off unless asked)");
  if (rt_.memory().mps_seen()) s.unsupported_calls.push_back("MPS (the device's contexts are shared through MPS)");
  if (auto profiler = profiler_attached()) s.unsupported_calls.push_back(*profiler);
  for (auto& m : rt_.modules().modules()) {
    uint64_t count = m.functions.size();
    s.modules.push_back(agent::Module{.id = m.id,
                                      .kind = module_kind_name(m.image.kind),
                                      .size = m.image.size,
                                      .hash = m.image.hash,
                                      .source = std::move(m.source),
                                      .functions = std::move(m.functions),
                                      .function_count = count,
                                      .globals = std::move(m.globals)});
  }
  s.speculation_active = rt_.speculation().active();
  s.validation_active = rt_.validation().active();
  s.indexed_buffers = rt_.speculation().totals().indexed;
  s.kernels = rt_.speculation().kernels();
  s.counters = rt_.counters().list();
  s.counters.emplace_back("io_uring_setups_refused", io_uring_setups_refused());
  s.counters.emplace_back("live_blocks", m.blocks);
  s.counters.emplace_back("requested_bytes", m.requested_bytes);
  s.counters.emplace_back("physical_bytes", m.physical_bytes);
  if (rt_.call_cycles().on()) s.call_cycles = call_cycle_totals(rt_.call_cycles());
  const auto communicators = rt_.nccl().list();
  s.counters.emplace_back("nccl_communicators", communicators.size());
  if (auto t = rt_.nccl().timings(); t.releases || t.rebuilds) {
    s.counters.emplace_back("nccl_releases", t.releases);
    s.counters.emplace_back("nccl_last_release_us", t.last_release_ns / 1000);
    s.counters.emplace_back("nccl_rebuilds", t.rebuilds);
    s.counters.emplace_back("nccl_last_rebuild_us", t.last_rebuild_ns / 1000);
  }
  for (const auto& c : communicators)
    s.nccl_communicators.push_back(agent::NcclCommunicatorStatus{.rank = c.rank,
                                                                 .nranks = c.nranks,
                                                                 .device = c.device,
                                                                 .job_id = c.job_id,
                                                                 .calls = c.calls,
                                                                 .single_process = c.single_process,
                                                                 .stop_at = c.stop_at,
                                                                 .held = c.held,
                                                                 .released = c.released(),
                                                                 .rebuilds = c.rebuilds});
  s.ipc_exports = rt_.memory().ipc_exports();
  return s;
}

std::vector<agent::Allocation> CudaBackend::allocations() { return rt_.memory().units(); }

Result<UniqueFd> CudaBackend::export_allocation(uint64_t id) { return rt_.memory().export_unit(id); }

// cuCtxSynchronize has no timeout: a kernel that never ends makes the
// checkpoint wait (the plugin's agent timeout then fails the dump).
Result<void> CudaBackend::drain(std::chrono::milliseconds) {
  // A program whose GPU work failed for good is not checkpointed: its image
  // would restore a failed program (a supervisor restoring it would see it
  // fail again, every restart). A lost device fails the synchronize below;
  // the injected fault leaves the context whole, so it is asked here.
  if (gpu_fault::fired())
    return make_error("the program's GPU work failed (PHOS_FAULT=gpu-error, as on a lost device): an image of it "
                      "would restore a failed program",
                      EIO);
  return rt_.memory().synchronize();
}

// Handles dropped: the driver's checkpoint comes next.
Result<uint64_t> CudaBackend::release_mappings(bool drop_handles) {
  auto released = rt_.memory().release_mappings(drop_handles);
  if (released && drop_handles && DriverLimits::wanted()) shrink_driver_state();
  return released;
}

Result<uint64_t> CudaBackend::remap(std::span<const uint64_t> ids, std::vector<UniqueFd> fds) {
  auto mapped = rt_.memory().remap(ids, std::move(fds));
  restore_driver_state();
  return mapped;
}

// A gate opened without a remap (a dump given up after the release) gets
// its limits back too; after a remap there is nothing left to set. The
// slow-call trace (slow_calls.h) starts here.
void CudaBackend::gate_opening() {
  restore_driver_state();
  arm_slow_call_trace();
}

// Not lowered is no failure: the driver's checkpoint then carries the state
// as it is. Both lines say how long the driver took (setting back
// allocates the local memory again, before the gate opens).
void CudaBackend::shrink_driver_state() {
  const uint64_t t0 = monotonic_ns();
  auto lowered = limits_.lower(rt_.memory().contexts());
  if (!lowered)
    stderr_line("phos: PHOS_SHRINK_DRIVER_STATE: %s; the driver's checkpoint takes the state as it is\n",
                lowered.error().message.c_str());
  else if (!lowered->empty())
    stderr_line("phos: before the driver's checkpoint, context limits lowered: %s (%.1f ms)\n",
                lowered->c_str(), double(monotonic_ns() - t0) / 1e6);
}

void CudaBackend::restore_driver_state() {
  const uint64_t t0 = monotonic_ns();
  auto restored = limits_.restore();
  if (!restored)
    stderr_line("phos: PHOS_SHRINK_DRIVER_STATE: %s (the program runs with the lowered limits)\n",
                restored.error().message.c_str());
  else if (!restored->empty())
    stderr_line("phos: context limits set back: %s (%.1f ms)\n", restored->c_str(),
                double(monotonic_ns() - t0) / 1e6);
}

// Each record's buffers (a kernel's speculated set, where speculation was
// on; a call's exact ranges) matched to the allocation that holds them.
std::vector<uint64_t> CudaBackend::touch_order() {
  if (!rt_.launches().enabled()) return {};
  std::vector<agent::Allocation> units = rt_.memory().units();
  std::sort(units.begin(), units.end(), [](const auto& a, const auto& b) { return a.address < b.address; });
  std::vector<uint64_t> order;
  std::set<uint64_t> seen;
  auto touch = [&](uint64_t address) {
    auto it = std::upper_bound(units.begin(), units.end(), address,
                               [](uint64_t a, const agent::Allocation& u) { return a < u.address; });
    if (it == units.begin()) return;
    --it;
    if (address < it->address + it->size && seen.insert(it->id).second) order.push_back(it->id);
  };
  for (const LaunchRecord& r : rt_.launches().recent()) {
    if (r.kind == RecordKind::kKernel) {
      for (uint8_t i = 0; r.set.present && i < r.set.count; i++) touch(r.set.items[i].start);
    } else {
      for (uint8_t i = 0; i < r.ranges.count; i++) touch(r.ranges.items[i].address);
    }
  }
  return order;
}

Result<void> CudaBackend::set_speculation(bool on) {
  if (!on) rt_.validation().set_active(false);  // nothing to validate without it
  rt_.speculation().set_active(on);
  return {};
}

// Speculation goes on with the window (a call's write set comes from it) and
// stays on after (its statistics are the program's), unless PHOS_SPECULATE
// is `never` (every kernel's set unknown: a test that a dump's correctness
// rests on checksums alone). Validation counts only where it ran before: it
// takes each module's PTX when the module is loaded, so turned on now it
// could validate none of the kernels already there.
Result<agent::OpenCopyWindowReply> CudaBackend::open_copy_window(const agent::OpenCopyWindowRequest& q,
                                                                 std::vector<UniqueFd> fds) {
  static const bool never = [] {
    const char* v = std::getenv("PHOS_SPECULATE");
    return v && std::string_view(v) == "never";
  }();
  if (!never) rt_.speculation().set_active(true);
  agent::OpenCopyWindowReply reply;
  reply.validating = rt_.validation().active();
  violations_at_open_ = rt_.validation().totals().violations;
  kernel_violations_at_open_.clear();
  for (const auto& k : rt_.validation().kernels()) kernel_violations_at_open_[k.name] += k.violations;
  PHOS_TRY(rt_.copy_window().start(q, std::move(fds), rt_.memory().units()));
  return reply;
}

Result<bool> CudaBackend::nccl_stop(uint64_t job_id, std::optional<uint64_t> at_call) {
  if (!at_call) {
    rt_.nccl().disarm(job_id);
    return false;
  }
  return rt_.nccl().arm_stop(job_id, *at_call);
}

Result<NcclReleased> CudaBackend::nccl_release(std::chrono::milliseconds timeout) {
  return phos::hooks::nccl_release(timeout);
}

Result<uint32_t> CudaBackend::nccl_rebuild(std::optional<uint64_t> nonce) { return phos::hooks::nccl_rebuild(nonce); }

Result<bool> CudaBackend::nccl_pend_release(bool pend) { return phos::hooks::nccl_pend_release(pend); }

Result<agent::IpcOpenReply> CudaBackend::ipc_open(uint64_t id, pid_t importer, UniqueFd* fd) {
  CUdeviceptr va = 0;
  auto opened = rt_.memory().ipc_export(id, importer, fd, &va);
  if (!opened) return opened;
  // A dump's window is open: the dump's shared set (memory copied while the
  // whole tree is stopped) was taken at its pause, before this importer.
  // Its writes will pass no hook of this process, so the whole allocation
  // goes through the window now, before the importer has the fd, as a call
  // that reads and writes all of it: copy-on-write saves what is not
  // copied yet into the pool (or waits for its copy), recopy marks it
  // dirty, an on-demand restore waits until it is filled. Refusing or
  // delaying the open until the window closes would fail or stall the
  // importer's program for the whole copy; this costs one save.
  if (rt_.copy_window().open()) {
    ranges::RangeList whole;
    whole.add(va, opened->size, ranges::kRead | ranges::kWrite);
    rt_.copy_window().before_exact(whole, "a CUDA IPC open by another process");
  }
  return opened;
}

Result<void> CudaBackend::ipc_close(uint64_t id, pid_t importer) {
  rt_.memory().ipc_closed(id, importer);
  return {};
}

Result<agent::CloseCopyWindowReply> CudaBackend::close_copy_window(const std::vector<agent::AddressRange>& missed) {
  agent::CloseCopyWindowReply reply = rt_.copy_window().finish(missed);
  for (auto& k : reply.speculated_kernels) k.name = speculation::demangle(k.name.c_str());
  for (auto& k : reply.suspects) k.name = speculation::demangle(k.name.c_str());
  for (auto* calls : {&reply.longest_waits, &reply.most_saved})
    for (auto& w : *calls)
      if (!w.kernel.empty()) w.kernel = speculation::demangle(w.kernel.c_str());
  // Launches made while the window was open report their writes once they
  // have run.
  if (auto drained = rt_.memory().synchronize(); !drained)
    return make_error("close copy window: wait for the launches made in it: " + drained.error().message, EIO);
  reply.violations = rt_.validation().totals().violations - violations_at_open_;
  if (reply.violations == 0) return reply;
  // A kernel of an unloaded module may be listed again live: sums by name,
  // as at the open.
  auto kernels = rt_.validation().kernels();
  std::map<std::string, uint64_t> now;
  for (const auto& k : kernels) now[k.name] += k.violations;
  for (const auto& k : kernels) {
    if (now[k.name] <= kernel_violations_at_open_[k.name] || k.violations == 0) continue;
    char where[160];
    CUdeviceptr base = 0;
    size_t size = 0;
    if (rt_.memory().address_range(k.first_address, &base, &size))
      std::snprintf(where, sizeof(where), "0x%llx, in the buffer of %zu bytes at 0x%llx",
                    static_cast<unsigned long long>(k.first_address), size, static_cast<unsigned long long>(base));
    else
      std::snprintf(where, sizeof(where), "0x%llx", static_cast<unsigned long long>(k.first_address));
    reply.violation =
        "kernel " + speculation::demangle(k.name.c_str()) + " wrote outside its speculated set (first at " + where + ")";
    break;
  }
  return reply;
}

Result<bool> CudaBackend::set_validation(bool on) {
  if (on) rt_.speculation().set_active(true);
  rt_.validation().set_active(on);
  return rt_.validation().sass_attached();
}

}  // namespace phos::hooks
