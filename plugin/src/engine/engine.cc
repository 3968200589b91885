#include "engine/engine.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <future>
#include <thread>
#include <utility>

#include "chunk_crc.h"
#include "chunk_sum.h"
#include "common/fault.h"
#include "phos/plugin/cow_pool.h"
#include "phos/plugin/log.h"
#include "phos/images/crc32c.h"
#include "phos/images/data_file.h"
#include "phos/images/fingerprint.h"
#include "phos/images/format.h"
#include "phos/images/image_dir.h"
#include "phos/support/clock.h"

namespace phos::plugin {
namespace {

// Slots in each worker's staging ring: with three, two DMAs can be queued
// while the worker does the CPU work of a third piece.
constexpr size_t kRingDepth = 3;


CUmemAccessDesc read_write(int device) {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = device;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

// The manifest's zero chunks and their bytes, into its statistics: counted
// over the chunks it names, so a chunk copied twice (soft recopy) counts as
// its last copy is.
void count_zero_chunks(image::Manifest& m) {
  m.statistics.zero_chunks = m.statistics.zero_bytes = 0;
  for (const auto& a : m.allocations)
    for (const auto& c : a.chunks)
      if (c.compression == image::Compression::kZero) {
        m.statistics.zero_chunks++;
        m.statistics.zero_bytes += c.raw_size;
      }
}

const char* traffic_name(PluginOptions::Traffic t) {
  switch (t) {
    case PluginOptions::Traffic::kAuto: return "auto";
    case PluginOptions::Traffic::kOrder: return "order";
    case PluginOptions::Traffic::kOff: return "off";
  }
  return "?";
}

// The copy-on-write copy's pauses for the process's own transfers.
void log_cow_traffic(const Engine::SaveJob& job, const TrafficControl& traffic) {
  const copystate::Statistics s = job.window->table.statistics();
  PHOS_INFO("process %d: the copy-on-write copy paused %llu times (%.1f ms summed over workers) for the process's "
            "%llu transfers (%.1f MiB) between host and device",
            job.vpid, (unsigned long long)traffic.pauses(), double(traffic.paused_ns()) / 1e6,
            (unsigned long long)s.transfers, double(s.transfer_bytes) / (1 << 20));
}

// Behind a staging buffer, pinned and mapped for the device: where the GPU
// checksum kernel leaves the chunk's CRC (or the copy-and-sum kernel its CRC
// and fingerprint), and the fingerprint kernel's task and result for a
// chunk copied without the bounce (queue_sum).
struct StagingTail {
  ChunkCrcTail crc;
  ChunkSumTask task;
  ChunkSumOut sum;
};

StagingTail* staging_tail(void* buffer, size_t buffer_size) {
  return reinterpret_cast<StagingTail*>(static_cast<std::byte*>(buffer) + buffer_size);
}

// The tail behind a staging buffer of `buffer_size` bytes, where the GPU
// checksum kernel leaves its result.
ChunkCrcTail* crc_tail(void* buffer, size_t buffer_size) { return &staging_tail(buffer, buffer_size)->crc; }

// The fingerprint of the chunk in `buffer`: the GPU's, from the copy-and-sum
// kernel or the fingerprint kernel, where one ran (`on_gpu`); else the CPU's.
uint64_t chunk_fingerprint(const void* buffer, size_t size, size_t buffer_size, bool& on_gpu) {
  const StagingTail* tail = staging_tail(const_cast<void*>(buffer), buffer_size);
  on_gpu = true;
  if (tail->crc.summed == kChunkSumDone) return tail->crc.fingerprint;
  if (tail->sum.done == kChunkSumDone) return tail->sum.fingerprint;
  on_gpu = false;
  return phos::fingerprint::of(buffer, size);
}

}  // namespace

EngineSettings EngineSettings::from(const PluginOptions& o) {
  return EngineSettings{o.chunk_size(),
                        o.engine_workers,
                        o.direct_io,
                        o.compression,
                        o.zstd_level,
                        o.gpu_checksums,
                        o.sparse,
                        o.traffic,
                        uint64_t(o.traffic_gbps) * 1'000'000'000ull,
                        o.cow_trust == agent::CopyTrust::kChecksum};
}

Result<std::unique_ptr<Engine>> Engine::start(const EngineSettings& settings) {
  auto cu = CudaApi::get();
  if (!cu) return cu.error();
  EngineSettings s = settings;
  // One per core, at most 16: each worker's copies into and out of the page
  // cache are what bound the write, so more workers write faster
  // (docs/benchmarks/architecture-figures.md).
  if (s.workers == 0) s.workers = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  return std::unique_ptr<Engine>(new Engine(**cu, s));
}


CUcontext Engine::context(int ordinal, Result<void>& err) {
  auto it = contexts_.find(ordinal);
  if (it != contexts_.end()) return it->second;
  CUdevice dev;
  CUcontext ctx = nullptr;
  CUresult r = cu_.cuDeviceGet(&dev, ordinal);
  if (r == CUDA_SUCCESS) r = cu_.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r != CUDA_SUCCESS) {
    err = make_error(cu_.error(("device " + std::to_string(ordinal)).c_str(), r), ENODEV);
    return nullptr;
  }
  contexts_.emplace(ordinal, ctx);
  // The checksum kernel goes with the context: workers only read the map.
  CUfunction crc = nullptr;
  if (!settings_.gpu_checksums) {
    crc_unavailable_ = "gpu_checksums is off";
  } else if (kChunkCrcImageSize == 0) {
    crc_unavailable_ = "the plugin was built without nvcc";
  } else {
    CUmodule module = nullptr;
    CUresult m = cu_.cuCtxSetCurrent(ctx);
    if (m == CUDA_SUCCESS) m = cu_.cuModuleLoadData(&module, kChunkCrcImage);
    if (m == CUDA_SUCCESS) m = cu_.cuModuleGetFunction(&crc, module, "phos_chunk_crc32c");
    if (m != CUDA_SUCCESS) {
      crc = nullptr;
      crc_unavailable_ = cu_.error(("load the checksum kernel on device " + std::to_string(ordinal)).c_str(), m);
      PHOS_WARN("%s; checksums on the CPU", crc_unavailable_.c_str());
    }
  }
  crc_functions_[ordinal] = crc;
  load_sum_kernels(ordinal, ctx);
  return ctx;
}

CUfunction Engine::crc_function(int ordinal) const {
  auto it = crc_functions_.find(ordinal);
  return it == crc_functions_.end() ? nullptr : it->second;
}

bool Engine::queue_crc(int device, CUdeviceptr data, size_t size, ChunkCrcTail* tail, CUstream stream) const {
  tail->done = 0;
  tail->summed = 0;  // this kernel takes no fingerprint: a slot's earlier one must not pass for it
  CUfunction crc = crc_function(device);
  if (!crc) return false;
  CUdeviceptr out = 0;
  unsigned long long n = size;
  void* args[] = {&data, &n, &out};
  // If either fails, the tail stays not done: the CPU checksums this one.
  return cu_.cuMemHostGetDevicePointer_v2(&out, tail, 0) == CUDA_SUCCESS &&
         cu_.cuLaunchKernel(crc, 1, 1, 1, kChunkCrcThreads, 1, 1, 0, stream, args, nullptr) == CUDA_SUCCESS;
}

void Engine::warm_up(const std::vector<int>& ordinals) {
  std::lock_guard<std::mutex> lock(run_mu_);
  // Several GPUs' contexts made at once: each takes ~150 ms on an H200 host,
  // and the driver makes them independently. (Retained here once more than
  // context() does; criu's contexts live until it exits.)
  std::vector<int> cold;
  for (int d : ordinals)
    if (!contexts_.count(d) && std::find(cold.begin(), cold.end(), d) == cold.end()) cold.push_back(d);
  if (cold.size() > 1) {
    std::vector<std::thread> makers;
    for (int d : cold)
      makers.emplace_back([this, d] {
        CUdevice dev;
        CUcontext ctx = nullptr;
        if (cu_.cuDeviceGet(&dev, d) == CUDA_SUCCESS) (void)cu_.cuDevicePrimaryCtxRetain(&ctx, dev);
      });
    for (auto& m : makers) m.join();
  }
  for (int d : ordinals) {
    Result<void> err;
    if (!context(d, err)) PHOS_WARN("engine warm-up: %s", err.error().message.c_str());
  }
}

Result<std::vector<GpuDevice>> Engine::host_gpus() {
  std::lock_guard<std::mutex> lock(host_gpus_mu_);
  if (host_gpus_) return *host_gpus_;
  int count = 0;
  PHOS_CU(cu_, cu_.cuDeviceGetCount(&count), "count GPUs");
  std::vector<GpuDevice> host;
  for (int i = 0; i < count; i++) {
    auto d = describe(i);
    if (!d) return make_error("GPU " + std::to_string(i) + ": " + d.error().message, ENODEV);
    host.push_back(std::move(*d));
  }
  host_gpus_ = host;
  return host;
}

Result<CUdeviceptr> Engine::map(CUmemGenericAllocationHandle h, size_t size, int device) {
  CUdeviceptr va = 0;
  PHOS_CU(cu_, cu_.cuMemAddressReserve(&va, size, 0, 0, 0), "reserve address range");
  CUresult r = cu_.cuMemMap(va, size, 0, h, 0);
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access = read_write(device);
    r = cu_.cuMemSetAccess(va, size, &access, 1);
    if (r != CUDA_SUCCESS) cu_.cuMemUnmap(va, size);
  }
  if (r != CUDA_SUCCESS) {
    cu_.cuMemAddressFree(va, size);
    return make_error(cu_.error("map device memory", r), EIO);
  }
  return va;
}

void Engine::unmap(CUdeviceptr va, size_t size) {
  cu_.cuMemUnmap(va, size);
  cu_.cuMemAddressFree(va, size);
}

CUresult Engine::create_exportable(CUmemGenericAllocationHandle& h, size_t bytes, int device) const {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  h = 0;
  CUresult r = cu_.cuMemCreate(&h, bytes, &prop, 0);
  if (r != CUDA_SUCCESS) h = 0;
  return r;
}

Result<UniqueFd> Engine::export_fd(CUmemGenericAllocationHandle h, const std::string& what) const {
  int fd = -1;
  PHOS_CU(cu_, cu_.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), what.c_str());
  return UniqueFd(fd);
}

