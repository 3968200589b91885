#include "launch/copy_window.h"
#include "phos/hooks/stderr_line.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <chrono>
#include <thread>
#include <tuple>

#include "driver/driver.h"
#include "launch/launch_speculation.h"
#include "phos/hooks/kernel_registry.h"
#include "phos/support/clock.h"

namespace phos::hooks {

extern const unsigned char kChunkSaveImage[];
extern const size_t kChunkSaveImageSize;

// Counts a call in while the window is open; finish() waits for none to be
// inside before it unmaps the pool the calls copy into.
class CopyWindow::Use {
 public:
  explicit Use(CopyWindow& w) : w_(w) {
    w_.users_.fetch_add(1);
    inside_ = w_.open_.load();
    if (!inside_) w_.users_.fetch_sub(1);
  }
  ~Use() {
    if (inside_) w_.users_.fetch_sub(1);
  }
  bool inside() const { return inside_; }

 private:
  CopyWindow& w_;
  bool inside_ = false;
};

Result<void> CopyWindow::map_pool(const agent::CopyPool& q, int fd, DevicePool& out) {
  const std::string gpu = "GPU " + std::to_string(q.device);
  out.bytes = q.bytes;
  out.slots = q.slots;
  CUresult r = PHOS_REAL(cuDeviceGet)(&out.device, int(q.device));
  if (r == CUDA_SUCCESS) r = PHOS_REAL(cuDevicePrimaryCtxRetain)(&out.ctx, out.device);
  if (r != CUDA_SUCCESS) {
    out.ctx = nullptr;
    return make_error(cu_error(("open copy window: " + gpu + "'s context").c_str(), r), ENODEV);
  }
  PHOS_REAL(cuCtxPushCurrent_v2)(out.ctx);
  auto fail = [&](const char* what, CUresult e) -> Result<void> {
    PHOS_REAL(cuCtxPopCurrent_v2)(nullptr);
    return make_error(cu_error(("open copy window: " + gpu + ": " + what).c_str(), e), EIO);
  };
  CUmemGenericAllocationHandle h = 0;
  r = PHOS_REAL(cuMemImportFromShareableHandle)(&h, reinterpret_cast<void*>(intptr_t(fd)),
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) return fail("import the pool", r);
  CUdeviceptr va = 0;
  r = PHOS_REAL(cuMemAddressReserve)(&va, q.bytes, 0, 0, 0);
  if (r == CUDA_SUCCESS) {
    r = PHOS_REAL(cuMemMap)(va, q.bytes, 0, h, 0);
    if (r != CUDA_SUCCESS) PHOS_REAL(cuMemAddressFree)(va, q.bytes);
  }
  PHOS_REAL(cuMemRelease)(h);  // the mapping keeps it
  if (r != CUDA_SUCCESS) return fail("map the pool", r);
  out.va = va;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = int(q.device);
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = PHOS_REAL(cuMemSetAccess)(va, q.bytes, &access, 1);
  if (r != CUDA_SUCCESS) return fail("pool access", r);
  r = PHOS_REAL(cuStreamCreate)(&out.stream, CU_STREAM_NON_BLOCKING);
  if (r != CUDA_SUCCESS) {
    out.stream = nullptr;
    return fail("stream", r);
  }
  load_save_kernel(out, gpu);
  PHOS_REAL(cuCtxPopCurrent_v2)(nullptr);
  return {};
}

// Through the driver itself: the program's module registry and launch log
// never see phos's own kernel. Where it does not load, the saves go through
// the copy engines, slower while the engine copies, as correct.
void CopyWindow::load_save_kernel(DevicePool& pool, const std::string& gpu) {
  if (kChunkSaveImageSize == 0) return;
  CUresult r = PHOS_REAL(cuModuleLoadData)(&pool.save_module, kChunkSaveImage);
  if (r == CUDA_SUCCESS) r = PHOS_REAL(cuModuleGetFunction)(&pool.save_kernel, pool.save_module, "phos_chunk_save");
  // Under lazy loading a function loads at its first launch, which may wait
  // for the whole context: an attribute query loads it here instead.
  int threads = 0;
  if (r == CUDA_SUCCESS)
    r = PHOS_REAL(cuFuncGetAttribute)(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, pool.save_kernel);
  if (r == CUDA_SUCCESS && threads < 256) r = CUDA_ERROR_INVALID_VALUE;  // launched in blocks of 256
  if (r == CUDA_SUCCESS) return;
  stderr_line("phos: copy window: %s\n",
              cu_error((gpu + ": load the pool's save kernel (saves go through the copy engines)").c_str(), r).c_str());
  if (pool.save_module) PHOS_REAL(cuModuleUnload)(pool.save_module);
  pool.save_module = nullptr;
  pool.save_kernel = nullptr;
}

// The pool's mapping, once the saves still running on its stream (they
// complete outside save_mu_) are done; its context current.
void CopyWindow::unmap_va(DevicePool& p) {
  if (!p.va) return;
  if (p.stream) PHOS_REAL(cuStreamSynchronize)(p.stream);
  PHOS_REAL(cuMemUnmap)(p.va, p.bytes);
  PHOS_REAL(cuMemAddressFree)(p.va, p.bytes);
  p.va = 0;
}

void CopyWindow::unmap_pool(DevicePool& p) {
  if (!p.ctx) return;
  PHOS_REAL(cuCtxPushCurrent_v2)(p.ctx);
  unmap_va(p);
  if (p.stream) PHOS_REAL(cuStreamDestroy_v2)(p.stream);
  if (p.save_module) PHOS_REAL(cuModuleUnload)(p.save_module);
  PHOS_REAL(cuCtxPopCurrent_v2)(nullptr);
  PHOS_REAL(cuDevicePrimaryCtxRelease_v2)(p.device);
  p = DevicePool{};
}

Result<void> CopyWindow::assign_slots(copystate::CopyState& table, const std::vector<DevicePool>& pools,
                                      const std::vector<agent::Allocation>& allocations) {
  std::map<uint64_t, uint32_t> device_of;
  for (const auto& a : allocations) device_of[a.id] = a.device;
  std::vector<copystate::SlotRange> ranges;
  for (const auto& region : table.regions()) {
    // A region of no known GPU, or of a GPU without a pool, takes no slot:
    // a write to it waits for the engine's copy.
    copystate::SlotRange r;
    auto it = device_of.find(region.id);
    for (const DevicePool& p : pools)
      if (it != device_of.end() && uint32_t(p.device) == it->second) r = {p.first_slot, p.first_slot + p.slots};
    ranges.push_back(r);
  }
  return table.set_region_slots(std::move(ranges));
}

Result<void> CopyWindow::start(const agent::OpenCopyWindowRequest& q, std::vector<UniqueFd> fds,
                               const std::vector<agent::Allocation>& allocations) {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_.load() || table_) return make_error("a copy window is open already", EBUSY);
  const size_t want = 1 + q.pools.size();
  if (fds.size() != want)
    return make_error("open copy window: " + std::to_string(fds.size()) + " fds, expected " + std::to_string(want),
                      EINVAL);
  auto table = copystate::CopyState::attach(fds[0].get());
  if (!table) return table.error();
  if (table->protocol() != CopyProtocol::kSoftCopyOnWrite && !q.pools.empty())
    return make_error("open copy window: only a copy-on-write window has a pool", EINVAL);
  uint64_t slots = 0;
  for (const agent::CopyPool& p : q.pools) {
    if (uint64_t(p.slots) * table->chunk_size() > p.bytes)
      return make_error("open copy window: GPU " + std::to_string(p.device) + "'s pool: " + std::to_string(p.slots) +
                            " slots of " + std::to_string(table->chunk_size()) + " bytes do not fit " +
                            std::to_string(p.bytes) + " bytes",
                        EINVAL);
    slots += p.slots;
  }
  if (slots != table->pool_slots())
    return make_error("open copy window: the pools hold " + std::to_string(slots) + " slots, the table " +
                          std::to_string(table->pool_slots()),
                      EINVAL);
  // Recopy and a fill copy nothing themselves: no context, no stream.
  std::vector<DevicePool> pools(q.pools.size());
  uint32_t first = 0;
  for (size_t i = 0; i < q.pools.size(); i++) {
    pools[i].first_slot = first;
    first += q.pools[i].slots;
    if (auto mapped = map_pool(q.pools[i], fds[1 + i].get(), pools[i]); !mapped) {
      for (DevicePool& p : pools) unmap_pool(p);
      return mapped.error();
    }
  }
  if (!pools.empty())
    if (auto set = assign_slots(*table, pools, allocations); !set) {
      for (DevicePool& p : pools) unmap_pool(p);
      return set.error();
    }
  begin(std::move(*table), q, std::move(pools));
  return {};
}

