#include "engine.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "log.h"
#include "phos/images/data_file.h"
#include "phos/images/format.h"
#include "phos/images/image_dir.h"

namespace phos::plugin {
namespace {

uint64_t now_ns() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

CUmemAccessDesc read_write(int device) {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = device;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::start(uint32_t chunk_size, unsigned workers) {
  auto cu = CudaApi::get();
  if (!cu) return cu.error();
  if (workers == 0) workers = std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u);
  return std::unique_ptr<Engine>(new Engine(**cu, chunk_size, workers));
}

Engine::~Engine() = default;

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
  return ctx;
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

Result<image::Device> Engine::describe(int ordinal) {
  CUdevice dev;
  PHOS_CU(cu_, cu_.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  image::Device d;
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

Result<void> Engine::run_workers(const std::vector<Piece>& pieces,
                                 const std::function<Result<void>(const Piece&, void*, CUstream, unsigned)>& fn) {
  // Contexts first, on this thread: the workers only read the map.
  for (const auto& p : pieces) {
    Result<void> err;
    if (!context(p.device, err)) return err;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Error first_error;
  auto fail = [&](const Error& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed.exchange(true)) first_error = e;
  };
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < std::min<size_t>(workers_, pieces.size()); w++) {
    threads.emplace_back([&, w] {
      void* staging = nullptr;
      std::map<int, CUstream> streams;
      for (size_t i = next++; i < pieces.size() && !failed; i = next++) {
        const Piece& p = pieces[i];
        CUresult r = cu_.cuCtxSetCurrent(contexts_.at(p.device));
        if (r == CUDA_SUCCESS && !staging) r = cu_.cuMemHostAlloc(&staging, chunk_size_, CU_MEMHOSTALLOC_PORTABLE);
        if (r == CUDA_SUCCESS && !streams.count(p.device)) {
          CUstream s = nullptr;
          r = cu_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
          if (r == CUDA_SUCCESS) streams[p.device] = s;
        }
        if (r != CUDA_SUCCESS) {
          fail(make_error(cu_.error("engine worker setup", r), EIO));
          break;
        }
        if (auto done = fn(p, staging, streams[p.device], w); !done) fail(done.error());
      }
      for (auto& [dev, s] : streams) {
        cu_.cuCtxSetCurrent(contexts_.at(dev));
        cu_.cuStreamDestroy_v2(s);
      }
      if (staging) cu_.cuMemFreeHost(staging);
    });
  }
  for (auto& t : threads) t.join();
  if (failed) return first_error;
  return {};
}

Engine::SaveJob::~SaveJob() {
  for (size_t i = 0; i < vas.size(); i++)
    if (vas[i]) engine->unmap(vas[i], allocs[i].size);
}

Result<std::unique_ptr<Engine::SaveJob>> Engine::prepare_save(int dirfd, int32_t vpid,
                                                              const std::vector<AgentAllocation>& allocs,
                                                              const std::vector<UniqueFd>& fds, image::Manifest& m) {
  if (fds.size() != allocs.size()) return make_error("one fd per allocation expected");
  std::lock_guard<std::mutex> lock(run_mu_);
  m.chunk_size = chunk_size_;
  std::set<uint32_t> devices;
  for (const auto& a : allocs) devices.insert(a.device);
  for (uint32_t d : devices) {
    auto desc = describe(int(d));
    if (!desc) return desc.error();
    m.devices.push_back(*desc);
  }
  auto job = std::make_unique<SaveJob>();
  job->vpid = vpid;
  job->allocs = allocs;
  job->vas.assign(allocs.size(), 0);
  job->chunks.resize(allocs.size());
  job->manifest = &m;
  job->engine = this;
  if (allocs.empty()) return job;
  auto writer = image::DataFileWriter::create(dirfd, image::data_file_name(vpid, 0), vpid, 0);
  if (!writer) return writer.error();
  job->writer = std::move(*writer);
  for (size_t i = 0; i < allocs.size(); i++) {
    const AgentAllocation& a = allocs[i];
    Result<void> err;
    CUcontext ctx = context(int(a.device), err);
    if (!ctx || cu_.cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
      return err.ok() ? make_error("cannot use device " + std::to_string(a.device), ENODEV) : err.error();
    CUmemGenericAllocationHandle h = 0;
    PHOS_CU(cu_, cu_.cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(intptr_t(fds[i].get())),
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            ("import allocation " + std::to_string(a.id)).c_str());
    auto va = map(h, a.size, int(a.device));
    cu_.cuMemRelease(h);  // the mapping keeps the memory
    if (!va) return va.error();
    job->vas[i] = *va;
    size_t n = size_t((a.size + chunk_size_ - 1) / chunk_size_);
    job->chunks[i].resize(n);
    for (size_t k = 0; k < n; k++) {
      uint64_t off = uint64_t(k) * chunk_size_;
      job->pieces.push_back({i, k, off, size_t(std::min<uint64_t>(chunk_size_, a.size - off)), int(a.device)});
    }
  }
  return job;
}

Result<void> Engine::run_save(SaveJob& job) {
  if (job.allocs.empty()) return {};
  std::lock_guard<std::mutex> lock(run_mu_);
  uint64_t t0 = now_ns();
  auto copied = run_workers(job.pieces, [&](const Piece& p, void* staging, CUstream stream, unsigned) -> Result<void> {
    PHOS_CU(cu_, cu_.cuMemcpyDtoHAsync_v2(staging, job.vas[p.allocation] + p.offset, p.size, stream),
            ("copy allocation " + std::to_string(job.allocs[p.allocation].id)).c_str());
    PHOS_CU(cu_, cu_.cuStreamSynchronize(stream), "copy to host");
    auto chunk = job.writer->write_chunk(p.offset, std::span(static_cast<const std::byte*>(staging), p.size),
                                         image::Compression::None);
    if (!chunk) return chunk.error();
    job.chunks[p.allocation][p.chunk] = *chunk;
    return {};
  });
  uint64_t elapsed = now_ns() - t0;
  for (size_t i = 0; i < job.vas.size(); i++) {
    unmap(job.vas[i], job.allocs[i].size);
    job.vas[i] = 0;
  }
  PHOS_TRY(copied);
  auto file = job.writer->finish();
  if (!file) return file.error();
  image::Manifest& m = *job.manifest;
  uint64_t bytes = 0;
  for (size_t i = 0; i < job.allocs.size(); i++) {
    const AgentAllocation& a = job.allocs[i];
    m.allocations.push_back(image::Allocation{a.id, a.device, a.address, a.size, a.flags, std::move(job.chunks[i])});
    bytes += a.size;
  }
  m.data_files.push_back(*file);
  m.statistics.copy_ns = elapsed;
  m.statistics.raw_bytes = bytes;
  m.statistics.stored_bytes = file->size;
  PHOS_INFO("process %d: %zu allocations, %.1f MiB copied to the image in %.1f ms (%.2f GB/s, %u workers)", job.vpid,
            job.allocs.size(), double(bytes) / (1 << 20), double(elapsed) / 1e6, double(bytes) / double(elapsed),
            workers_);
  return {};
}

Result<void> Engine::check_devices(const image::Manifest& m, const std::string& manifest_name) {
  for (const auto& d : m.devices) {
    auto here = describe(int(d.ordinal));
    if (!here)
      return make_error(manifest_name + ": device " + std::to_string(d.ordinal) + " (" + d.name +
                        ") is not available here: " + here.error().message, ENODEV);
    if (here->name != d.name)
      return make_error(manifest_name + ": the image was taken on " + d.name + " as device " +
                        std::to_string(d.ordinal) + "; device " + std::to_string(d.ordinal) + " here is " +
                        here->name, ENODEV);
  }
  // Too little free memory shows when load() creates the allocations: the
  // message names the device, the size and the driver's error.
  return {};
}

Result<std::vector<UniqueFd>> Engine::load(int dirfd, const image::Manifest& m) {
  std::lock_guard<std::mutex> lock(run_mu_);
  std::vector<CUmemGenericAllocationHandle> handles(m.allocations.size(), 0);
  std::vector<CUdeviceptr> vas(m.allocations.size(), 0);
  auto release_all = [&] {
    for (size_t i = 0; i < m.allocations.size(); i++) {
      if (vas[i]) unmap(vas[i], m.allocations[i].size);
      if (handles[i]) cu_.cuMemRelease(handles[i]);
      vas[i] = 0;
      handles[i] = 0;
    }
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < m.allocations.size(); i++) {
    const auto& a = m.allocations[i];
    Result<void> err;
    CUcontext ctx = context(int(a.device), err);
    if (!ctx || cu_.cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
      release_all();
      return err.ok() ? make_error("cannot use device " + std::to_string(a.device), ENODEV) : err.error();
    }
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = int(a.device);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUresult r = cu_.cuMemCreate(&handles[i], a.size, &prop, 0);
    if (r != CUDA_SUCCESS) {
      handles[i] = 0;
      release_all();
      return make_error(cu_.error(("device " + std::to_string(a.device) + ": allocate " + std::to_string(a.size) +
                                   " bytes for allocation " + std::to_string(a.id)).c_str(), r),
                        ENOMEM);
    }
    auto va = map(handles[i], a.size, int(a.device));
    if (!va) {
      release_all();
      return va.error();
    }
    vas[i] = *va;
    for (size_t k = 0; k < a.chunks.size(); k++)
      pieces.push_back({i, k, a.chunks[k].alloc_offset, a.chunks[k].raw_size, int(a.device)});
  }

  uint64_t t0 = now_ns();
  // Readers keep open files and a scratch buffer: one per worker.
  std::vector<std::unique_ptr<image::ImageReader>> readers(workers_);
  auto filled = run_workers(pieces, [&](const Piece& p, void* staging, CUstream stream, unsigned w) -> Result<void> {
    if (!readers[w]) readers[w] = std::make_unique<image::ImageReader>(dirfd, m);
    const image::Chunk& c = m.allocations[p.allocation].chunks[p.chunk];
    PHOS_TRY(readers[w]->read_chunk(c, std::span(static_cast<std::byte*>(staging), c.raw_size)));
    PHOS_CU(cu_, cu_.cuMemcpyHtoDAsync_v2(vas[p.allocation] + c.alloc_offset, staging, c.raw_size, stream),
            "copy to device");
    PHOS_CU(cu_, cu_.cuStreamSynchronize(stream), "copy to device");
    return {};
  });
  uint64_t elapsed = now_ns() - t0;
  if (!filled) {
    release_all();
    return filled.error();
  }
  std::vector<UniqueFd> fds;
  uint64_t bytes = 0;
  for (size_t i = 0; i < m.allocations.size(); i++) {
    unmap(vas[i], m.allocations[i].size);
    vas[i] = 0;
    int fd = -1;
    CUresult r = cu_.cuMemExportToShareableHandle(&fd, handles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    cu_.cuMemRelease(handles[i]);  // the fd keeps the memory
    handles[i] = 0;
    if (r != CUDA_SUCCESS) {
      release_all();
      return make_error(cu_.error("export restored allocation", r), EIO);
    }
    fds.emplace_back(fd);
    bytes += m.allocations[i].size;
  }
  if (bytes)
    PHOS_INFO("process %d: %zu allocations, %.1f MiB restored to device memory in %.1f ms (%.2f GB/s, %u workers)",
              m.pid, m.allocations.size(), double(bytes) / (1 << 20), double(elapsed) / 1e6,
              double(bytes) / double(elapsed), workers_);
  return fds;
}

}  // namespace phos::plugin