Result<GpuDevice> Engine::describe(int ordinal) {
  CUdevice dev;
  PHOS_CU(cu_, cu_.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  GpuDevice d;
  d.ordinal = uint32_t(ordinal);
  char name[256] = {};
  PHOS_CU(cu_, cu_.cuDeviceGetName(name, sizeof(name), dev), "cuDeviceGetName");
  d.name = name;
  CUuuid uuid;
  PHOS_CU(cu_, cu_.cuDeviceGetUuid_v2(&uuid, dev), "cuDeviceGetUuid");
  std::memcpy(d.uuid.data(), uuid.bytes, 16);
  size_t total = 0;
  PHOS_CU(cu_, cu_.cuDeviceTotalMem_v2(&total, dev), "cuDeviceTotalMem");
  d.total_memory = total;
  int major = 0, minor = 0;
  cu_.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  cu_.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  d.compute_major = uint32_t(major);
  d.compute_minor = uint32_t(minor);
  return d;
}

// One slot of a worker's staging ring: a pinned buffer, a stream per device,
// and the piece whose DMA is in flight in it.
struct Engine::Slot {
  void* buffer = nullptr;
  size_t size = 0;    // of `buffer`
  size_t mapped = 0;  // bytes mmapped for `buffer` (registered huge pages); 0: cuMemHostAlloc
  std::map<int, size_t> bounce_size;  // of each device's bounce
  std::map<int, CUstream> streams;
  std::map<int, CUdeviceptr> bounce;  // per device, where the work asks for one (0: the GPU had no room)
  std::optional<Piece> piece;
};

Engine::Engine(const CudaApi& cu, const EngineSettings& settings)
    : cu_(cu), settings_(settings), owner_pid_(::getpid()) {}

Engine::~Engine() {
  if (::getpid() != owner_pid_) {
    // A child criu forked (a namespace's dumper) that exits through exit():
    // it has neither the ring makers' threads, which a future's destructor
    // would wait for forever, nor the CUDA state the rings hold. Left as is.
    new std::vector<std::future<void>>(std::move(rings_made_));
    return;
  }
  wait_rings();
  for (auto& ring : spare_rings_) release_ring(ring);
}

// Whether one of the workers failed.
struct Engine::Queue {
  std::atomic<bool> failed{false};
};

unsigned Engine::workers_for(size_t pieces) const {
  return unsigned(std::min<size_t>(settings_.workers, pieces));
}

Result<void> Engine::run_workers(const std::vector<Piece>& pieces, size_t buffer_size, const PieceWork& work,
                                 std::vector<uint64_t>& dma_wait_ns, unsigned workers) {
  // Contexts first, on this thread: the workers only read the map.
  for (const auto& p : pieces) {
    Result<void> err;
    if (!context(p.device, err)) return err;
  }
  std::atomic<size_t> next{0};
  NextPiece take = [&](Piece& out) {
    size_t i = next++;
    if (i >= pieces.size()) return Take::kDone;
    out = pieces[i];
    return Take::kTaken;
  };
  return run_workers(workers ? workers : workers_for(pieces.size()), take, buffer_size, work, dma_wait_ns);
}

Result<void> Engine::run_workers(unsigned n, const NextPiece& next, size_t buffer_size, const PieceWork& work,
                                 std::vector<uint64_t>& dma_wait_ns) {
  Queue queue;
  std::mutex mu;
  Error first_error;
  auto fail = [&](const Error& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!queue.failed.exchange(true)) first_error = e;
  };
  dma_wait_ns.assign(n, 0);
  wait_rings();
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < n; w++) {
    threads.emplace_back([&, w] {
      std::vector<Slot> ring = take_ring();
      bool whole = false;
      try {
        auto r = run_worker(w, ring, buffer_size, next, queue, work, dma_wait_ns[w]);
        if (!r) fail(r.error());
        // Another worker's failure ends this one's loop with pieces still
        // in flight (run_worker does not finish them then): released.
        whole = r.ok() && !queue.failed;
      } catch (const std::exception& e) {  // bad_alloc: must not end criu
        fail(make_error(std::string("engine worker: ") + e.what(), ENOMEM));
      }
      give_ring(std::move(ring), whole);
    });
  }
  for (auto& t : threads) t.join();
  if (queue.failed) return first_error;
  return {};
}