void CopyWindow::begin(copystate::CopyState table, const agent::OpenCopyWindowRequest& q,
                       std::vector<DevicePool> pools) {
  const bool fill = table.protocol() == CopyProtocol::kOnDemandFill;
  table_ = std::make_unique<copystate::CopyState>(std::move(table));
  pools_ = std::move(pools);
  trust_ = q.trust;
  timeout_ = std::chrono::milliseconds(q.timeout_ms);
  checked_ = waited_ = unknown_waits_ = wait_ns_ = unmarked_ = 0;
  account_.clear();
  abort_reason_.clear();
  fill_.store(fill);
  sequence_.fetch_add(1, std::memory_order_acq_rel);
  open_.store(true);
}

agent::CloseCopyWindowReply CopyWindow::finish(const std::vector<agent::AddressRange>& missed_chunks) {
  std::lock_guard<std::mutex> lock(mu_);
  agent::CloseCopyWindowReply out;
  if (!table_) return out;
  // Copy-on-write: the table says closed (the engine closed it) or aborted;
  // a window the engine never closed (criu gone) is given up here, so no
  // call waits. Recopy: the engine's second pass, after this, still needs
  // the table as it is.
  if (table_->protocol() == CopyProtocol::kSoftCopyOnWrite) table_->close(copystate::Window::kAborted);
  // A fill asked to close before it is whole: calls would run on memory
  // that is not restored.
  if (filling() && table_->window() != copystate::Window::kClosed)
    fill_failed(make_error("the restore closed its window before the device memory was whole", EIO));
  open_.store(false);
  while (users_.load() != 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  out.counters = {
      .calls_checked = checked_, .calls_waited = waited_, .unknown_waits = unknown_waits_, .wait_ns = wait_ns_};
  out.chunks_saved = table_->statistics().saved;
  out.aborted = table_->protocol() == CopyProtocol::kSoftCopyOnWrite && table_->window() == copystate::Window::kAborted;
  out.abort_reason = abort_reason_;
  // Given up without a reason of the hooks: by the engine (its error is in
  // criu's log), or never closed by it (criu gone).
  if (out.aborted && out.abort_reason.empty()) out.abort_reason = "the engine did not finish the copy";
  std::tie(out.speculated_kernels, out.speculated_kernel_count) = account_.kernels();
  out.unmarked_calls = unmarked_;
  if (!missed_chunks.empty()) out.suspects = suspects(missed_chunks);
  out.longest_waits = account_.longest_waits();
  out.most_saved = account_.most_saved();
  for (DevicePool& p : pools_) unmap_pool(p);
  pools_.clear();
  table_.reset();
  return out;
}

// The reply names the kMaxWindowKernels most launched suspects, no count:
// how many more there were, and the (kernel, buffer) pairs the account did
// not keep (a writer may be among them), go to the log here.
std::vector<agent::KernelLaunches> CopyWindow::suspects(const std::vector<agent::AddressRange>& missed) const {
  auto [named, count] = account_.suspects(missed);
  const uint64_t dropped = account_.ranges_dropped();
  if (count > named.size() || dropped)
    stderr_line(
        "phos: copy window: %" PRIu64 " kernels pointed into the buffers of the %zu changed chunks, the %zu "
        "most launched named to criu; %" PRIu64 " (kernel, buffer) pairs past the first %zu not kept: %s\n",
        count, missed.size(), named.size(), dropped, WindowAccount::kMaxRanges,
        dropped ? "the writer may be among them" : "every launch's buffers kept");
  return std::move(named);
}

Result<void> CopyWindow::save(uint64_t address, uint64_t bytes, uint32_t slot, std::vector<const DevicePool*>& used,
                              SaveRun& run) {
  // The table hands a region only slots of its GPU's pool (assign_slots):
  // the copy stays on that GPU.
  auto pool = std::find_if(pools_.begin(), pools_.end(),
                           [&](const DevicePool& p) { return slot >= p.first_slot && slot - p.first_slot < p.slots; });
  if (pool == pools_.end()) return make_error("copy into the pool: slot " + std::to_string(slot) + " is in no pool", EINVAL);
  CUdeviceptr va;
  {
    // The mapping is read under save_mu_: give_pool_back unmaps it there.
    std::lock_guard<std::mutex> lock(save_mu_);
    va = pool->va;
  }
  if (!va) return make_error("copy into GPU " + std::to_string(pool->device) + "'s pool: given back", ENOMEM);
  const uint64_t dst = va + uint64_t(slot - pool->first_slot) * table_->chunk_size();
  if (std::find(used.begin(), used.end(), &*pool) == used.end()) used.push_back(&*pool);
  // Runs only for the save kernel, which reads any mapped addresses: a run
  // may span allocations next to each other, which one cuMemcpyDtoDAsync
  // (the fallback) must not.
  const bool follows = pool->save_kernel && run.pool == &*pool && run.pool_va == va && run.src + run.bytes == address &&
                       run.dst + run.bytes == dst && ((address | dst | bytes) % 16) == 0;
  if (follows) {
    run.bytes += bytes;
    return {};
  }
  PHOS_TRY(launch_run(run));
  run = SaveRun{.pool = &*pool, .pool_va = va, .src = address, .dst = dst, .bytes = bytes, .failed = std::nullopt};
  return {};
}

Result<void> CopyWindow::launch_run(SaveRun& run) {
  if (run.failed) return *run.failed;
  if (!run.pool || !run.bytes) return {};
  auto launched = launch_now(run);
  run = SaveRun{};
  if (!launched) run.failed = launched.error();
  return launched;
}

Result<void> CopyWindow::launch_now(const SaveRun& r) {
  const DevicePool& pool = *r.pool;
  // Launched under save_mu_, on the mapping the run was made on.
  std::lock_guard<std::mutex> lock(save_mu_);
  if (pool.va != r.pool_va)
    return make_error("copy into GPU " + std::to_string(pool.device) + "'s pool: given back", ENOMEM);
  PHOS_REAL(cuCtxPushCurrent_v2)(pool.ctx);
  CUresult res;
  unsigned long long src = r.src, dst = r.dst;
  if (pool.save_kernel && ((src | dst | r.bytes) % 16) == 0) {
    // One 16-byte word a thread in blocks of 256, at most 4096 blocks, which
    // loop over a longer run.
    unsigned long long words = r.bytes / 16;
    const unsigned blocks = unsigned(std::min<unsigned long long>((words + 255) / 256, 4096));
    void* args[] = {&src, &dst, &words};
    res = PHOS_REAL(cuLaunchKernel)(pool.save_kernel, blocks ? blocks : 1, 1, 1, 256, 1, 1, 0, pool.stream, args,
                                    nullptr);
  } else {
    res = PHOS_REAL(cuMemcpyDtoDAsync_v2)(dst, src, r.bytes, pool.stream);
  }
  PHOS_REAL(cuCtxPopCurrent_v2)(nullptr);
  if (res != CUDA_SUCCESS)
    return make_error(cu_error(("copy into GPU " + std::to_string(pool.device) + "'s pool").c_str(), res), EIO);
  return {};
}

Result<void> CopyWindow::complete_saves(const std::vector<const DevicePool*>& used) {
  // The stream's other copies (another thread's saves) are waited for too:
  // a little longer, never too short. Bounded by the window's timeout: the
  // save kernel needs free SMs, which a program kernel spinning on this
  // very thread (a peer held at the gate) could keep; the window is then
  // given up (its image refused) and this call goes on.
  const uint64_t deadline = monotonic_ns() + uint64_t(timeout_.count()) * 1000000;
  for (const DevicePool* pool : used) {
    PHOS_TRY(in_context(pool->ctx, [&]() -> Result<void> {
      CUresult r;
      for (unsigned spins = 0; (r = PHOS_REAL(cuStreamQuery)(pool->stream)) == CUDA_ERROR_NOT_READY; spins++) {
        if (monotonic_ns() > deadline)
          return make_error("copy into GPU " + std::to_string(pool->device) + "'s pool: not done after " +
                                std::to_string(timeout_.count()) + " ms",
                            ETIMEDOUT);
        if (spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (r != CUDA_SUCCESS)
        return make_error(cu_error(("copy into GPU " + std::to_string(pool->device) + "'s pool").c_str(), r), EIO);
      return {};
    }));
  }
  return {};
}

void CopyWindow::fill_failed(const Error& e) {
  stderr_line("phos: on-demand restore: %s; the process cannot go on without its device memory\n",
              e.message.c_str());
  ::kill(::getpid(), SIGKILL);
  ::_exit(1);  // not reached
}

void CopyWindow::await_filled(uint64_t address, uint64_t bytes, bool overwrite) {
  uint64_t t0 = monotonic_ns();
  auto report = table_->before_use(address, bytes, overwrite, timeout_);
  if (!report) fill_failed(report.error());
  count_wait(t0, report->waited > 0, false);
}

void CopyWindow::give_up(const Error& e) {
  if (filling()) fill_failed(e);
  table_->close(copystate::Window::kAborted);
  std::lock_guard<std::mutex> lock(save_mu_);
  if (abort_reason_.empty()) abort_reason_ = e.message;
}

void CopyWindow::count_wait(uint64_t since_ns, bool waited, bool unknown_set) {
  if (!waited) return;
  waited_.fetch_add(1, std::memory_order_relaxed);
  if (unknown_set) unknown_waits_.fetch_add(1, std::memory_order_relaxed);
  wait_ns_.fetch_add(monotonic_ns() - since_ns, std::memory_order_relaxed);
}

void CopyWindow::write(uint64_t address, uint64_t bytes, CallCost& cost) {
  std::vector<const DevicePool*> used;
  SaveRun run;
  copystate::SaveChunks saves{
      .enqueue = [this, &used, &run](uint64_t a, uint64_t n, uint32_t slot) { return save(a, n, slot, used, run); },
      .complete =
          [this, &used, &run] {
            auto r = launch_run(run);
            // The copies launched before are waited for even so: their
            // chunks are taken back only once nothing writes their slots.
            auto done = complete_saves(used);
            used.clear();
            return r ? done : r;
          },
  };
  auto report = table_->before_write(address, bytes, saves, timeout_);
  if (!report) return give_up(report.error());
  cost.waited += report->waited;
  cost.saved += report->saved;
  cost.save_ns += report->save_ns;
  cost.engine_wait_ns += report->wait_ns;
}

void CopyWindow::settle(const CallCost& cost, const char* call, const Kernel* kernel, bool unknown_set) {
  const bool waited = cost.waited || cost.whole_window;
  if (!waited && !cost.saved) return;
  // The call's time in the window's work, saves included (the program
  // waits for them too); wait_ns and the window's counters only for calls
  // that waited (the longest waits), save_ns for every one.
  const uint64_t ns = monotonic_ns() - cost.since_ns;
  if (waited) {
    waited_.fetch_add(1, std::memory_order_relaxed);
    if (unknown_set) unknown_waits_.fetch_add(1, std::memory_order_relaxed);
    wait_ns_.fetch_add(ns, std::memory_order_relaxed);
  }
  account_.cost(agent::CallWait{.call = call,
                                .kernel = kernel ? kernel->name : std::string(),
                                .wait_ns = waited ? ns : 0,
                                .chunks_waited = cost.waited,
                                .chunks_saved = cost.saved,
                                .save_ns = cost.save_ns,
                                .engine_wait_ns = cost.engine_wait_ns});
}

void CopyWindow::untrusted(bool unknown_set, const char* call, const Kernel* kernel) {
  // A fill given up lets no call through (wait_closed says so).
  if (table_->window() != copystate::Window::kOpen && !filling()) return;
  // Recopy never waits (the gate closing for the final pass would wait for
  // this call): everything is copied again instead, unless the final pass
  // goes by checksum and copies again what changed anyway. A fill: the call
  // waits for the whole fill (give_up ends the process if it fails).
  if (table_->protocol() == CopyProtocol::kSoftRecopy) {
    if (trust_ == agent::CopyTrust::kChecksum) {
      unmarked_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    return table_->mark_all_dirty();
  }
  CallCost cost{.since_ns = monotonic_ns(), .whole_window = true};
  if (auto r = table_->wait_closed(timeout_); !r) give_up(r.error());
  settle(cost, call, kernel, unknown_set);
}

void CopyWindow::before_exact(const ranges::RangeList& l, const char* call) {
  Use use(*this);
  if (!use.inside()) return;
  checked_.fetch_add(1, std::memory_order_relaxed);
  if (filling()) return use_exact(l);
  for (uint8_t i = 0; i < l.count; i++) {
    const ranges::BufferRange& b = l.items[i];
    if (!(b.access & ranges::kWrite)) continue;
    // A written extent that is not known, or matrices behind an array of
    // pointers: any memory may change.
    if (b.access & (ranges::kExtentUnknown | ranges::kPointerArray)) return untrusted(true, call);
  }
  CallCost cost{.since_ns = monotonic_ns()};
  for (uint8_t i = 0; i < l.count; i++)
    if (l.items[i].access & ranges::kWrite) write(l.items[i].address, l.items[i].bytes, cost);
  settle(cost, call, nullptr, false);
}

void CopyWindow::before_kernel(const WriteRanges& writes, bool validated, const Kernel* kernel) {
  Use use(*this);
  if (!use.inside()) return;
  if (writes.covered) {  // inside a library call, covered by its exact set
    // A call that began before this window opened has not checked its set
    // against it: its kernels were held at the gate through the stop, and
    // would otherwise write the set's memory unsaved. Checked now, once.
    LaunchSpeculation::ExactScope* scope = LaunchSpeculation::ExactScope::current();
    const uint64_t window = sequence();
    if (scope && scope->checked_window != window) {
      scope->checked_window = window;
      before_library(*scope->set, scope->call);
    }
    return;
  }
  checked_.fetch_add(1, std::memory_order_relaxed);
  constexpr const char* kLaunch = "kernel launch";
  if (!writes.known) return untrusted(true, kLaunch, kernel);
  // On-demand restore: without read validation, only an exact set says
  // everything a kernel may read.
  if (filling()) return writes.exact ? await_sets(writes) : untrusted(false, kLaunch, kernel);
  const bool speculated = trust_ == agent::CopyTrust::kSpeculated || trust_ == agent::CopyTrust::kChecksum ||
                          (trust_ == agent::CopyTrust::kValidated && validated);
  if (!writes.exact && !speculated) return untrusted(false, kLaunch, kernel);
  // Counted for the close's reply; with checksum, what a refused image
  // names too (the buffers it only read).
  if (!writes.exact && kernel)
    account_.launch(kernel, kernel->name,
                    trust_ == agent::CopyTrust::kChecksum ? WindowAccount::Ranges(writes.reads) : WindowAccount::Ranges(),
                    writes.ranges);
  CallCost cost{.since_ns = monotonic_ns()};
  for (const auto& [start, end] : writes.ranges) write(start, end - start, cost);
  settle(cost, kLaunch, kernel, false);
}

std::optional<std::vector<std::pair<uint64_t, uint64_t>>> CopyWindow::before_fill_twin(const WriteRanges& sets) {
  Use use(*this);
  // A fill that ended: the launch goes as usual (an aborted one ends the
  // process there).
  if (!use.inside() || !filling() || table_->window() != copystate::Window::kOpen) return std::nullopt;
  checked_.fetch_add(1, std::memory_order_relaxed);
  await_sets(sets);
  // The complement of what is not in; what fills later only adds to it.
  std::vector<std::pair<uint64_t, uint64_t>> allowed;
  uint64_t from = 0;
  for (const auto& [start, end] : table_->unfilled_ranges()) {
    if (start > from) allowed.emplace_back(from, start);
    from = end;
  }
  allowed.emplace_back(from, UINT64_MAX);
  return allowed;
}

void CopyWindow::touched_unfilled(const std::string& kernel, uint64_t address, uint64_t count) {
  char at[32];
  std::snprintf(at, sizeof(at), "0x%llx", static_cast<unsigned long long>(address));
  fill_failed(make_error("kernel " + kernel + " touched device memory not yet restored, outside its speculated "
                             "sets (first at " + at + ", " + std::to_string(count) + " accesses)",
                         EFAULT));
}

void CopyWindow::before_library(const ranges::RangeList& l, const char* call) {
  if (!fill_.load(std::memory_order_relaxed)) return before_exact(l, call);
  Use use(*this);
  if (!use.inside()) return;
  checked_.fetch_add(1, std::memory_order_relaxed);
  untrusted(true, call);
}

void CopyWindow::await_sets(const WriteRanges& sets) {
  for (const auto& [start, end] : sets.reads) await_filled(start, end - start, false);
  for (const auto& [start, end] : sets.ranges) await_filled(start, end - start, false);
}

void CopyWindow::use_exact(const ranges::RangeList& l) {
  for (uint8_t i = 0; i < l.count; i++)
    if (l.items[i].access & (ranges::kExtentUnknown | ranges::kPointerArray)) return untrusted(true, "a library call");
  for (uint8_t i = 0; i < l.count; i++) {
    const ranges::BufferRange& b = l.items[i];
    const bool overwrite = (b.access & ranges::kWholeWrite) && !(b.access & ranges::kRead);
    await_filled(b.address, b.bytes, overwrite);
  }
}

void CopyWindow::before_unknown(const char* call) {
  Use use(*this);
  if (!use.inside()) return;
  checked_.fetch_add(1, std::memory_order_relaxed);
  untrusted(true, call);
}

bool CopyWindow::give_pool_back(const char* call, uint64_t bytes) {
  Use use(*this);
  if (!use.inside() || filling() || pools_.empty()) return false;
  uint64_t pool_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(save_mu_);
    for (const DevicePool& p : pools_) pool_bytes += p.va ? p.bytes : 0;
  }
  // Given back already, maybe since this call failed: one more try.
  if (!pool_bytes) return true;
  const uint64_t t0 = monotonic_ns();
  table_->ask_pool_back();
  auto given = table_->wait_pool_back(timeout_);
  if (!given) {
    // A save may still be under way: this side's mapping stays.
    stderr_line("phos: %s of %.1f MiB found the GPU full; the dump's copy-on-write pool (%.1f MiB): %s\n",
                call, double(bytes) / (1 << 20), double(pool_bytes) / (1 << 20), given.error().message.c_str());
    return true;
  }
  {
    // No slot holds a chunk and none is taken any more: nobody saves.
    std::lock_guard<std::mutex> lock(save_mu_);
    for (DevicePool& p : pools_) {
      if (!p.va) continue;
      PHOS_REAL(cuCtxPushCurrent_v2)(p.ctx);
      unmap_va(p);
      PHOS_REAL(cuCtxPopCurrent_v2)(nullptr);
    }
  }
  stderr_line(
      "phos: %s of %.1f MiB found the GPU full: the dump's copy-on-write pool (%.1f MiB) given back after "
      "%.1f ms; the allocation is tried again\n",
      call, double(bytes) / (1 << 20), double(pool_bytes) / (1 << 20), double(monotonic_ns() - t0) / 1e6);
  return true;
}

void CopyWindow::unit_dropped(uint64_t address) {
  Use use(*this);
  if (use.inside()) table_->forget(address);
}

void CopyWindow::transfer_queued(uint64_t bytes) {
  Use use(*this);
  if (use.inside() && !filling()) table_->transfer_queued(bytes, realtime_ns());
}

}  // namespace phos::hooks
