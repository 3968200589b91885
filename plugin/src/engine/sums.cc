// The engine's fingerprint passes: validation by checksum (sum_check.h,
// docs/design/checksum-validation.md). The kernels (gpu/chunk_sum.cu) are
// loaded with each of criu's contexts; the freeze's pass (T0) and recopy's
// final one (T1) run one block per chunk of the window's table; each copy
// is checked as it lands (check_copy), from the bytes that go into the image.
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "chunk_crc.h"
#include "chunk_sum.h"
#include "engine/engine.h"
#include "phos/images/crc32c.h"
#include "phos/images/fingerprint.h"
#include "phos/images/zero_chunk.h"
#include "phos/plugin/log.h"
#include "phos/support/clock.h"

namespace phos::plugin {

void Engine::load_sum_kernels(int ordinal, CUcontext ctx) {
  SumKernels k;
  if (!settings_.gpu_checksums) {
    sum_unavailable_ = "gpu_checksums is off";
  } else if (kChunkSumImageSize == 0) {
    sum_unavailable_ = "the plugin was built without nvcc";
  } else {
    CUmodule module = nullptr;
    CUresult m = cu_.cuCtxSetCurrent(ctx);
    if (m == CUDA_SUCCESS) m = cu_.cuModuleLoadData(&module, kChunkSumImage);
    if (m == CUDA_SUCCESS) m = cu_.cuModuleGetFunction(&k.sum, module, "phos_chunk_sum");
    if (m == CUDA_SUCCESS) m = cu_.cuModuleGetFunction(&k.copy_sum, module, "phos_chunk_copy_sum");
    if (m != CUDA_SUCCESS) {
      k = SumKernels{};
      sum_unavailable_ = cu_.error(("load the fingerprint kernels on device " + std::to_string(ordinal)).c_str(), m);
      PHOS_WARN("%s; copy-on-write with cow_trust=checksum copies while the process is stopped", sum_unavailable_.c_str());
    }
  }
  sum_kernels_[ordinal] = k;
}

Engine::SumKernels Engine::sum_kernels(int ordinal) const {
  auto it = sum_kernels_.find(ordinal);
  return it == sum_kernels_.end() ? SumKernels{} : it->second;
}

bool Engine::queue_copy_sum(int device, CUdeviceptr src, CUdeviceptr bounce, size_t size, ChunkCrcTail* tail,
                            CUstream stream) const {
  tail->done = 0;
  tail->summed = 0;
  CUfunction f = sum_kernels(device).copy_sum;
  if (!f || !bounce) return false;
  CUdeviceptr out = 0;
  unsigned long long n = size;
  void* args[] = {&src, &bounce, &n, &out};
  return cu_.cuMemHostGetDevicePointer_v2(&out, tail, 0) == CUDA_SUCCESS &&
         cu_.cuLaunchKernel(f, 1, 1, 1, kChunkSumThreads, 1, 1, 0, stream, args, nullptr) == CUDA_SUCCESS;
}

bool Engine::queue_sum(int device, ChunkSumTask* task, ChunkSumOut* out, CUstream stream) const {
  out->done = 0;
  CUfunction f = sum_kernels(device).sum;
  if (!f) return false;
  CUdeviceptr tasks = 0, outs = 0;
  void* args[] = {&tasks, &outs};
  return cu_.cuMemHostGetDevicePointer_v2(&tasks, task, 0) == CUDA_SUCCESS &&
         cu_.cuMemHostGetDevicePointer_v2(&outs, out, 0) == CUDA_SUCCESS &&
         cu_.cuLaunchKernel(f, 1, 1, 1, kChunkSumThreads, 1, 1, 0, stream, args, nullptr) == CUDA_SUCCESS;
}

Result<void> Engine::prepare_target_sums(SaveJob& job) {
  if (!job.migration || !job.validated || job.target_sums) return {};
  const uint64_t n = job.window->table.chunk_count();
  void* tasks = nullptr;
  void* sums = nullptr;
  const unsigned flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
  PHOS_CU(cu_, cu_.cuMemHostAlloc(&tasks, n * sizeof(ChunkSumTask), flags), "migration: pinned fingerprint tasks");
  if (CUresult r = cu_.cuMemHostAlloc(&sums, n * sizeof(ChunkSumOut), flags); r != CUDA_SUCCESS) {
    cu_.cuMemFreeHost(tasks);
    return make_error(cu_.error("migration: pinned fingerprints", r), ENOMEM);
  }
  std::memset(sums, 0, n * sizeof(ChunkSumOut));
  job.target_tasks = static_cast<ChunkSumTask*>(tasks);
  job.target_sums = static_cast<ChunkSumOut*>(sums);
  return {};
}

Result<void> Engine::can_sum(const SaveJob& job) {
  if (!settings_.gpu_checksums) return {};  // the CPU takes them (tests)
  std::lock_guard<std::mutex> lock(run_mu_);
  for (int d : std::set<int>(job.devices.begin(), job.devices.end())) {
    Result<void> err;
    if (!context(d, err)) return err;
    if (!sum_kernels(d).sum)
      return make_error("no fingerprint kernel on device " + std::to_string(d) + " (" + sum_unavailable_ + ")", ENOTSUP);
  }
  return {};
}

Result<void> Engine::take_freeze_sums(SaveJob& job) {
  std::lock_guard<std::mutex> lock(run_mu_);
  if (!job.window) return make_error("checksum: the job has no copy window", EINVAL);
  const uint64_t t0 = monotonic_ns();
  sum_check::ChunkSums t0_sums;
  PHOS_TRY(sum_chunks(job, t0_sums));
  job.sum_pass_ns = monotonic_ns() - t0;
  job.reference = std::move(t0_sums);
  job.validated = job.checked = true;
  job.against = sum_check::Against::kFreeze;
  const uint64_t chunks = job.window->table.chunk_count();
  PHOS_INFO("process %d: checksum: the freeze's fingerprints (T0) of %llu chunks, %.1f GiB, in %.1f ms (%s)", job.vpid,
            (unsigned long long)chunks, double(chunks * settings_.chunk_size) / double(1ull << 30),
            double(job.sum_pass_ns) / 1e6, settings_.gpu_checksums ? "GPU" : "CPU, gpu_checksums=off");
  return {};
}

void Engine::settle_zero_chunks(SaveJob& job) {
  std::lock_guard<std::mutex> lock(run_mu_);
  if (!job.window || job.migration || settings_.sparse != image::Sparse::kAuto || job.reference.empty() ||
      job.window->table.protocol() != CopyProtocol::kSoftCopyOnWrite)
    return;
  uint64_t chunks = 0, bytes = 0;
  const uint64_t t0 = monotonic_ns();
  copystate::CopyState& table = job.window->table;
  std::map<uint64_t, uint32_t> zero_crc;  // by chunk size: whole chunks, and allocations' last ones
  for (uint64_t c = 0; c < table.chunk_count(); c++) {
    if (!job.reference.zero(c) || window_chunk_dead(job, c)) continue;
    auto claim = table.claim(c);  // not pending: copied stopped (IPC), or dead
    if (!claim) continue;
    const Piece p = piece_of(job, *claim);
    auto crc = zero_crc.find(p.size);
    if (crc == zero_crc.end()) {
      const std::vector<std::byte> zeros(p.size);
      crc = zero_crc.emplace(p.size, phos::crc32c(zeros)).first;
    }
    job.chunks[p.allocation][p.chunk] = image::Chunk{.alloc_offset = p.offset,
                                                     .raw_size = uint32_t(p.size),
                                                     .crc32c = crc->second,
                                                     .compression = image::Compression::kZero,
                                                     .fingerprint = *job.reference.get(c)};
    table.copied(*claim);
    chunks++;
    bytes += p.size;
  }
  if (chunks)
    PHOS_INFO("process %d: %llu chunks (%.1f MiB) all zero at the freeze: in the image as holes, copied by nobody, "
              "and no write of the process waits for them (%.1f ms)",
              job.vpid, (unsigned long long)chunks, double(bytes) / (1 << 20), double(monotonic_ns() - t0) / 1e6);
}

void Engine::drop_window(SaveJob& job) {
  std::lock_guard<std::mutex> lock(run_mu_);
  if (!job.window) return;
  unmap_pools(job);
  job.window.reset();
  job.region_allocation.clear();
  job.validated = job.checked = false;
  job.reference = {};
  job.image_sums = {};
}

Result<void> Engine::sum_chunks(SaveJob& job, sum_check::ChunkSums& out) {
  out = sum_check::ChunkSums(job.window->table.chunk_count());
  return settings_.gpu_checksums ? sum_chunks_on_gpu(job, out) : sum_chunks_on_host(job, out);
}

// One launch per GPU, one block per chunk; the tasks and the sums in pinned
// host memory the GPU reads and writes (16 bytes each way per chunk).
Result<void> Engine::sum_chunks_on_gpu(SaveJob& job, sum_check::ChunkSums& out) {
  const copystate::CopyState& table = job.window->table;
  std::map<int, std::vector<uint64_t>> chunks_on;  // criu's device -> table chunks
  for (uint64_t c = 0; c < table.chunk_count(); c++)
    chunks_on[job.devices[job.region_allocation.at(table.locate(c).region)]].push_back(c);
  struct Launch {
    int device;
    const std::vector<uint64_t>* chunks;
    ChunkSumTask* tasks = nullptr;
    ChunkSumOut* sums = nullptr;
    CUstream stream = nullptr;
  };
  std::vector<Launch> launches;
  Result<void> queued;
  for (const auto& [device, chunks] : chunks_on) {
    Launch l{device, &chunks};
    launches.push_back(l);
    Launch& at = launches.back();
    const CUfunction sum = sum_kernels(device).sum;
    const unsigned flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP;
    void* tasks = nullptr;
    void* sums = nullptr;
    CUresult r = sum ? cu_.cuCtxSetCurrent(contexts_.at(device)) : CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS) r = cu_.cuMemHostAlloc(&tasks, chunks.size() * sizeof(ChunkSumTask), flags);
    at.tasks = static_cast<ChunkSumTask*>(tasks);
    if (r == CUDA_SUCCESS) r = cu_.cuMemHostAlloc(&sums, chunks.size() * sizeof(ChunkSumOut), flags);
    at.sums = static_cast<ChunkSumOut*>(sums);
    if (r == CUDA_SUCCESS) r = cu_.cuStreamCreate(&at.stream, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS) {
      for (size_t i = 0; i < chunks.size(); i++) {
        const copystate::Claim where = table.locate(chunks[i]);
        at.tasks[i] = ChunkSumTask{job.vas[job.region_allocation[where.region]] + where.offset, where.bytes};
        at.sums[i] = ChunkSumOut{};
      }
      CUdeviceptr tasks_on_gpu = 0, sums_on_gpu = 0;
      void* args[] = {&tasks_on_gpu, &sums_on_gpu};
      r = cu_.cuMemHostGetDevicePointer_v2(&tasks_on_gpu, at.tasks, 0);
      if (r == CUDA_SUCCESS) r = cu_.cuMemHostGetDevicePointer_v2(&sums_on_gpu, at.sums, 0);
      if (r == CUDA_SUCCESS)
        r = cu_.cuLaunchKernel(sum, unsigned(chunks.size()), 1, 1, kChunkSumThreads, 1, 1, 0, at.stream, args, nullptr);
    }
    if (r != CUDA_SUCCESS) {
      queued = make_error(sum ? cu_.error(("fingerprint the chunks on device " + std::to_string(device)).c_str(), r)
                              : "no fingerprint kernel on device " + std::to_string(device) + " (" + sum_unavailable_ + ")",
                          EIO);
      break;
    }
  }
  // Every launch waited for (and freed), whatever failed.
  for (Launch& l : launches) {
    cu_.cuCtxSetCurrent(contexts_.at(l.device));
    if (l.stream) {
      if (CUresult r = cu_.cuStreamSynchronize(l.stream); r != CUDA_SUCCESS && queued)
        queued = make_error(cu_.error(("fingerprint the chunks on device " + std::to_string(l.device)).c_str(), r), EIO);
      cu_.cuStreamDestroy_v2(l.stream);
    }
    for (size_t i = 0; queued && i < l.chunks->size(); i++) {
      if (l.sums[i].done != kChunkSumDone) {
        queued = make_error("fingerprint of chunk " + std::to_string((*l.chunks)[i]) + " on device " +
                                std::to_string(l.device) + " not written by the kernel",
                            EIO);
        break;
      }
      out.set((*l.chunks)[i], l.sums[i].fingerprint, l.sums[i].zero != 0);
    }
    if (l.tasks) cu_.cuMemFreeHost(l.tasks);
    if (l.sums) cu_.cuMemFreeHost(l.sums);
  }
  return queued;
}

