#include "engine.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <set>

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

Result<std::unique_ptr<Engine>> Engine::start(uint32_t chunk_size) {
  auto cu = CudaApi::get();
  if (!cu) return cu.error();
  return std::unique_ptr<Engine>(new Engine(**cu, chunk_size));
}

Engine::~Engine() {
  if (staging_) cu_.cuMemFreeHost(staging_);
}

Result<void> Engine::use_device(int ordinal) {
  auto it = contexts_.find(ordinal);
  if (it == contexts_.end()) {
    CUdevice dev;
    PHOS_CU(cu_, cu_.cuDeviceGet(&dev, ordinal), ("device " + std::to_string(ordinal)).c_str());
    CUcontext ctx;
    PHOS_CU(cu_, cu_.cuDevicePrimaryCtxRetain(&ctx, dev), "primary context");
    it = contexts_.emplace(ordinal, ctx).first;
  }
  PHOS_CU(cu_, cu_.cuCtxSetCurrent(it->second), "cuCtxSetCurrent");
  if (!staging_) PHOS_CU(cu_, cu_.cuMemHostAlloc(&staging_, chunk_size_, CU_MEMHOSTALLOC_PORTABLE), "pinned staging buffer");
  return {};
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

Result<void> Engine::save(int dirfd, int32_t vpid, const std::vector<AgentAllocation>& allocs,
                          const std::vector<UniqueFd>& fds, image::Manifest& m) {
  if (fds.size() != allocs.size()) return make_error("one fd per allocation expected");
  m.chunk_size = chunk_size_;
  std::set<uint32_t> devices;
  for (const auto& a : allocs) devices.insert(a.device);
  for (uint32_t d : devices) {
    auto desc = describe(int(d));
    if (!desc) return desc.error();
    m.devices.push_back(*desc);
  }
  if (allocs.empty()) return {};
  auto writer = image::DataFileWriter::create(dirfd, image::data_file_name(vpid, 0), vpid, 0);
  if (!writer) return writer.error();
  uint64_t t0 = now_ns(), copy_ns = 0, write_ns = 0, bytes = 0;
  for (size_t i = 0; i < allocs.size(); i++) {
    const AgentAllocation& a = allocs[i];
    PHOS_TRY(use_device(int(a.device)));
    CUmemGenericAllocationHandle h = 0;
    PHOS_CU(cu_, cu_.cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(intptr_t(fds[i].get())),
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            ("import allocation " + std::to_string(a.id)).c_str());
    auto va = map(h, a.size, int(a.device));
    cu_.cuMemRelease(h);  // the mapping keeps the memory
    if (!va) return va.error();
    image::Allocation out{a.id, a.device, a.address, a.size, a.flags, {}};
    Result<void> copied;
    for (uint64_t off = 0; off < a.size && copied.ok(); off += chunk_size_) {
      size_t n = size_t(std::min<uint64_t>(chunk_size_, a.size - off));
      uint64_t c0 = now_ns();
      CUresult r = cu_.cuMemcpyDtoH_v2(staging_, *va + off, n);
      uint64_t c1 = now_ns();
      copy_ns += c1 - c0;
      if (r != CUDA_SUCCESS) {
        copied = make_error(cu_.error(("copy allocation " + std::to_string(a.id)).c_str(), r), EIO);
        break;
      }
      auto chunk = (*writer)->write_chunk(off, std::span(static_cast<const std::byte*>(staging_), n),
                                          image::Compression::None);
      write_ns += now_ns() - c1;
      if (!chunk) copied = chunk.error();
      else out.chunks.push_back(*chunk);
    }
    unmap(*va, a.size);
    PHOS_TRY(copied);
    bytes += a.size;
    m.allocations.push_back(std::move(out));
  }
  auto file = (*writer)->finish();
  if (!file) return file.error();
  m.data_files.push_back(*file);
  m.statistics.copy_ns = copy_ns;
  m.statistics.write_ns = write_ns;
  m.statistics.raw_bytes = bytes;
  m.statistics.stored_bytes = file->size;
  PHOS_INFO("process %d: %zu allocations, %.1f MiB copied in %.1f ms (%.2f GB/s device-to-host, %.2f GB/s total)",
            vpid, allocs.size(), double(bytes) / (1 << 20), double(now_ns() - t0) / 1e6,
            copy_ns ? double(bytes) / double(copy_ns) : 0.0, double(bytes) / double(now_ns() - t0));
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
  std::vector<UniqueFd> fds;
  image::ImageReader reader(dirfd, m);
  uint64_t t0 = now_ns(), bytes = 0;
  for (const auto& a : m.allocations) {
    PHOS_TRY(use_device(int(a.device)));
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = int(a.device);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = cu_.cuMemCreate(&h, a.size, &prop, 0);
    if (r != CUDA_SUCCESS)
      return make_error(cu_.error(("device " + std::to_string(a.device) + ": allocate " + std::to_string(a.size) +
                                   " bytes for allocation " + std::to_string(a.id)).c_str(), r),
                        ENOMEM);
    auto va = map(h, a.size, int(a.device));
    if (!va) {
      cu_.cuMemRelease(h);
      return va.error();
    }
    Result<void> filled;
    for (const auto& c : a.chunks) {
      auto buf = std::span(static_cast<std::byte*>(staging_), c.raw_size);
      filled = reader.read_chunk(c, buf);
      if (!filled) break;
      if (CUresult cr = cu_.cuMemcpyHtoD_v2(*va + c.alloc_offset, staging_, c.raw_size); cr != CUDA_SUCCESS) {
        filled = make_error(cu_.error("copy to device", cr), EIO);
        break;
      }
    }
    unmap(*va, a.size);
    int fd = -1;
    if (filled) r = cu_.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    cu_.cuMemRelease(h);  // the fd keeps the memory
    PHOS_TRY(filled);
    if (r != CUDA_SUCCESS) return make_error(cu_.error("export restored allocation", r), EIO);
    fds.emplace_back(fd);
    bytes += a.size;
  }
  if (bytes)
    PHOS_INFO("process %d: %zu allocations, %.1f MiB restored to device memory in %.1f ms", m.pid,
              m.allocations.size(), double(bytes) / (1 << 20), double(now_ns() - t0) / 1e6);
  return fds;
}

}  // namespace phos::plugin