// Slot k % depth takes piece k of this worker once the piece before it in
// that slot is finished; at the end the pieces still in flight are finished,
// oldest first. With none to take now but more to come, the worker finishes
// what it has in flight (the chunks others may be waiting for) and looks
// again shortly.
Result<void> Engine::run_worker(unsigned worker, std::vector<Slot>& ring, size_t buffer_size, const NextPiece& next,
                                Queue& queue, const PieceWork& work, uint64_t& dma_wait_ns) {
  size_t k = 0;
  while (!queue.failed) {
    Piece p;
    Take taken = next(p);
    if (taken == Take::kDone) break;
    if (taken == Take::kLater) {
      bool finished = false;
      for (size_t j = 0; j < ring.size(); j++) {
        Slot& slot = ring[(k + j) % ring.size()];
        if (!slot.piece) continue;
        PHOS_TRY(finish_slot(slot, worker, work, dma_wait_ns));
        finished = true;
      }
      if (!finished) std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    Slot& slot = ring[k++ % ring.size()];
    if (slot.piece) PHOS_TRY(finish_slot(slot, worker, work, dma_wait_ns));
    PHOS_TRY(prepare_slot(slot, p.device, contexts_.at(p.device), buffer_size, work.bounce));
    auto bounce = slot.bounce.find(p.device);
    PHOS_TRY(work.start(p, slot.buffer, slot.streams.at(p.device), worker,
                        bounce == slot.bounce.end() ? CUdeviceptr(0) : bounce->second));
    slot.piece = std::move(p);
  }
  for (size_t j = 0; j < ring.size() && !queue.failed; j++) {
    Slot& slot = ring[(k + j) % ring.size()];
    if (slot.piece) PHOS_TRY(finish_slot(slot, worker, work, dma_wait_ns));
  }
  return {};
}

// A staging buffer on transparent huge pages, pinned for the GPU; nothing
// where the kernel gives none (the caller falls back to cuMemHostAlloc's
// small pages).
std::optional<std::pair<void*, size_t>> Engine::huge_staging(size_t size) const {
  constexpr size_t kHuge = 2u << 20;
  const size_t length = image::align_up(size, kHuge);
  void* raw = ::mmap(nullptr, length + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return std::nullopt;
  // 2 MiB-aligned, the slack on both sides given back.
  auto begin = image::align_up(reinterpret_cast<uintptr_t>(raw), kHuge);
  const size_t head = begin - reinterpret_cast<uintptr_t>(raw);
  if (head) ::munmap(raw, head);
  if (kHuge - head) ::munmap(reinterpret_cast<void*>(begin + length), kHuge - head);
  void* p = reinterpret_cast<void*>(begin);
  // DONTFORK: criu forks (restored tasks, scripts) while workers run; a
  // child needs no copy of DMA buffers (cuMemHostAlloc's have the same).
  if (::madvise(p, length, MADV_HUGEPAGE) != 0 || ::madvise(p, length, MADV_DONTFORK) != 0 ||
      cu_.cuMemHostRegister_v2(p, length, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP) != CUDA_SUCCESS) {
    ::munmap(p, length);
    return std::nullopt;
  }
  return std::make_pair(p, length);
}

Result<void> Engine::prepare_slot(Slot& slot, int device, CUcontext ctx, size_t buffer_size, bool bounce) {
  PHOS_CU(cu_, cu_.cuCtxSetCurrent(ctx), "engine worker: use device context");
  // Page-aligned, as O_DIRECT writes from it need; the GPU checksum of the
  // chunk in it lands in the tail (ChunkCrcTail), which the device writes.
  const size_t size = buffer_size + sizeof(StagingTail);
  if (slot.buffer && buffer_size && slot.size < size) {  // a kept ring's, too small for these chunks
    if (slot.mapped) {
      cu_.cuMemHostUnregister(slot.buffer);
      ::munmap(slot.buffer, slot.mapped);
    } else {
      cu_.cuMemFreeHost(slot.buffer);
    }
    slot.buffer = nullptr;
    slot.mapped = 0;
  }
  if (!slot.buffer && buffer_size) {  // none for device-to-device copies (a migration's)
    // Huge pages: copies both ways went faster with them than with
    // cuMemHostAlloc's pages (docs/benchmarks/architecture-figures.md).
    if (auto mapped = huge_staging(size)) {
      slot.buffer = mapped->first;
      slot.mapped = mapped->second;
    }
    if (!slot.buffer)
      PHOS_CU(cu_, cu_.cuMemHostAlloc(&slot.buffer, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
              "engine worker: allocate pinned staging buffer");
    slot.size = size;
  }
  if (slot.bounce.count(device) && bounce && buffer_size && slot.bounce_size[device] < buffer_size) {
    if (slot.bounce[device]) cu_.cuMemFree_v2(slot.bounce[device]);
    slot.bounce.erase(device);
  }
  if (!slot.streams.count(device)) {
    CUstream stream = nullptr;
    PHOS_CU(cu_, cu_.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "engine worker: create stream");
    slot.streams[device] = stream;
  }
  // Validation by checksum: the chunk is read once into criu's own memory
  // (queue_copy_sum). Without room the CPU fingerprints the staging buffer.
  if (bounce && buffer_size && !slot.bounce.count(device)) {
    CUdeviceptr b = 0;
    if (CUresult r = cu_.cuMemAlloc_v2(&b, buffer_size); r != CUDA_SUCCESS) {
      b = 0;
      if (!bounce_warned_.exchange(true))
        PHOS_WARN("%s: chunks without a bounce buffer are fingerprinted on the CPU",
                  cu_.error(("device " + std::to_string(device) + ": allocate a bounce buffer").c_str(), r).c_str());
    }
    slot.bounce[device] = b;
    slot.bounce_size[device] = buffer_size;
  }
  return {};
}

std::vector<Engine::Slot> Engine::take_ring() {
  std::lock_guard<std::mutex> lock(rings_mu_);
  if (spare_rings_.empty()) return std::vector<Slot>(kRingDepth);
  std::vector<Slot> ring = std::move(spare_rings_.back());
  spare_rings_.pop_back();
  return ring;
}

void Engine::give_ring(std::vector<Slot>&& ring, bool whole) {
  // After a failure a DMA may still be queued on a slot: released (it
  // waits). A slot with a piece would hand it to the next copy's work.
  if (!whole || std::any_of(ring.begin(), ring.end(), [](const Slot& s) { return s.piece.has_value(); }))
    return release_ring(ring);
  std::lock_guard<std::mutex> lock(rings_mu_);
  spare_rings_.push_back(std::move(ring));
}

uint64_t Engine::bounce_held(int device) {
  std::lock_guard<std::mutex> lock(rings_mu_);
  uint64_t bytes = 0;
  for (const auto& ring : spare_rings_)
    for (const Slot& slot : ring)
      if (auto b = slot.bounce.find(device); b != slot.bounce.end() && b->second) bytes += slot.bounce_size.at(device);
  return bytes;
}

void Engine::wait_rings() {
  std::vector<std::future<void>> made;
  {
    std::lock_guard<std::mutex> lock(rings_mu_);
    made.swap(rings_made_);
  }
  for (auto& f : made) f.wait();
}

Result<std::vector<std::vector<Engine::Slot>>> Engine::make_rings(const std::map<int, CUcontext>& contexts,
                                                                   size_t want, size_t buffer_size, bool bounce) {
  std::vector<std::vector<Slot>> made;
  Result<void> r;
  for (size_t w = 0; w < want && r; w++) {
    made.emplace_back(kRingDepth);
    for (Slot& slot : made.back())
      for (const auto& [device, ctx] : contexts)
        if (r) r = prepare_slot(slot, device, ctx, buffer_size, bounce);
  }
  if (!r) {
    for (auto& ring : made) release_ring(ring, contexts);
    return r.error();
  }
  return made;
}

void Engine::prepare_rings(const SaveJob& job) {
  if (job.migration || !job.workers || job.devices.empty()) return;
  make_spare_rings({job.devices.begin(), job.devices.end()}, job.workers, job.validated, true,
                   "process " + std::to_string(job.vpid), "made ahead, while criu dumps");
}

void Engine::prepare_rings(const MappedAhead& ahead, int32_t vpid) {
  size_t chunks = 0;
  for (const auto& a : ahead.allocs_) chunks += image::align_up(a.size, settings_.chunk_size) / settings_.chunk_size;
  // Bounce chunks wherever checksums validate (the default); a copy that
  // needs none leaves them unused, one that needs them and finds none
  // makes them (prepare_slot).
  make_spare_rings(ahead.devices_, workers_for(chunks), settings_.checksum, false, "process " + std::to_string(vpid),
                   "made before the gate");
}

void Engine::prepare_rings(const std::set<int>& devices, const std::string& whose, unsigned workers, bool bounce) {
  make_spare_rings(devices, workers ? workers : settings_.workers, bounce && settings_.checksum, true, whose,
                   "made before the gate, in the background");
}

unsigned Engine::workers_for_stopped(uint64_t bytes) const {
  const uint64_t chunks = (bytes + settings_.chunk_size - 1) / settings_.chunk_size;
  return unsigned(std::clamp<uint64_t>((chunks + 7) / 8, 1, std::max(1u, settings_.workers)));
}

void Engine::make_spare_rings(const std::set<int>& devices, size_t workers, bool bounce, bool in_background,
                              const std::string& whose, const char* when) {
  // The contexts, made already, looked up (never made: other targets'
  // threads read the map) on this thread; the maker only reads what it is
  // given.
  std::map<int, CUcontext> contexts;
  for (int d : devices) {
    auto it = contexts_.find(d);
    if (it == contexts_.end()) return;  // the copy makes its own staging
    contexts[d] = it->second;
  }
  if (contexts.empty() || !workers) return;
  std::lock_guard<std::mutex> lock(rings_mu_);
  if (!rings_made_.empty() || spare_rings_.size() >= workers) return;
  const size_t want = workers - spare_rings_.size(), buffer_size = settings_.chunk_size;
  auto make = [this, contexts, want, buffer_size, bounce, in_background, whose, when] {
    const uint64_t t0 = monotonic_ns();
    auto made = make_rings(contexts, want, buffer_size, bounce);
    if (!made) {  // the workers make what is missing as they start, and say what fails
      PHOS_WARN("%s: the copy's staging %s: %s; its workers make their own", whose.c_str(), when,
                made.error().message.c_str());
      return;
    }
    {
      std::unique_lock<std::mutex> held(rings_mu_, std::defer_lock);
      if (in_background) held.lock();  // else the caller holds it
      for (auto& ring : *made) spare_rings_.push_back(std::move(ring));
    }
    PHOS_INFO("%s: the copy's staging %s: %zu rings of %zu slots in %.1f ms", whose.c_str(), when, want, kRingDepth,
              double(monotonic_ns() - t0) / 1e6);
  };
  if (in_background)
    rings_made_.push_back(std::async(std::launch::async, make));
  else
    make();
}

Result<void> Engine::finish_slot(Slot& slot, unsigned worker, const PieceWork& work, uint64_t& dma_wait_ns) {
  const Piece p = *slot.piece;
  slot.piece.reset();
  PHOS_CU(cu_, cu_.cuCtxSetCurrent(contexts_.at(p.device)), "engine worker: use device context");
  uint64_t t0 = monotonic_ns();
  CUresult r = cu_.cuStreamSynchronize(slot.streams.at(p.device));
  dma_wait_ns += monotonic_ns() - t0;
  if (r != CUDA_SUCCESS)
    return make_error(cu_.error(("copy of allocation #" + std::to_string(p.allocation) + " at offset " +
                                 std::to_string(p.offset) + " on device " + std::to_string(p.device)).c_str(), r),
                      EIO);
  return work.done ? work.done(p, slot.buffer, worker) : Result<void>{};
}

void Engine::release_ring(std::vector<Slot>& ring) { release_ring(ring, contexts_); }

void Engine::release_ring(std::vector<Slot>& ring, const std::map<int, CUcontext>& contexts) {
  for (Slot& slot : ring) {
    for (auto& [device, stream] : slot.streams) {
      cu_.cuCtxSetCurrent(contexts.at(device));
      cu_.cuStreamSynchronize(stream);  // after an error a DMA may still use the buffer
      cu_.cuStreamDestroy_v2(stream);
      if (auto b = slot.bounce.find(device); b != slot.bounce.end() && b->second) cu_.cuMemFree_v2(b->second);
    }
    if (slot.buffer && slot.mapped) {
      cu_.cuMemHostUnregister(slot.buffer);
      ::munmap(slot.buffer, slot.mapped);
    } else if (slot.buffer) {
      cu_.cuMemFreeHost(slot.buffer);
    }
    slot = Slot{};
  }
}

Engine::SaveJob::~SaveJob() {
  if (engine) engine->release_sources(*this);
}

void Engine::release_sources(SaveJob& job) {
  return_pools(job);  // a program allocation waiting for the pool's memory goes on
  if (job.target_tasks) cu_.cuMemFreeHost(job.target_tasks);
  if (job.target_sums) cu_.cuMemFreeHost(job.target_sums);
  job.target_tasks = nullptr;
  job.target_sums = nullptr;
  if (job.snapshot_bases.empty()) {
    for (size_t i = 0; i < job.vas.size(); i++)
      if (job.vas[i]) unmap(job.vas[i], job.allocs[i].size);
  }
  free_snapshot(job.snapshot_bases);
  std::fill(job.vas.begin(), job.vas.end(), CUdeviceptr(0));
  // A migration's target: its fds (kept, or dropped with the job) hold it.
  if (job.migration) {
    SaveJob::Migration& mig = *job.migration;
    for (size_t i = 0; i < mig.handles.size(); i++) {
      if (mig.handles[i]) cu_.cuCtxSetCurrent(contexts_.at(mig.sink.target_of(job.devices[i])));
      if (mig.vas[i]) unmap(mig.vas[i], job.allocs[i].size);
      if (mig.handles[i]) cu_.cuMemRelease(mig.handles[i]);
    }
    mig.handles.clear();
    mig.vas.clear();
  }
}

void Engine::free_snapshot(std::map<int, CUdeviceptr>& bases) {
  for (auto& [device, base] : bases) {
    cu_.cuCtxSetCurrent(contexts_.at(device));
    cu_.cuMemFree_v2(base);
  }
  bases.clear();
}

Result<bool> Engine::snapshot(SaveJob& job) {
  std::lock_guard<std::mutex> lock(run_mu_);
  if (job.allocs.empty() || !job.snapshot_bases.empty()) return !job.snapshot_bases.empty();
  uint64_t t0 = monotonic_ns();
  // One allocation per GPU, carved up: one driver call instead of one per
  // buffer.
  constexpr uint64_t kAlign = 2ull << 20;
  std::map<int, uint64_t> need;
  for (size_t i = 0; i < job.allocs.size(); i++) need[job.devices[i]] += image::align_up(job.allocs[i].size, kAlign);
  std::map<int, CUdeviceptr> bases;
  for (auto [device, bytes] : need) {
    Result<void> err;
    CUcontext ctx = context(device, err);
    if (!ctx) {
      free_snapshot(bases);
      return err.error();
    }
    cu_.cuCtxSetCurrent(ctx);
    size_t free_bytes = 0, total = 0;
    CUresult r = cu_.cuMemGetInfo_v2(&free_bytes, &total);
    const uint64_t keep = std::max<uint64_t>(total / 20, 1ull << 30);
    if (r == CUDA_SUCCESS && free_bytes >= bytes + keep) {
      CUdeviceptr base = 0;
      r = cu_.cuMemAlloc_v2(&base, bytes);
      if (r == CUDA_SUCCESS) {
        bases[device] = base;
        continue;
      }
    }
    PHOS_INFO("process %d: no snapshot on device %d (%.1f GiB needed, %.1f GiB of %.1f free%s%s)", job.vpid, device, double(bytes) / (1 << 30),
              double(free_bytes) / (1 << 30), double(total) / (1 << 30), r == CUDA_SUCCESS ? "" : "; ",
              r == CUDA_SUCCESS ? "" : cu_.error("allocate", r).c_str());
    free_snapshot(bases);
    return false;
  }
  uint64_t t1 = monotonic_ns();
  std::map<int, CUstream> streams;
  std::map<int, uint64_t> used;
  std::vector<CUdeviceptr> copies(job.allocs.size(), 0);
  Result<void> copied;
  for (size_t i = 0; i < job.allocs.size() && copied.ok(); i++) {
    const int device = job.devices[i];
    cu_.cuCtxSetCurrent(contexts_.at(device));
    CUresult r = CUDA_SUCCESS;
    if (!streams.count(device)) r = cu_.cuStreamCreate(&streams[device], CU_STREAM_NON_BLOCKING);
    copies[i] = bases.at(device) + used[device];
    used[device] += image::align_up(job.allocs[i].size, kAlign);
    if (r == CUDA_SUCCESS) r = cu_.cuMemcpyDtoDAsync_v2(copies[i], job.vas[i], job.allocs[i].size, streams[device]);
    if (r != CUDA_SUCCESS) copied = make_error(cu_.error(("snapshot allocation " + std::to_string(job.allocs[i].id)).c_str(), r), EIO);
  }
  for (auto& [device, stream] : streams) {
    cu_.cuCtxSetCurrent(contexts_.at(device));
    CUresult r = cu_.cuStreamSynchronize(stream);
    if (r != CUDA_SUCCESS && copied.ok()) copied = make_error(cu_.error("snapshot", r), EIO);
    cu_.cuStreamDestroy_v2(stream);
  }
  if (!copied) {
    free_snapshot(bases);
    return copied.error();
  }
  for (size_t i = 0; i < job.allocs.size(); i++) {
    unmap(job.vas[i], job.allocs[i].size);
    job.vas[i] = copies[i];
  }
  job.snapshot_bases = std::move(bases);
  uint64_t t2 = monotonic_ns(), bytes = 0;
  for (const auto& a : job.allocs) bytes += a.size;
  PHOS_INFO("process %d: %.1f MiB snapshotted on the GPU in %.1f ms (allocated in %.1f ms, copied at %.0f GB/s)",
            job.vpid, double(bytes) / (1 << 20), double(t2 - t0) / 1e6, double(t1 - t0) / 1e6,
            double(bytes) / double(t2 - t1));
  return true;
}

Engine::MappedAhead& Engine::MappedAhead::operator=(MappedAhead&& o) noexcept {
  if (this != &o) {
    release();
    engine_ = o.engine_;
    allocs_ = std::move(o.allocs_);
    devices_ = std::move(o.devices_);
    vas_ = o.take();
  }
  return *this;
}

void Engine::MappedAhead::release() {
  if (engine_) {
    std::lock_guard<std::mutex> lock(engine_->run_mu_);
    for (size_t i = 0; i < vas_.size(); i++)
      if (vas_[i]) engine_->unmap(vas_[i], allocs_[i].size);
  }
  engine_ = nullptr;
  allocs_.clear();
  vas_.clear();
}

// Import an allocation's fd into criu and map it on its device.
Result<CUdeviceptr> Engine::import_and_map(const agent::Allocation& a, const UniqueFd& fd, int device) {
  Result<void> err;
  CUcontext ctx = context(device, err);
  if (!ctx || cu_.cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    return err.ok() ? make_error("cannot use device " + std::to_string(device), ENODEV) : err.error();
  CUmemGenericAllocationHandle h = 0;
  PHOS_CU(cu_, cu_.cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(intptr_t(fd.get())),
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          ("import allocation " + std::to_string(a.id)).c_str());
  auto va = map(h, a.size, device);
  cu_.cuMemRelease(h);  // the mapping keeps the memory
  return va;
}

Result<Engine::MappedAhead> Engine::map_ahead(const std::vector<agent::Allocation>& allocs,
                                              const std::vector<UniqueFd>& fds,
                                              const std::map<uint32_t, int>& host_ordinal) {
  if (fds.size() != allocs.size()) return make_error("one fd per allocation expected");
  std::lock_guard<std::mutex> lock(run_mu_);
  std::vector<CUdeviceptr> vas;
  for (size_t i = 0; i < allocs.size(); i++) {
    auto va = import_and_map(allocs[i], fds[i], host_device(host_ordinal, allocs[i].device));
    if (!va) {
      for (size_t k = 0; k < vas.size(); k++) unmap(vas[k], allocs[k].size);
      return va.error();
    }
    vas.push_back(*va);
  }
  MappedAhead out;
  out.engine_ = this;
  out.allocs_ = allocs;
  out.vas_ = std::move(vas);
  for (const auto& a : allocs) out.devices_.insert(host_device(host_ordinal, a.device));
  return out;
}

std::vector<CUdeviceptr> Engine::MappedAhead::take() {
  engine_ = nullptr;
  allocs_.clear();
  devices_.clear();
  return std::exchange(vas_, {});
}

Result<std::unique_ptr<Engine::SaveJob>> Engine::prepare_save(int dirfd, int32_t vpid,
                                                              const std::vector<agent::Allocation>& allocs,
                                                              const std::vector<UniqueFd>& fds,
                                                              const std::map<uint32_t, int>& host_ordinal,
                                                              image::Manifest& m, const MigrationSink* sink,
                                                              MappedAhead* ahead, unsigned workers) {
  if (fds.size() != allocs.size()) return make_error("one fd per allocation expected");
  std::lock_guard<std::mutex> lock(run_mu_);
  const uint32_t chunk_size = settings_.chunk_size;
  m.chunk_size = chunk_size;
  std::set<uint32_t> devices;
  for (const auto& a : allocs) devices.insert(a.device);
  for (uint32_t d : devices) {
    auto desc = describe(host_device(host_ordinal, d));
    if (!desc) return desc.error();
    desc->ordinal = d;  // the process's numbering: what its allocations and a restore's gpu_map use
    m.devices.push_back(*desc);
  }
  auto job = std::make_unique<SaveJob>();
  job->vpid = vpid;
  job->allocs = allocs;
  job->vas.assign(allocs.size(), 0);
  for (const auto& a : allocs) job->devices.push_back(host_device(host_ordinal, a.device));
  job->chunks.resize(allocs.size());
  job->manifest = &m;
  job->engine = this;
  if (sink) {
    job->migration.emplace();
    job->migration->sink = *sink;
  }
  if (sink && sink->in_place) {
    // The process's own memory is what is kept: nothing to copy, nothing to
    // map into criu (a cost of the downtime that grows with the allocations).
    for (const auto& fd : fds) {
      job->migration->fds.emplace_back(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
      if (!job->migration->fds.back().valid()) return errno_error("duplicate an allocation's fd");
    }
    return job;
  }
  if (allocs.empty()) return job;
  // Mapped ahead for these allocations: the job owns the mappings now.
  const bool taken = ahead && ahead->engine_ == this && ahead->allocs_ == allocs;
  if (taken) job->vas = ahead->take();
  for (size_t i = 0; i < allocs.size(); i++) {
    const agent::Allocation& a = allocs[i];
    const int device = job->devices[i];
    if (!taken) {
      auto va = import_and_map(a, fds[i], device);
      if (!va) return va.error();
      job->vas[i] = *va;
    }
    size_t n = size_t((a.size + chunk_size - 1) / chunk_size);
    job->chunks[i].resize(n);
    for (size_t k = 0; k < n; k++) {
      uint64_t off = uint64_t(k) * chunk_size;
      job->pieces.push_back({i, k, off, size_t(std::min<uint64_t>(chunk_size, a.size - off)), device});
    }
  }
  if (sink) {
    PHOS_TRY(create_migration_target(*job));
    // Device-to-device copies need no CPU work between them: a few streams
    // keep the copy engines busy.
    job->workers = unsigned(std::min<size_t>({job->pieces.size(), size_t(8), size_t(std::max(1u, settings_.workers))}));
    return job;
  }
  const unsigned writers = workers ? std::min(workers, workers_for(job->pieces.size())) : workers_for(job->pieces.size());
  for (uint32_t w = 0; w < writers; w++) {
    auto writer = image::DataFileWriter::create(dirfd, image::data_file_name(vpid, w), vpid, w, settings_.direct_io,
                                                settings_.sparse);
    if (!writer) return writer.error();
    job->writers.push_back(std::move(*writer));
  }
  job->workers = unsigned(job->writers.size());
  return job;
}

std::string Engine::MigrationSink::describe() const {
  if (targets.size() == 1) return "GPU " + std::to_string(targets.begin()->second);
  std::string out;
  for (auto [from, to] : targets) out += (out.empty() ? "GPUs " : ", ") + std::to_string(from) + "->" + std::to_string(to);
  return out;
}

Result<void> Engine::create_migration_target(SaveJob& job) {
  SaveJob::Migration& mig = *job.migration;
  // Each source GPU has one target (a one-to-one map): peer access is
  // decided per source.
  for (int source : std::set<int>(job.devices.begin(), job.devices.end())) {
    const int target = mig.sink.target_of(source);
    Result<void> err;
    if (!context(target, err)) return err.error();
    int can = source == target;
    if (!can && cu_.cuDeviceCanAccessPeer(&can, source, target) != CUDA_SUCCESS) can = 0;
    mig.peer[source] = can != 0;
    if (source != target)
      PHOS_INFO("process %d: migration from GPU %d to GPU %d %s", job.vpid, source, target,
                can ? "peer to peer (the source GPU maps the target's memory)"
                    : "through cuMemcpyPeerAsync (no peer access between them)");
  }
  mig.handles.assign(job.allocs.size(), 0);
  mig.vas.assign(job.allocs.size(), 0);
  for (size_t i = 0; i < job.allocs.size(); i++) {
    const agent::Allocation& a = job.allocs[i];
    const int source = job.devices[i], target = mig.sink.target_of(source);
    PHOS_CU(cu_, cu_.cuCtxSetCurrent(contexts_.at(target)), "use the migration's target GPU");
    if (CUresult r = create_exportable(mig.handles[i], a.size, target); r != CUDA_SUCCESS)
      return make_error(cu_.error(("GPU " + std::to_string(target) + ": allocate " + std::to_string(a.size) +
                                   " bytes for allocation " + std::to_string(a.id) + " (migration target)").c_str(), r),
                        ENOMEM);
    auto fd = export_fd(mig.handles[i], "export the migration's copy of allocation " + std::to_string(a.id));
    if (!fd) return fd.error();
    mig.fds.push_back(std::move(*fd));
    auto va = map(mig.handles[i], a.size, target);
    if (!va) return va.error();
    mig.vas[i] = *va;
    if (source != target && mig.peer[source]) {
      CUmemAccessDesc access = read_write(source);
      PHOS_CU(cu_, cu_.cuMemSetAccess(mig.vas[i], a.size, &access, 1),
              ("give GPU " + std::to_string(source) + " access to the migration's target memory").c_str());
    }
  }
  return {};
}

std::vector<UniqueFd> Engine::take_kept(SaveJob& job) {
  if (!job.migration) return {};
  return std::move(job.migration->fds);
}

size_t Engine::staging_size(const SaveJob& job) const { return job.migration ? 0 : settings_.chunk_size; }

Engine::PieceWork Engine::migrate_work(SaveJob& job) {
  PieceWork work;
  const bool fail_copy = fault("fail-migration-copy");  // read once, not per chunk
  work.start = [this, &job, fail_copy](const Piece& p, void*, CUstream stream, unsigned, CUdeviceptr) -> Result<void> {
    const SaveJob::Migration& mig = *job.migration;
    const CUdeviceptr src = job.vas[p.allocation] + p.offset;
    const CUdeviceptr dst = mig.vas[p.allocation] + p.offset;
    // Named only when something fails.
    const int target = mig.sink.target_of(p.device);
    auto what = [&] {
      return "copy allocation " + std::to_string(job.allocs[p.allocation].id) + " to GPU " + std::to_string(target);
    };
    if (fail_copy && job.chunk_copies >= 1)
      return make_error(what() + ": fault injection (PHOS_FAULT): the target GPU fails", EIO);
    if (mig.peer.at(p.device)) {
      PHOS_CU(cu_, cu_.cuMemcpyDtoDAsync_v2(dst, src, p.size, stream), what().c_str());
    } else {
      PHOS_CU(cu_, cu_.cuMemcpyPeerAsync(dst, contexts_.at(target), src, contexts_.at(p.device), p.size, stream),
              what().c_str());
    }
    // Validation by checksum: the copy on the target, fingerprinted after it
    // on the same stream, where this GPU reads the target's memory (without
    // peer access the chunk has no fingerprint: the final pass copies it
    // again, as it would a changed one).
    if (job.target_sums && p.claim && mig.peer.at(p.device)) {
      job.target_tasks[p.claim->chunk] = ChunkSumTask{dst, p.size};
      (void)queue_sum(p.device, &job.target_tasks[p.claim->chunk], &job.target_sums[p.claim->chunk], stream);
    }
    return {};
  };
  work.done = [this, &job](const Piece& p, void*, unsigned) -> Result<void> {
    if (p.claim && job.target_sums) {
      const ChunkSumOut& out = job.target_sums[p.claim->chunk];
      if (out.done == kChunkSumDone) {
        PHOS_TRY(check_copy(job, p, out.fingerprint));
      } else if (job.checked) {
        job.sum_checked++;  // copied with the process stopped: exact by construction, unchecked without a sum
      }
    }
    if (p.claim) job.window->table.copied(*p.claim);
    job.chunk_copies++;
    return {};
  };
  return work;
}

uint64_t Engine::pool_need(const SaveJob& job, int device) const {
  uint64_t bytes = 0;
  for (size_t i = 0; i < job.allocs.size(); i++)
    if (job.devices[i] == device) bytes += image::align_up(job.allocs[i].size, settings_.chunk_size);
  return bytes;
}

Result<Engine::Pool> Engine::make_pool(SaveJob& job, int device, std::optional<uint64_t> pool_bytes,
                                       const PoolPeers* peers) {
  const uint64_t chunk = settings_.chunk_size;
  cu_.cuCtxSetCurrent(contexts_.at(device));
  size_t free_bytes = 0, total = 0;
  if (CUresult r = cu_.cuMemGetInfo_v2(&free_bytes, &total); r != CUDA_SUCCESS)
    return make_error(cu_.error("copy-on-write: free device memory", r), EIO);
  PoolRequest q{.automatic = !pool_bytes, .wanted = pool_bytes.value_or(0), .free_bytes = free_bytes,
                .total_bytes = total, .chunk = chunk};
  // Validation by checksum: a bounce chunk per slot of every worker's ring
  // comes before the pool (prepare_slot).
  // Those of rings made ahead are allocated already: out of free_bytes.
  if (settings_.checksum) {
    const uint64_t held = bounce_held(device);
    q.extra_keep = std::max<uint64_t>(uint64_t(job.workers) * kRingDepth * chunk, held) - held;
  }
  q.process_bytes = pool_need(job, device);
  if (q.automatic && peers && peers->processes > 1) {
    // The split is of the free memory before the first of the dump's pools
    // there: a later process would otherwise split what the earlier ones
    // left (run_mu_ orders the pools).
    auto [first, fresh] = split_free_.try_emplace(device, free_bytes);
    q.free_bytes = first->second;
    if (!fresh) q.free_now = free_bytes;
    q.dump_bytes = std::max(peers->bytes, q.process_bytes);
    q.processes = peers->processes;
  }
  const PoolSize sized = size_pool(q);
  PHOS_INFO("process %d: copy-on-write pool on GPU %d: %s", job.vpid, device, describe_pool_size(q, sized).c_str());
  Pool pool;
  const uint64_t slots = sized.slots;
  if (!slots) return pool;
  constexpr uint64_t kGranule = 2ull << 20;
  const uint64_t bytes = image::align_up(slots * chunk, kGranule);
  CUmemGenericAllocationHandle h = 0;
  if (CUresult r = create_exportable(h, bytes, device); r != CUDA_SUCCESS) {
    PHOS_WARN("process %d: no copy-on-write pool (%s): writes to memory not yet copied wait for the engine",
              job.vpid, cu_.error("allocate", r).c_str());
    return pool;
  }
  auto fd = export_fd(h, "copy-on-write: export the pool");
  auto va = fd ? map(h, bytes, device) : Result<CUdeviceptr>(fd.error());
  cu_.cuMemRelease(h);  // the mapping and the fd keep it
  if (!va) return va.error();
  pool.fd = std::move(*fd);
  pool.va = *va;
  pool.bytes = bytes;
  pool.slots = uint32_t(slots);
  return pool;
}

Result<void> Engine::make_pools(SaveJob& job, const std::set<int>& devices, std::optional<uint64_t> pool_bytes,
                               const std::map<int, PoolPeers>& peers, std::vector<UniqueFd>& fds) {
  uint32_t first = 0;
  for (int d : devices) {
    auto p = peers.find(d);
    auto made = make_pool(job, d, pool_bytes, p == peers.end() ? nullptr : &p->second);
    if (!made) {
      unmap_pools(job);
      fds.clear();
      return made.error();
    }
    if (!made->slots) continue;  // this GPU's chunks go to the engine before a write
    // The process names the GPU by its own ordinal.
    uint32_t ordinal = 0;
    for (size_t i = 0; i < job.allocs.size(); i++)
      if (job.devices[i] == d) ordinal = job.allocs[i].device;
    job.pools.push_back({.device = d,
                         .ordinal = ordinal,
                         .va = made->va,
                         .bytes = made->bytes,
                         .first_slot = first,
                         .slots = made->slots});
    fds.push_back(std::move(made->fd));
    first += made->slots;
  }
  return {};
}

void Engine::unmap_pools(SaveJob& job) {
  for (const SaveJob::PoolMapping& p : job.pools) {
    cu_.cuCtxSetCurrent(contexts_.at(p.device));
    unmap(p.va, p.bytes);
  }
  job.pools.clear();
}

// The pools unmapped, their exported fds closed (each keeps the memory
// too), and the table told, which wakes a program allocation waiting.
void Engine::return_pools(SaveJob& job) {
  unmap_pools(job);
  if (!job.window) return;
  job.window->pool_fds.clear();
  job.window->table.pool_given_back();
}

void Engine::give_pool_back(SaveJob& job) {
  copystate::CopyState& table = job.window->table;
  // A slot still holds a chunk: the engine takes those first (claim_saved),
  // so this comes soon. Only one worker lets the pools go.
  if (table.pool_in_use() || job.pool_returned.exchange(true)) return;
  uint64_t bytes = 0;
  for (const SaveJob::PoolMapping& p : job.pools) bytes += p.bytes;
  return_pools(job);
  PHOS_INFO("process %d: copy-on-write pool given back (%.1f MiB): an allocation of the program found its GPU full; "
            "its writes to chunks not yet copied now wait for the engine",
            job.vpid, double(bytes) / (1 << 20));
}

CUdeviceptr Engine::pool_address(const SaveJob& job, uint32_t slot, uint64_t chunk_size) {
  for (const SaveJob::PoolMapping& p : job.pools)
    if (slot >= p.first_slot && slot - p.first_slot < p.slots) return p.va + uint64_t(slot - p.first_slot) * chunk_size;
  return 0;  // not reached: the table's slots are the pools' (copy_state checks a slot against its count)
}

Result<Engine::CopyWindow*> Engine::open_window(SaveJob& job, CopyProtocol protocol,
                                                std::optional<uint64_t> pool_bytes,
                                                const std::map<int, PoolPeers>& peers) {
  std::lock_guard<std::mutex> lock(run_mu_);
  if (job.window) return &*job.window;
  const bool recopy = protocol == CopyProtocol::kSoftRecopy;
  const char* what = recopy ? "soft recopy" : "copy-on-write";
  if (job.allocs.empty()) return make_error(std::string(what) + ": no device memory to copy", EINVAL);
  const std::set<int> devices(job.devices.begin(), job.devices.end());
  for (int d : devices) {
    Result<void> err;
    if (!context(d, err)) return err.error();
  }
  // Copy-on-write: a pool on each GPU, so that a chunk is saved device to
  // device on its own GPU. Recopy has no pool: each of its chunks is read
  // from the process's memory, on whichever GPU.
  std::vector<UniqueFd> fds;
  if (!recopy) PHOS_TRY(make_pools(job, devices, pool_bytes, peers, fds));
  uint64_t slots = 0;
  for (const auto& p : job.pools) slots += p.slots;
  const uint64_t chunk = settings_.chunk_size;
  std::vector<copystate::Region> regions;
  for (const auto& a : job.allocs) regions.push_back({.id = a.id, .address = a.address, .size = a.size});
  auto table = copystate::CopyState::create(protocol, chunk, regions, uint32_t(slots));
  if (!table) {
    unmap_pools(job);
    return table.error();
  }
  job.region_allocation.clear();
  for (const auto& r : table->regions())
    for (size_t i = 0; i < job.allocs.size(); i++)
      if (job.allocs[i].id == r.id) job.region_allocation.push_back(i);
  job.window.emplace(CopyWindow{std::move(*table), {}, std::move(fds), 0});
  for (const SaveJob::PoolMapping& p : job.pools) {
    job.window->pools.push_back({.device = p.ordinal, .bytes = p.bytes, .slots = p.slots});
    job.window->pool_bytes += p.bytes;
  }
  // Before the process maps the table: a write to dead memory saves nothing.
  mark_dead_copied(job);
  copystate::CopyState* opened = &job.window->table;
  opened->set_transfer_rate(settings_.traffic_bytes_per_second);
  opened->set_cold_first(recopy && settings_.traffic != PluginOptions::Traffic::kOff);
  // Recopy validated: each copy's fingerprint kept for the final pass.
  // Copy-on-write's copies are validated once the freeze is summed.
  job.validated = recopy && settings_.checksum;
  if (job.validated) job.image_sums = sum_check::ChunkSums(opened->chunk_count());
  PHOS_INFO("process %d: %s window over %.1f MiB in %llu chunks of %llu KiB, on %zu GPU%s; %s", job.vpid, what,
            double(job.window->table.chunk_count() * chunk) / (1 << 20),
            (unsigned long long)job.window->table.chunk_count(), (unsigned long long)(chunk >> 10), devices.size(),
            devices.size() == 1 ? "" : "s", recopy ? "no pool" : describe_pools(job, devices.size()).c_str());
  return &*job.window;
}

std::string Engine::describe_pools(const SaveJob& job, size_t gpus) const {
  if (job.pools.empty()) return "no pool (a write to a chunk not yet copied waits for the engine)";
  std::string out = job.pools.size() == gpus && gpus > 1 ? "a pool per GPU" : "a pool";
  for (const SaveJob::PoolMapping& p : job.pools) {
    char one[96];
    std::snprintf(one, sizeof(one), "%s GPU %d: %u slots (%.1f MiB)", &p == &job.pools.front() ? ":" : ";", p.device,
                  p.slots, double(p.bytes) / (1 << 20));
    out += one;
  }
  if (job.pools.size() < gpus)
    out += "; no room for one on the other GPUs (a write there to a chunk not yet copied waits for the engine)";
  return out;
}

bool Engine::is_dead(const SaveJob& job, size_t allocation, size_t chunk) {
  return allocation < job.dead.size() && chunk < job.dead[allocation].size() && job.dead[allocation][chunk];
}

void Engine::set_dead(SaveJob& job, const std::vector<dead::Range>& ranges) {
  job.dead.assign(job.allocs.size(), {});
  job.dead_chunks = job.dead_bytes = 0;
  if (ranges.empty()) return;
  if (job.migration) {
    PHOS_INFO("process %d: %zu dead ranges from its iteration boundary not used: a migration keeps all its memory",
              job.vpid, ranges.size());
    return;
  }
  const std::vector<dead::Range> merged = dead::normalized(ranges);
  uint64_t handed = 0;
  for (const auto& r : merged) handed += r.size;
  const uint64_t chunk = settings_.chunk_size;
  for (size_t i = 0; i < job.allocs.size(); i++) {
    const agent::Allocation& a = job.allocs[i];
    job.dead[i] = dead::dead_chunks(a.address, a.size, chunk, merged);
    for (size_t k = 0; k < job.dead[i].size(); k++)
      if (job.dead[i][k]) {
        job.dead_chunks++;
        job.dead_bytes += std::min<uint64_t>(chunk, a.size - uint64_t(k) * chunk);
      }
  }
  std::erase_if(job.pieces, [&](const Piece& p) { return is_dead(job, p.allocation, p.chunk); });
  if (job.window) mark_dead_copied(job);  // soft recopy's, open since its first pass
  PHOS_INFO("process %d: %zu free ranges of its allocator at its iteration boundary (%.1f MiB): %llu whole chunks "
            "(%.1f MiB) dead, not stored",
            job.vpid, merged.size(), double(handed) / (1 << 20), (unsigned long long)job.dead_chunks,
            double(job.dead_bytes) / (1 << 20));
}

void Engine::mark_dead_copied(SaveJob& job) {
  if (!job.window || !job.dead_chunks) return;
  copystate::CopyState& table = job.window->table;
  for (uint64_t c = 0; c < table.chunk_count(); c++) {
    if (!window_chunk_dead(job, c)) continue;
    // Recopy: one copied by the first pass stays so; finish_save records it dead all the same.
    if (auto claim = table.claim(c)) table.copied(*claim);
  }
}

bool Engine::window_chunk_dead(const SaveJob& job, uint64_t chunk) const {
  if (!job.window || !job.dead_chunks) return false;
  const copystate::Claim at = job.window->table.locate(chunk);
  return is_dead(job, job.region_allocation.at(at.region), size_t(at.offset / settings_.chunk_size));
}

Engine::Piece Engine::piece_of(const SaveJob& job, const copystate::Claim& claim) const {
  const size_t a = job.region_allocation.at(claim.region);
  return Piece{a, size_t(claim.offset / settings_.chunk_size), claim.offset, size_t(claim.bytes), job.devices[a], claim};
}

Engine::Take Engine::next_claim(SaveJob& job, TrafficControl& traffic, Piece& out) {
  copystate::CopyState& table = job.window->table;
  if (table.pool_back() == copystate::PoolBack::kAsked) give_pool_back(job);
  // A chunk a call waits for goes at once; the pause is for the others.
  auto claim = table.claim_urgent();
  if (!claim) {
    if (fault("slow-copy")) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    traffic.before_claim(UINT64_MAX);
    claim = table.claim_next();
  }
  if (!claim) {
    if (table.window() != copystate::Window::kOpen) return Take::kDone;  // given up: run_save says so
    return table.all_copied() ? Take::kDone : Take::kLater;
  }
  out = piece_of(job, *claim);
  return Take::kTaken;
}

void Engine::set_parent(SaveJob& job, image::ParentIndex parent) { job.parent = std::move(parent); }

void Engine::close_window(SaveJob& job, bool copied) {
  if (!job.window) return;
  job.window->table.close(copied ? copystate::Window::kClosed : copystate::Window::kAborted);
}

Engine::PieceWork Engine::save_work(SaveJob& job) {
  PieceWork work;
  work.bounce = job.validated;
  work.start = [this, &job](const Piece& p, void* buffer, CUstream stream, unsigned, CUdeviceptr bounce) -> Result<void> {
    // Copy-on-write: a chunk written since the freeze waits in its pool slot.
    // The slot is on the chunk's GPU (p.device): the hooks save a chunk
    // into the pool of its own GPU.
    CUdeviceptr src = p.claim && p.claim->pool_slot ? pool_address(job, *p.claim->pool_slot, settings_.chunk_size)
                                                    : job.vas[p.allocation] + p.offset;
    const std::string what = "copy allocation " + std::to_string(job.allocs[p.allocation].id) + " to host";
    StagingTail* staged = staging_tail(buffer, settings_.chunk_size);
    ChunkCrcTail* tail = &staged->crc;
    staged->sum.done = 0;  // a fingerprint of this slot's last chunk must not pass for this one's
    // Validated: one read of the chunk into the bounce, its sums from the
    // bytes copied; the DMA reads the bounce, which nothing else writes.
    if (job.validated && p.claim && queue_copy_sum(p.device, src, bounce, p.size, tail, stream)) {
      PHOS_CU(cu_, cu_.cuMemcpyDtoHAsync_v2(buffer, bounce, p.size, stream), what.c_str());
      return {};
    }
    // On the same stream, before the copy: all three only read the chunk.
    // Every chunk's fingerprint goes into the image, for a later incremental
    // dump to compare against (parent_index.h).
    (void)queue_crc(p.device, src, p.size, tail, stream);
    staged->task = ChunkSumTask{src, p.size};
    (void)queue_sum(p.device, &staged->task, &staged->sum, stream);
    PHOS_CU(cu_, cu_.cuMemcpyDtoHAsync_v2(buffer, src, p.size, stream), what.c_str());
    return {};
  };
  work.done = [this, &job](const Piece& p, void* buffer, unsigned worker) -> Result<void> {
    const ChunkCrcTail* tail = crc_tail(buffer, settings_.chunk_size);
    // The fingerprint of the bytes in the staging buffer, which go into the
    // image (the GPU's where it took one). Validated: checked against the
    // freeze's.
    bool on_gpu = false;
    const uint64_t fingerprint = chunk_fingerprint(buffer, p.size, settings_.chunk_size, on_gpu);
    if (on_gpu) job.gpu_fingerprinted++;
    if (job.validated && p.claim) PHOS_TRY(check_copy(job, p, fingerprint));
    // On the host now: the process may write the chunk, its slot is free.
    if (p.claim) job.window->table.copied(*p.claim);
    std::optional<image::ChunkSum> sum;
    job.chunk_copies++;
    if (tail->done == kChunkCrcDone) {
      sum = image::ChunkSum{tail->crc, tail->zero != 0};
      job.gpu_checksummed++;
    }
    // Incremental: unchanged since the parent image, which holds it.
    if (!job.parent.empty()) {
      const uint32_t crc = sum ? sum->crc32c : phos::crc32c(std::span(static_cast<const std::byte*>(buffer), p.size));
      if (job.parent.unchanged(job.allocs[p.allocation].id, p.offset, {uint32_t(p.size), crc, fingerprint})) {
        job.chunks[p.allocation][p.chunk] = image::Chunk{.alloc_offset = p.offset,
                                                         .raw_size = uint32_t(p.size),
                                                         .crc32c = crc,
                                                         .compression = image::Compression::kParent,
                                                         .fingerprint = fingerprint};
        job.parent_chunks++;
        return {};
      }
    }
    // A chunk copied again (soft recopy) is written again: the manifest
    // names its last copy, zero or not; a first copy with data stays in the
    // file, unreferenced.
    auto chunk = job.writers[worker]->write_chunk(p.offset, std::span(static_cast<const std::byte*>(buffer), p.size),
                                                  settings_.compression, settings_.zstd_level, sum);
    if (!chunk) return chunk.error();
    chunk->fingerprint = fingerprint;
    job.chunks[p.allocation][p.chunk] = *chunk;
    return {};
  };
  return work;
}

Result<Engine::FirstPass> Engine::run_first_pass(SaveJob& job, uint64_t deadline_ns) {
  if (!job.window || job.window->table.protocol() != CopyProtocol::kSoftRecopy)
    return make_error("soft recopy: the job has no recopy window", EINVAL);
  std::lock_guard<std::mutex> lock(run_mu_);
  copystate::CopyState& table = job.window->table;
  std::atomic<uint64_t> taken{0}, bytes{0};
  std::atomic<bool> stopped{false};
  TrafficControl traffic(table, settings_.traffic == PluginOptions::Traffic::kAuto);
  // The clean chunks, in order (cold regions first, claim_next); a chunk
  // the process dirties meanwhile is skipped (copied once, at the end) or
  // copied now and again at the end.
  const bool slow = fault("slow-copy");
  NextPiece next = [&](Piece& p) {
    if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (monotonic_ns() < deadline_ns) traffic.before_claim(deadline_ns);
    if (monotonic_ns() >= deadline_ns) {
      stopped = true;
      return Take::kDone;
    }
    auto claim = table.claim_next();
    if (!claim) return Take::kDone;
    p = piece_of(job, *claim);
    taken++;
    bytes += claim->bytes;
    return Take::kTaken;
  };
  PHOS_TRY(prepare_target_sums(job));
  const uint64_t t0 = monotonic_ns();
  std::vector<uint64_t> dma_wait_ns;
  PHOS_TRY(run_workers(job.workers, next, staging_size(job), job.migration ? migrate_work(job) : save_work(job),
                       dma_wait_ns));
  FirstPass pass{bytes.load(), monotonic_ns() - t0, !stopped, traffic.pauses(), traffic.paused_ns()};
  job.first_pass_chunks = taken;
  job.traffic_pauses += pass.pauses;
  job.traffic_paused_ns += pass.paused_ns;
  const copystate::Statistics s = table.statistics();
  PHOS_INFO("process %d: soft recopy's first pass copied %llu chunks (%.1f MiB) in %.1f ms while the process ran "
            "(%.2f GB/s)%s; %llu of %llu chunks written meanwhile, %llu of them after their copy; paused %llu times "
            "(%.1f ms summed over workers) for the process's %llu transfers (%.1f MiB) between host and device "
            "(traffic=%s)",
            job.vpid, (unsigned long long)taken.load(), double(pass.bytes) / (1 << 20), double(pass.ns) / 1e6,
            double(pass.bytes) / double(pass.ns ? pass.ns : 1), pass.whole ? "" : ", stopped by its time limit",
            (unsigned long long)table.dirty_count(), (unsigned long long)table.chunk_count(),
            (unsigned long long)table.copied_dirty_count(), (unsigned long long)pass.pauses,
            double(pass.paused_ns) / 1e6, (unsigned long long)s.transfers, double(s.transfer_bytes) / (1 << 20),
            traffic_name(settings_.traffic));
  return pass;
}

Result<Engine::StoppedPass> Engine::copy_stopped(SaveJob& job, const std::set<uint64_t>& ids,
                                                 const std::atomic<bool>& stop) {
  if (!job.window || job.window->table.protocol() != CopyProtocol::kSoftCopyOnWrite)
    return make_error("copy-on-write: the job has no copy-on-write window", EINVAL);
  std::lock_guard<std::mutex> lock(run_mu_);
  copystate::CopyState& table = job.window->table;
  const std::vector<uint64_t> chunks = table.region_chunks(ids);
  std::atomic<size_t> cursor{0};
  std::atomic<uint64_t> taken{0}, bytes{0};
  // A chunk not pending (dead, taken as copied) is left as it is.
  NextPiece next = [&](Piece& p) {
    for (size_t i; !stop && (i = cursor.fetch_add(1)) < chunks.size();)
      if (auto claim = table.claim(chunks[i])) {
        p = piece_of(job, *claim);
        taken++;
        bytes += claim->bytes;
        return Take::kTaken;
      }
    return Take::kDone;
  };
  const uint64_t t0 = monotonic_ns();
  std::vector<uint64_t> dma_wait_ns;
  // A copy that differs from the freeze names its chunks, as run_save's do.
  auto copied = run_workers(job.workers, next, staging_size(job), save_work(job), dma_wait_ns);
  if (!copied && job.misses.count()) return misses_error(job);
  PHOS_TRY(copied);
  if (stop) return make_error("copy-on-write: the dump failed before its stopped copy was done", ECANCELED);
  StoppedPass pass{taken.load(), bytes.load(), monotonic_ns() - t0};
  PHOS_INFO("process %d: %llu chunks (%.1f MiB) of %zu allocation(s) other processes map through CUDA IPC copied "
            "while they are stopped, in %.1f ms (%.2f GB/s); its copy-on-write window leaves them alone",
            job.vpid, (unsigned long long)pass.chunks, double(pass.bytes) / (1 << 20), ids.size(),
            double(pass.ns) / 1e6, double(pass.bytes) / double(pass.ns ? pass.ns : 1));
  return pass;
}

void Engine::discard_save(int dirfd, std::unique_ptr<SaveJob> job) {
  if (!job) return;
  std::vector<std::string> names;
  for (const auto& w : job->writers) names.push_back(w->name());
  job.reset();  // mappings released, files closed
  for (const auto& name : names)
    if (::unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT)
      PHOS_WARN("remove %s: %s", name.c_str(), std::strerror(errno));
}

Result<void> Engine::run_save(SaveJob& job) {
  if (job.allocs.empty()) return {};
  std::lock_guard<std::mutex> lock(run_mu_);
  const PieceWork work = job.migration ? migrate_work(job) : save_work(job);
  const size_t buffer_size = staging_size(job);
  uint64_t t0 = monotonic_ns();
  std::vector<uint64_t> dma_wait_ns;
  Result<void> copied;
  if (job.window && job.window->table.protocol() == CopyProtocol::kSoftRecopy) {
    // The gate is closed and the process drained: what the first pass left,
    // then what the process wrote after it was copied: by checksum, every
    // chunk whose content changed since its copy (plan_final_pass), else
    // the dirty ones.
    copystate::CopyState& table = job.window->table;
    std::atomic<uint64_t> recopied{0};
    std::optional<sum_check::FinalPass> plan;
    if (job.validated) {
      auto planned = plan_final_pass(job);
      if (planned) {
        plan = std::move(*planned);
      } else {
        // The hooks counted untrusted calls instead of marking: without
        // fingerprints, every chunk is copied again.
        PHOS_WARN("process %d: soft recopy's final pass: %s; every chunk is copied again", job.vpid,
                  planned.error().message.c_str());
        table.mark_all_dirty();
      }
    }
    std::atomic<size_t> cursor{0};
    NextPiece next = [&](Piece& p) {
      std::optional<copystate::Claim> claim;
      if (plan) {
        for (size_t i; !claim && (i = cursor.fetch_add(1)) < plan->copy.size();) {
          const uint64_t c = plan->copy[i];
          const bool again = table.state(c) == copystate::ChunkState::kCopied;
          claim = again ? table.claim_again(c) : table.claim(c);
          if (claim && again) recopied++;
        }
      } else {
        claim = table.claim_next();
        if (!claim && (claim = table.claim_dirty())) recopied++;
      }
      if (!claim) return Take::kDone;
      p = piece_of(job, *claim);
      return Take::kTaken;
    };
    copied = run_workers(job.workers, next, buffer_size, work, dma_wait_ns);
    job.recopied_chunks = recopied;
    if (!copied && job.misses.count()) copied = misses_error(job);
    if (copied && !table.all_copied()) copied = make_error("soft recopy: chunks left uncopied after the final pass", EIO);
    close_window(job, copied.ok());
  } else if (job.window) {
    Result<void> err;
    if (!context(job.devices.front(), err)) copied = err;
    TrafficControl traffic(job.window->table, settings_.traffic == PluginOptions::Traffic::kAuto);
    NextPiece next = [&](Piece& p) { return next_claim(job, traffic, p); };
    if (copied) copied = run_workers(job.workers, next, buffer_size, work, dma_wait_ns);
    // A copy that differed from the freeze: the image is refused, saying
    // which chunks (the first error names only the first).
    if (!copied && job.misses.count()) copied = misses_error(job);
    job.traffic_pauses += traffic.pauses();
    job.traffic_paused_ns += traffic.paused_ns();
    log_cow_traffic(job, traffic);
    if (copied && job.checked)
      PHOS_INFO("process %d: checksum: %llu chunks equal to the freeze (T0: %.1f GiB in %.1f ms)", job.vpid,
                (unsigned long long)job.sum_checked.load(),
                double(job.window->table.chunk_count() * settings_.chunk_size) / double(1ull << 30),
                double(job.sum_pass_ns) / 1e6);
    if (copied && !job.window->table.all_copied())
      copied = make_error("the process gave up the copy-on-write window (the agent says why when it closes)",
                          ECANCELED);
    close_window(job, copied.ok());
  } else if (!job.pieces.empty()) {
    copied = run_workers(job.pieces, buffer_size, work, dma_wait_ns, job.workers);
  }
  uint64_t elapsed = monotonic_ns() - t0;
  release_sources(job);
  PHOS_TRY(copied);
  if (!job.migration && job.gpu_checksummed == job.chunk_copies)  // a migration checksums and writes nothing
    PHOS_INFO("process %d: every chunk's CRC-32C computed on the GPU", job.vpid);
  else if (!job.migration)
    PHOS_INFO("process %d: %llu of %llu chunk copies' CRC-32C computed on the GPU (the rest on the CPU%s%s)", job.vpid,
              (unsigned long long)job.gpu_checksummed.load(), (unsigned long long)job.chunk_copies.load(),
              crc_unavailable_.empty() ? "" : ": ", crc_unavailable_.c_str());
  if (!job.migration && job.gpu_fingerprinted == job.chunk_copies)
    PHOS_INFO("process %d: every chunk's fingerprint taken on the GPU", job.vpid);
  else if (!job.migration)
    PHOS_INFO("process %d: %llu of %llu chunk copies' fingerprints taken on the GPU (the rest on the CPU%s%s)",
              job.vpid, (unsigned long long)job.gpu_fingerprinted.load(), (unsigned long long)job.chunk_copies.load(),
              sum_unavailable_.empty() ? "" : ": ", sum_unavailable_.c_str());
  return finish_save(job, elapsed, dma_wait_ns);
}

Result<void> Engine::finish_save(SaveJob& job, uint64_t elapsed_ns, const std::vector<uint64_t>& dma_wait_ns) {
  image::Manifest& m = *job.manifest;
  image::Statistics& s = m.statistics;
  image::ChunkTimes times;
  std::string why_buffered;
  s.direct_io = true;
  for (auto& writer : job.writers) {
    times += writer->times();
    if (!writer->direct() && why_buffered.empty()) why_buffered = writer->why_buffered();
    s.direct_io = s.direct_io && writer->direct();
    auto file = writer->finish();
    if (!file) return file.error();
    s.stored_bytes += file->size;
    m.data_files.push_back(*file);
  }
  for (size_t i = 0; i < job.allocs.size(); i++) {
    const agent::Allocation& a = job.allocs[i];
    // Dead: no part of the image, whatever a copy window copied of it.
    for (size_t k = 0; !job.migration && k < job.chunks[i].size(); k++)
      if (is_dead(job, i, k))
        job.chunks[i][k] = image::Chunk{.alloc_offset = uint64_t(k) * m.chunk_size,
                                        .raw_size = uint32_t(std::min<uint64_t>(m.chunk_size, a.size - uint64_t(k) * m.chunk_size)),
                                        .compression = image::Compression::kDead};
    // A migration's data is in device memory, not in chunks of the image.
    m.allocations.push_back(image::Allocation{a, job.migration ? std::vector<image::Chunk>{} : std::move(job.chunks[i])});
    s.raw_bytes += a.size;
  }
  count_zero_chunks(m);
  s.copy_ns = elapsed_ns;
  s.workers = job.workers;
  for (uint64_t ns : dma_wait_ns) s.dma_wait_ns += ns;
  s.checksum_ns = times.checksum_ns;
  s.compress_ns = times.compress_ns;
  s.write_ns = times.io_ns;
  s.traffic_pauses = job.traffic_pauses;
  s.traffic_paused_ns = job.traffic_paused_ns;
  s.sum_pass_ns = job.sum_pass_ns;
  s.sum_checked_chunks = job.sum_checked;
  s.sum_missed_chunks = job.sum_missed;
  s.sum_unchanged_dirty_chunks = job.sum_unchanged_dirty;
  if (job.window) {
    const copystate::Statistics t = job.window->table.statistics();
    s.program_transfers = t.transfers;
    s.program_transfer_bytes = t.transfer_bytes;
  }
  if (job.window && job.window->table.protocol() == CopyProtocol::kSoftRecopy)
    PHOS_INFO("process %d: soft recopy's final pass copied %llu chunks (%llu of them again) in %.1f ms", job.vpid,
              (unsigned long long)(job.chunk_copies - job.first_pass_chunks),
              (unsigned long long)job.recopied_chunks, double(elapsed_ns) / 1e6);
  if (job.migration) {
    const SaveJob::Migration& mig = *job.migration;
    if (mig.sink.in_place)
      PHOS_INFO("process %d: %zu allocations, %.1f MiB kept in place on %s for the restore (migration, no copy)",
                job.vpid, job.allocs.size(), double(s.raw_bytes) / (1 << 20), mig.sink.describe().c_str());
    else if (job.window)  // soft recopy: most of it moved while the process ran
      PHOS_INFO("process %d: %zu allocations, %.1f MiB moved to %s (%llu chunk copies in all, %u workers; the "
                "final pass %.1f ms)",
                job.vpid, job.allocs.size(), double(s.raw_bytes) / (1 << 20), mig.sink.describe().c_str(),
                (unsigned long long)job.chunk_copies.load(), s.workers, double(elapsed_ns) / 1e6);
    else
      PHOS_INFO("process %d: %zu allocations, %.1f MiB moved to %s in %.1f ms (%.2f GB/s, %u workers)", job.vpid,
                job.allocs.size(), double(s.raw_bytes) / (1 << 20), mig.sink.describe().c_str(), double(elapsed_ns) / 1e6,
                double(s.raw_bytes) / double(elapsed_ns ? elapsed_ns : 1), s.workers);
    return {};
  }
  PHOS_INFO("process %d: %zu allocations, %.1f MiB copied to the image in %.1f ms (%.2f GB/s, %u workers, %s), "
            "%.1f MiB stored; %llu zero chunks (%.1f MiB) not stored%s; summed over workers: waiting for DMA %.1f ms, "
            "checksums %.1f ms, compression %.1f ms, writing %.1f ms",
            job.vpid, job.allocs.size(), double(s.raw_bytes) / (1 << 20), double(elapsed_ns) / 1e6,
            double(s.raw_bytes) / double(elapsed_ns), s.workers,
            s.direct_io ? "O_DIRECT" : ("buffered I/O: " + why_buffered).c_str(), double(s.stored_bytes) / (1 << 20),
            (unsigned long long)s.zero_chunks, double(s.zero_bytes) / (1 << 20),
            settings_.sparse == image::Sparse::kOff ? " (sparse=off)" : "", double(s.dma_wait_ns) / 1e6,
            double(s.checksum_ns) / 1e6, double(s.compress_ns) / 1e6, double(s.write_ns) / 1e6);
  return {};
}

Result<std::vector<GpuPlacement>> Engine::place_devices(const image::Manifest& m, const std::string& manifest_name,
                                                        const GpuMapSpec& spec, std::vector<GpuDevice>& host) {
  auto gpus = host_gpus();
  if (!gpus) return make_error(manifest_name + ": " + gpus.error().message, gpus.error().code);
  host = std::move(*gpus);
  // Too little free memory shows when prepare_load() creates the
  // allocations: the message names the device, the size and the driver's
  // error.
  return place_gpus(spec, m.devices, host, manifest_name);
}

Engine::LoadJob::~LoadJob() {
  if (engine) engine->release_load(*this);
}

void Engine::release_load(LoadJob& job) {
  for (size_t i = 0; i < job.handles.size(); i++) {
    if (job.vas[i] || job.handles[i]) cu_.cuCtxSetCurrent(contexts_.at(job.devices[i]));
    if (job.vas[i]) unmap(job.vas[i], job.manifest->allocations[i].size);
    if (job.handles[i]) cu_.cuMemRelease(job.handles[i]);
    job.vas[i] = 0;
    job.handles[i] = 0;
  }
}

Result<std::unique_ptr<Engine::LoadJob>> Engine::prepare_load(const image::Manifest& m,
                                                              const std::vector<GpuPlacement>& placement) {
  std::lock_guard<std::mutex> lock(run_mu_);
  auto host_device = [&](uint32_t image_ordinal) {
    for (const auto& p : placement)
      if (p.image_ordinal == image_ordinal) return p.host_ordinal;
    return int(image_ordinal);
  };
  auto job = std::make_unique<LoadJob>();
  job->manifest = &m;
  job->engine = this;
  job->handles.assign(m.allocations.size(), 0);
  job->vas.assign(m.allocations.size(), 0);
  job->devices.assign(m.allocations.size(), 0);
  for (size_t i = 0; i < m.allocations.size(); i++) {
    const auto& a = m.allocations[i];
    const int device = host_device(a.device);
    job->devices[i] = device;
    Result<void> err;
    CUcontext ctx = context(device, err);
    if (!ctx || cu_.cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
      return err.ok() ? make_error("cannot use device " + std::to_string(device), ENODEV) : err.error();
    // A test's GPU without room: the driver's own error, at the last allocation.
    const bool refused = i + 1 == m.allocations.size() && fault("fail-memory-create");
    if (CUresult r = refused ? CUDA_ERROR_OUT_OF_MEMORY : create_exportable(job->handles[i], a.size, device);
        r != CUDA_SUCCESS)
      return make_error(cu_.error(("device " + std::to_string(device) + ": allocate " + std::to_string(a.size) +
                                   " bytes for allocation " + std::to_string(a.id)).c_str(), r),
                        ENOMEM);
    auto va = map(job->handles[i], a.size, device);
    if (!va) return va.error();
    job->vas[i] = *va;
    for (size_t k = 0; k < a.chunks.size(); k++)
      if (a.chunks[k].compression != image::Compression::kDead)  // left unfilled: the program writes it first
        job->pieces.push_back({i, k, a.chunks[k].alloc_offset, a.chunks[k].raw_size, device});
  }
  return job;
}

Result<void> Engine::queue_zero_chunk(const LoadJob& job, const Piece& p, CUstream stream) {
  const image::Allocation& a = job.manifest->allocations[p.allocation];
  const image::Chunk& c = a.chunks[p.chunk];
  PHOS_CU(cu_, cu_.cuMemsetD8Async(job.vas[p.allocation] + c.alloc_offset, 0, c.raw_size, stream),
          ("set zero chunk at offset " + std::to_string(c.alloc_offset) + " of allocation " + std::to_string(a.id))
              .c_str());
  return {};
}

Result<std::vector<UniqueFd>> Engine::run_load(int dirfd, LoadJob& job) {
  std::lock_guard<std::mutex> lock(run_mu_);
  const image::Manifest& m = *job.manifest;
  const std::vector<Piece>& pieces = job.pieces;
  std::vector<CUdeviceptr>& vas = job.vas;
  std::vector<CUmemGenericAllocationHandle>& handles = job.handles;
  // Readers keep open files and a scratch buffer: one per worker.
  std::vector<std::unique_ptr<image::ImageReader>> readers(workers_for(pieces.size()));
  PieceWork work;
  // Each chunk's CRC is checked on the GPU, after it went there, where the
  // checksum kernel is loaded (the same one as a dump's): the workers then
  // read each chunk once (pread), not twice (pread, CRC).
  std::atomic<uint64_t> gpu_checked{0}, zero_chunks{0};
  work.start = [&](const Piece& p, void* buffer, CUstream stream, unsigned worker, CUdeviceptr) -> Result<void> {
    if (!readers[worker]) readers[worker] = std::make_unique<image::ImageReader>(dirfd, m);
    const image::Chunk& c = m.allocations[p.allocation].chunks[p.chunk];
    if (c.compression == image::Compression::kZero) return queue_zero_chunk(job, p, stream);
    const bool on_gpu = crc_function(p.device) != nullptr;
    PHOS_TRY(readers[worker]->read_chunk(c, std::span(static_cast<std::byte*>(buffer), c.raw_size),
                                         on_gpu ? image::CrcCheck::kByCaller : image::CrcCheck::kHere));
    const CUdeviceptr dst = vas[p.allocation] + c.alloc_offset;
    PHOS_CU(cu_, cu_.cuMemcpyHtoDAsync_v2(dst, buffer, c.raw_size, stream),
            ("copy allocation " + std::to_string(m.allocations[p.allocation].id) + " to device").c_str());
    if (on_gpu) (void)queue_crc(p.device, dst, c.raw_size, crc_tail(buffer, m.chunk_size), stream);
    return {};
  };
  work.done = [&](const Piece& p, void* buffer, unsigned worker) -> Result<void> {
    const image::Chunk& c = m.allocations[p.allocation].chunks[p.chunk];
    // Zero by construction: nothing read that a CRC could find damaged.
    // On-demand: in the table once it is known good, for the calls waiting.
    auto in = [&] {
      if (p.claim) {
        job.fill->copied(*p.claim);
        job.fills_in_flight--;
      }
      return Result<void>{};
    };
    if (c.compression == image::Compression::kZero) {
      zero_chunks++;
      return in();
    }
    if (!crc_function(p.device)) return in();  // read_chunk checked it
    const ChunkCrcTail* tail = crc_tail(buffer, m.chunk_size);
    uint32_t crc = 0;
    if (tail->done == kChunkCrcDone) {
      crc = tail->crc;
      gpu_checked++;
    } else {
      crc = phos::crc32c(std::span(static_cast<const std::byte*>(buffer), c.raw_size));
    }
    if (crc != c.crc32c) return image::checksum_mismatch(readers[worker]->file_name(c), c);
    return in();
  };
  uint64_t t0 = monotonic_ns();
  std::vector<uint64_t> dma_wait_ns;
  // Chunks hold at most the image's chunk size (validate_manifest checks).
  Result<void> filled;
  if (job.fill) {
    for (const auto& p : pieces)
      if (Result<void> err; !context(p.device, err)) return err.error();
    std::atomic<size_t> cursor{0};
    filled = run_workers(workers_for(pieces.size()), [&](Piece& out) { return next_fill(job, cursor, out); },
                         m.chunk_size, work, dma_wait_ns);
  } else {
    filled = run_workers(pieces, m.chunk_size, work, dma_wait_ns);
  }
  uint64_t elapsed = monotonic_ns() - t0;
  if (filled && job.fill && !job.fill->all_copied())
    filled = make_error("on-demand restore: chunks left unfilled (the process changed the fill table)", EPROTO);
  if (!filled) return filled.error();  // the job releases the memory
  image::ChunkTimes times;
  for (const auto& r : readers)
    if (r) times += r->times();
  uint64_t dma_wait = 0;
  for (uint64_t ns : dma_wait_ns) dma_wait += ns;
  std::vector<UniqueFd> fds;
  uint64_t bytes = 0;
  for (size_t i = 0; i < m.allocations.size(); i++) {
    unmap(vas[i], m.allocations[i].size);
    vas[i] = 0;
    bytes += m.allocations[i].size;
    if (job.fill) {  // exported by open_fill; its fd keeps the memory
      cu_.cuMemRelease(handles[i]);
      handles[i] = 0;
      continue;
    }
    auto fd = export_fd(handles[i], "export restored allocation");
    cu_.cuMemRelease(handles[i]);  // the fd keeps the memory
    handles[i] = 0;
    if (!fd) return fd.error();
    fds.push_back(std::move(*fd));
  }
  if (job.fill) {
    const copystate::Statistics s = job.fill->statistics();
    PHOS_INFO("process %d: on-demand fill: %llu chunks overwritten by the process before the fill reached them, "
              "%llu waits of its calls",
              m.pid, (unsigned long long)s.overwritten, (unsigned long long)s.waits);
  }
  uint64_t dead_chunks = 0, dead_bytes = 0;
  for (const auto& a : m.allocations)
    for (const auto& c : a.chunks)
      if (c.compression == image::Compression::kDead) {
        dead_chunks++;
        dead_bytes += c.raw_size;
      }
  if (dead_chunks)
    PHOS_INFO("process %d: %llu dead chunks (%.1f MiB), free in its allocator at the checkpoint, left unfilled",
              m.pid, (unsigned long long)dead_chunks, double(dead_bytes) / (1 << 20));
  if (bytes)
    PHOS_INFO("process %d: %zu allocations, %.1f MiB restored to device memory in %.1f ms (%.2f GB/s, %zu workers, "
              "%llu of %zu chunks zero, set with a memset, %llu CRC-32C checked on the GPU); summed over workers: "
              "reading %.1f ms, decompression %.1f ms, checksums on the CPU %.1f ms, waiting for DMA %.1f ms",
              m.pid, m.allocations.size(), double(bytes) / (1 << 20), double(elapsed) / 1e6,
              double(bytes) / double(elapsed), readers.size(), (unsigned long long)zero_chunks.load(), pieces.size(),
              (unsigned long long)gpu_checked.load(),
              double(times.io_ns) / 1e6, double(times.compress_ns) / 1e6, double(times.checksum_ns) / 1e6,
              double(dma_wait) / 1e6);
  return fds;
}

Result<void> Engine::open_fill(LoadJob& job, const std::vector<uint64_t>& first) {
  const image::Manifest& m = *job.manifest;
  std::vector<copystate::Region> regions;
  for (const auto& a : m.allocations) regions.push_back({.id = a.id, .address = a.address, .size = a.size});
  auto table = copystate::CopyState::create(CopyProtocol::kOnDemandFill, m.chunk_size, regions, 0);
  if (!table) return make_error("on-demand restore: " + table.error().message, table.error().code);
  // The table's regions are in address order; the manifest's allocations
  // need not be.
  std::map<uint64_t, uint32_t> region_at;
  for (uint32_t r = 0; r < table->regions().size(); r++) region_at[table->regions()[r].address] = r;
  job.piece_of_chunk.assign(table->chunk_count(), SIZE_MAX);
  std::vector<std::vector<uint64_t>> chunks_of(m.allocations.size());
  for (size_t k = 0; k < job.pieces.size(); k++) {
    const Piece& p = job.pieces[k];
    if (p.offset % m.chunk_size)
      return make_error("on-demand restore: allocation " + std::to_string(m.allocations[p.allocation].id) +
                            " has a chunk at offset " + std::to_string(p.offset) + ", not on a chunk boundary",
                        EINVAL);
    uint64_t c = table->chunk_at(region_at.at(m.allocations[p.allocation].address), p.offset);
    job.piece_of_chunk[c] = k;
    chunks_of[p.allocation].push_back(c);
  }
  // What the image holds no data for has nothing to wait for.
  for (uint64_t c = 0; c < table->chunk_count(); c++)
    if (job.piece_of_chunk[c] == SIZE_MAX)
      if (auto claim = table->claim(c)) table->copied(*claim);
  // The recorded order first, then the rest by address.
  std::map<uint64_t, size_t> index_of_id;
  for (size_t i = 0; i < m.allocations.size(); i++) index_of_id[m.allocations[i].id] = i;
  std::vector<bool> placed(m.allocations.size(), false);
  auto place = [&](size_t i) {
    if (placed[i]) return;
    placed[i] = true;
    std::sort(chunks_of[i].begin(), chunks_of[i].end());
    job.fill_order.insert(job.fill_order.end(), chunks_of[i].begin(), chunks_of[i].end());
  };
  for (uint64_t id : first)
    if (auto it = index_of_id.find(id); it != index_of_id.end()) place(it->second);
  std::vector<size_t> by_address(m.allocations.size());
  for (size_t i = 0; i < by_address.size(); i++) by_address[i] = i;
  std::sort(by_address.begin(), by_address.end(),
            [&](size_t a, size_t b) { return m.allocations[a].address < m.allocations[b].address; });
  for (size_t i : by_address) place(i);
  // The fds go to the process before the fill ends.
  for (size_t i = 0; i < m.allocations.size(); i++) {
    if (Result<void> err; !context(job.devices[i], err) || cu_.cuCtxSetCurrent(contexts_.at(job.devices[i])) != CUDA_SUCCESS)
      return make_error("on-demand restore: cannot use device " + std::to_string(job.devices[i]), ENODEV);
    auto fd = export_fd(job.handles[i], "export allocation for on-demand restore");
    if (!fd) return fd.error();
    job.fds.push_back(std::move(*fd));
  }
  job.fill.emplace(std::move(*table));
  return {};
}

Engine::Take Engine::next_fill(LoadJob& job, std::atomic<size_t>& cursor, Piece& out) {
  copystate::CopyState& table = *job.fill;
  // The process shares the table and may scribble on it: a chunk the image
  // has no data for is never taken.
  auto take = [&](const copystate::Claim& c) {
    const size_t k = c.chunk < job.piece_of_chunk.size() ? job.piece_of_chunk[c.chunk] : SIZE_MAX;
    if (k >= job.pieces.size()) {
      table.copied(c);
      return Take::kLater;
    }
    out = job.pieces[k];
    out.claim = c;
    job.fills_in_flight++;
    return Take::kTaken;
  };
  if (auto c = table.claim_urgent()) return take(*c);
  // A test's slow fill: calls meet memory not yet in.
  if (fault("slow-fill")) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (size_t i; (i = cursor.fetch_add(1)) < job.fill_order.size();)
    if (auto c = table.claim(job.fill_order[i])) return take(*c);
  // The last chunks are in other workers' hands; with none in flight, a
  // chunk not filled now never will be (run_load says so).
  return table.all_copied() || job.fills_in_flight == 0 ? Take::kDone : Take::kLater;
}

}  // namespace phos::plugin