// Through the staging ring, as a copy: for tests (gpu_checksums=off), and
// the same function as the GPU's (fingerprint.h).
Result<void> Engine::sum_chunks_on_host(SaveJob& job, sum_check::ChunkSums& out) {
  const copystate::CopyState& table = job.window->table;
  std::vector<Piece> pieces;
  for (uint64_t c = 0; c < table.chunk_count(); c++) pieces.push_back(piece_of(job, table.locate(c)));
  PieceWork work;
  work.start = [&](const Piece& p, void* buffer, CUstream stream, unsigned, CUdeviceptr) -> Result<void> {
    PHOS_CU(cu_, cu_.cuMemcpyDtoHAsync_v2(buffer, job.vas[p.allocation] + p.offset, p.size, stream),
            ("fingerprint allocation " + std::to_string(job.allocs[p.allocation].id) + " on the CPU").c_str());
    return {};
  };
  work.done = [&](const Piece& p, void* buffer, unsigned) -> Result<void> {
    out.set(p.claim->chunk, phos::fingerprint::of(buffer, p.size), zero_chunk::all_zero(buffer, p.size));
    return {};
  };
  std::vector<uint64_t> dma_wait_ns;
  return run_workers(pieces, settings_.chunk_size, work, dma_wait_ns, job.workers ? job.workers : 0);
}

Result<sum_check::FinalPass> Engine::plan_final_pass(SaveJob& job) {
  copystate::CopyState& table = job.window->table;
  const uint64_t t0 = monotonic_ns();
  sum_check::ChunkSums now;
  PHOS_TRY(sum_chunks(job, now));
  job.sum_pass_ns = monotonic_ns() - t0;
  sum_check::FinalPass plan = sum_check::plan_final_pass(table, job.image_sums, now,
                                                         [&](uint64_t c) { return window_chunk_dead(job, c); });
  // The plan stands for the marks: a chunk it leaves is whole in the image.
  for (uint64_t c = 0; c < table.chunk_count(); c++) table.clear_dirty(c);
  job.reference = std::move(now);
  job.checked = true;
  job.against = sum_check::Against::kFinalPass;
  job.sum_missed = plan.missed;
  job.sum_unchanged_dirty = plan.unchanged_dirty;
  PHOS_INFO("process %d: checksum: the final pass copies %zu of %llu chunks: %llu not copied yet, %llu changed since "
            "their copy (%llu of them without a dirty mark: writes speculation missed); %llu dirty but unchanged "
            "keep their copy (T1 in %.1f ms)",
            job.vpid, plan.copy.size(), (unsigned long long)table.chunk_count(), (unsigned long long)plan.not_copied,
            (unsigned long long)plan.changed, (unsigned long long)plan.missed,
            (unsigned long long)plan.unchanged_dirty, double(job.sum_pass_ns) / 1e6);
  return plan;
}

Result<void> Engine::check_copy(SaveJob& job, const Piece& p, uint64_t fingerprint) {
  const uint64_t chunk = p.claim->chunk;
  if (!job.checked) {  // recopy's first pass: what its final pass compares with
    job.image_sums.set(chunk, fingerprint);
    return {};
  }
  job.sum_checked++;
  if (sum_check::matches(job.reference, chunk, fingerprint)) return {};
  const agent::Allocation& a = job.allocs[p.allocation];
  {
    std::lock_guard<std::mutex> lock(job.misses_mu);
    job.misses.add(sum_check::ChunkPlace{.chunk = chunk,
                                         .allocation_id = a.id,
                                         .address = a.address,
                                         .offset = p.offset,
                                         .from_pool = p.claim->pool_slot.has_value()});
  }
  return misses_error(job);
}

Error Engine::misses_error(SaveJob& job) {
  std::lock_guard<std::mutex> lock(job.misses_mu);
  return make_error(sum_check::describe_misses(job.misses, job.against),
                    job.against == sum_check::Against::kFreeze ? EBADMSG : EIO);
}

}  // namespace phos::plugin
