#include "memory/device_memory.h"
#include "phos/hooks/stderr_line.h"

#include <fcntl.h>
#include <signal.h>

#include <cstdio>
#include <cstring>

#include <functional>
#include <string>

#include "driver/driver.h"
#include "phos/images/format.h"

namespace phos::hooks {
namespace {

constexpr uint64_t kSlabBytes = 2u << 20;
constexpr uint64_t kArenaBytes = 256ull << 30;  // VA reserved at a time, per device


CUmemAllocationProp unit_prop(CUdevice dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAccessDesc device_access(CUdevice dev, CUmemAccess_flags flags) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = dev;
  access.flags = flags;
  return access;
}

CUmemAccessDesc read_write(CUdevice dev) { return device_access(dev, CU_MEM_ACCESS_FLAGS_PROT_READWRITE); }

CUresult map_with_access(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h,
                         const std::vector<CUmemAccessDesc>& access) {
  CUresult r = PHOS_REAL(cuMemMap)(va, size, 0, h, 0);
  if (r != CUDA_SUCCESS || access.empty()) return r;
  r = PHOS_REAL(cuMemSetAccess)(va, size, access.data(), access.size());
  if (r != CUDA_SUCCESS) PHOS_REAL(cuMemUnmap)(va, size);
  return r;
}

}  // namespace

DeviceMemory::Device* DeviceMemory::device_locked(CUdevice dev, CUresult* err) {
  auto [it, inserted] = devices_.try_emplace(dev);
  Device& d = it->second;
  if (inserted) {
    CUmemAllocationProp prop = unit_prop(dev);
    *err = PHOS_REAL(cuMemGetAllocationGranularity)(&d.granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (*err == CUDA_SUCCESS) *err = PHOS_REAL(cuCtxGetCurrent)(&d.ctx);
    CUuuid uuid;
    if (*err == CUDA_SUCCESS && PHOS_REAL(cuDeviceGetUuid_v2) && PHOS_REAL(cuDeviceGetUuid_v2)(&uuid, dev) == CUDA_SUCCESS) {
      d.uuid.emplace();
      std::memcpy(d.uuid->data(), uuid.bytes, 16);
    }
    int mps = 0;
    if (*err == CUDA_SUCCESS &&
        PHOS_REAL(cuDeviceGetAttribute)(&mps, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, dev) == CUDA_SUCCESS && mps)
      mps_seen_ = true;
    if (*err != CUDA_SUCCESS) {
      devices_.erase(it);
      return nullptr;
    }
  }
  return &d;
}

// A new unit on `dev`: its own device, and the peers granted access to it.
std::vector<CUmemAccessDesc> DeviceMemory::access_for_locked(CUdevice dev) const {
  std::vector<CUmemAccessDesc> access{read_write(dev)};
  auto it = peers_.find(dev);
  if (it != peers_.end())
    for (CUdevice peer : it->second) access.push_back(read_write(peer));
  return access;
}

CUresult DeviceMemory::set_peer_access_locked(CUdevice owner, CUdevice accessor, CUmemAccess_flags flags) {
  CUmemAccessDesc desc = device_access(accessor, flags);
  for (auto& [id, u] : units_) {
    if (u.device != owner || u.user_handle) continue;
    std::erase_if(u.access, [&](const CUmemAccessDesc& a) { return a.location.id == accessor; });
    if (flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) u.access.push_back(desc);
    if (!u.mapped) continue;  // released for a checkpoint: remap applies u.access
    CUresult r = PHOS_REAL(cuMemSetAccess)(u.va, u.size, &desc, 1);
    if (r != CUDA_SUCCESS) {
      stderr_line("phos: %s\n",
                  cu_error(("access of device " + std::to_string(accessor) + " to allocation " + std::to_string(id)).c_str(), r)
                      .c_str());
      return r;
    }
  }
  return CUDA_SUCCESS;
}

CUresult DeviceMemory::peer_access_enabled(CUdevice owner, CUdevice accessor) {
  std::lock_guard<std::mutex> lock(mu_);
  if (owner == accessor) return CUDA_SUCCESS;
  peers_[owner].insert(accessor);
  return set_peer_access_locked(owner, accessor, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

CUresult DeviceMemory::peer_access_disabled(CUdevice owner, CUdevice accessor) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(owner);
  if (it == peers_.end() || !it->second.erase(accessor)) return CUDA_SUCCESS;
  return set_peer_access_locked(owner, accessor, CU_MEM_ACCESS_FLAGS_PROT_NONE);
}

CUresult DeviceMemory::grow_arena_locked(CUdevice, Device& d, size_t at_least) {
  size_t size = std::max<uint64_t>(kArenaBytes, align_up(at_least, d.granularity));
  CUdeviceptr base = 0;
  CUresult r = PHOS_REAL(cuMemAddressReserve)(&base, size, 0, 0, 0);
  if (r == CUDA_SUCCESS) d.va.add_range(base, size);
  return r;
}

CUresult DeviceMemory::reserve_locked(CUdevice dev, Device& d, size_t size, CUdeviceptr* va) {
  auto got = d.va.allocate(size, d.granularity);
  if (!got) {
    if (CUresult r = grow_arena_locked(dev, d, size); r != CUDA_SUCCESS) return r;
    got = d.va.allocate(size, d.granularity);
    if (!got) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *va = *got;
  return CUDA_SUCCESS;
}

DeviceMemory::Unit& DeviceMemory::add_unit_locked(CUdevice dev, CUdeviceptr va, size_t size,
                                                  CUmemGenericAllocationHandle h, uint32_t flags) {
  Unit& u = units_[next_id_];
  u.id = next_id_++;
  u.device = dev;
  u.va = va;
  u.size = size;
  u.handle = h;
  u.mapped = true;
  u.flags = flags;
  u.access = access_for_locked(dev);
  return u;
}

CUresult DeviceMemory::new_unit_locked(CUdevice dev, Device& d, size_t size, uint32_t flags, const char* call,
                                       Unit** out) {
  CUdeviceptr va = 0;
  CUresult r = reserve_locked(dev, d, size, &va);
  if (r != CUDA_SUCCESS) return r;
  CUmemAllocationProp prop = unit_prop(dev);
  CUmemGenericAllocationHandle h = 0;
  r = create(call, size, [&] { return PHOS_REAL(cuMemCreate)(&h, size, &prop, 0); });
  if (r == CUDA_SUCCESS) {
    r = map_with_access(va, size, h, access_for_locked(dev));
    if (r != CUDA_SUCCESS) PHOS_REAL(cuMemRelease)(h);
  }
  if (r != CUDA_SUCCESS) {
    d.va.free(va, size);
    return r;
  }
  *out = &add_unit_locked(dev, va, size, h, flags);
  return CUDA_SUCCESS;
}

void DeviceMemory::observe(BufferObserver* o) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = o;
  if (!o) return;
  for (const auto& [ptr, b] : blocks_) o->buffer_added(ptr, b.size, b.unit);
  for (const auto& [id, u] : units_)
    if (u.user_handle) o->buffer_added(u.va, u.size, u.id);
}

CUresult DeviceMemory::allocate(CUdeviceptr* out, size_t size, uint32_t flags, const char* call) {
  if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
  reclaim_deferred();
  CUdevice dev = 0;
  CUresult r = PHOS_REAL(cuCtxGetDevice)(&dev);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(mu_);
  Device* d = device_locked(dev, &r);
  if (!d) return r;

  if (size <= kSlabMaxRequest) {
    size_t need = align_up(size, kBlockAlignment);
    for (auto& [id, u] : units_) {
      if (!u.slab || u.device != dev) continue;
      if (auto p = u.slab->allocate(need, kBlockAlignment)) {
        blocks_.emplace(*p, Block{size, id, need});
        if (observer_) observer_->buffer_added(*p, size, id);
        *out = *p;
        return CUDA_SUCCESS;
      }
    }
    Unit* slab = nullptr;
    r = new_unit_locked(dev, *d, align_up(kSlabBytes, d->granularity), flags | image::kAllocSlab, call, &slab);
    if (r != CUDA_SUCCESS) return r;
    slab->slab = std::make_unique<RangeAllocator>();
    slab->slab->add_range(slab->va, slab->size);
    auto p = slab->slab->allocate(need, kBlockAlignment);
    blocks_.emplace(*p, Block{size, slab->id, need});
    if (observer_) observer_->buffer_added(*p, size, slab->id);
    *out = *p;
    return CUDA_SUCCESS;
  }
  Unit* unit = nullptr;
  r = new_unit_locked(dev, *d, align_up(size, d->granularity), flags, call, &unit);
  if (r != CUDA_SUCCESS) return r;
  blocks_.emplace(unit->va, Block{size, unit->id, unit->size});
  if (observer_) observer_->buffer_added(unit->va, size, unit->id);
  *out = unit->va;
  return CUDA_SUCCESS;
}

void DeviceMemory::drop_unit_locked(Unit& u) {
  if (u.mapped) PHOS_REAL(cuMemUnmap)(u.va, u.size);
  if (u.handle) PHOS_REAL(cuMemRelease)(u.handle);
  if (unit_dropped_) unit_dropped_(u.va);
  devices_[u.device].va.free(u.va, u.size);
  units_.erase(u.id);
}

CUresult DeviceMemory::free_locked(std::map<CUdeviceptr, Block>::iterator it) {
  Block b = it->second;
  CUdeviceptr ptr = it->first;
  blocks_.erase(it);
  if (observer_) observer_->buffer_removed(ptr);
  auto uit = units_.find(b.unit);
  if (uit == units_.end()) return CUDA_ERROR_INVALID_VALUE;
  Unit& u = uit->second;
  if (!u.slab) {
    drop_unit_locked(u);
    return CUDA_SUCCESS;
  }
  u.slab->free(ptr, b.reserved);
  if (!u.slab->unused()) return CUDA_SUCCESS;
  // Keep one empty slab per device for the next small request.
  for (auto& [id, other] : units_)
    if (id != u.id && other.slab && other.device == u.device && other.slab->unused()) {
      drop_unit_locked(u);
      break;
    }
  return CUDA_SUCCESS;
}

bool DeviceMemory::free(CUdeviceptr ptr, CUresult* result) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end()) return false;
  *result = free_locked(it);
  return true;
}

bool DeviceMemory::free_after(CUdeviceptr ptr, CUstream stream, bool per_thread_stream, CUresult* result) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!blocks_.count(ptr)) return false;
  CUevent ev = nullptr;
  *result = PHOS_REAL(cuEventCreate)(&ev, CU_EVENT_DISABLE_TIMING);
  if (*result != CUDA_SUCCESS) return true;
  *result = per_thread_stream ? PHOS_REAL(cuEventRecord_ptsz)(ev, stream) : PHOS_REAL(cuEventRecord)(ev, stream);
  if (*result != CUDA_SUCCESS) {
    PHOS_REAL(cuEventDestroy_v2)(ev);
    return true;
  }
  deferred_.push_back({ptr, ev});
  return true;
}

void DeviceMemory::reclaim_deferred() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < deferred_.size();) {
    if (PHOS_REAL(cuEventQuery)(deferred_[i].done) == CUDA_ERROR_NOT_READY) {
      i++;
      continue;
    }
    PHOS_REAL(cuEventDestroy_v2)(deferred_[i].done);
    if (auto it = blocks_.find(deferred_[i].ptr); it != blocks_.end()) free_locked(it);
    deferred_[i] = deferred_.back();
    deferred_.pop_back();
  }
}

bool DeviceMemory::address_range(CUdeviceptr p, CUdeviceptr* base, size_t* size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.upper_bound(p);
  if (it == blocks_.begin()) return false;
  --it;
  if (p >= it->first + it->second.size) return false;
  if (base) *base = it->first;
  if (size) *size = it->second.size;
  return true;
}

DeviceMemory::Stats DeviceMemory::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.units = units_.size();
  s.blocks = blocks_.size();
  for (const auto& [p, b] : blocks_) s.requested_bytes += b.size;
  for (const auto& [id, u] : units_) s.physical_bytes += u.size;
  s.devices = uint32_t(devices_.size());
  for (const auto& [dev, d] : devices_)
    if (d.uuid) s.uuids.emplace_back(dev, *d.uuid);
  return s;
}

std::vector<CUcontext> DeviceMemory::contexts() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CUcontext> out;
  for (const auto& [dev, d] : devices_) out.push_back(d.ctx);
  return out;
}

std::vector<agent::Allocation> DeviceMemory::units() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<agent::Allocation> out;
  for (const auto& [id, u] : units_)
    out.push_back({.id = id, .device = uint32_t(u.device), .address = u.va, .size = u.size, .flags = u.flags, .ipc = u.ipc});
  return out;
}

Result<UniqueFd> DeviceMemory::export_unit(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = units_.find(id);
  if (it == units_.end()) return make_error("no allocation " + std::to_string(id), ENOENT);
  if (it->second.source_fd.valid()) {
    int dup = ::fcntl(it->second.source_fd.get(), F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return errno_error("dup the fd of allocation " + std::to_string(id));
    return UniqueFd(dup);
  }
  if (!it->second.handle) return make_error("allocation " + std::to_string(id) + " has no memory (released)", ENOENT);
  int fd = -1;
  CUresult r = PHOS_REAL(cuMemExportToShareableHandle)(&fd, it->second.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) return make_error(cu_error("cuMemExportToShareableHandle", r), EIO);
  return UniqueFd(fd);
}

std::optional<DeviceMemory::IpcBlock> DeviceMemory::ipc_block(CUdeviceptr ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.upper_bound(ptr);
  if (it == blocks_.begin()) return std::nullopt;
  --it;
  if (ptr >= it->first + it->second.size) return std::nullopt;
  auto u = units_.find(it->second.unit);
  if (u == units_.end() || u->second.ipc) return std::nullopt;
  return IpcBlock{.unit = u->first, .offset = it->first - u->second.va, .size = it->second.size};
}

Result<agent::IpcOpenReply> DeviceMemory::ipc_export(uint64_t id, pid_t importer, UniqueFd* fd, CUdeviceptr* va) {
  auto exported = export_unit(id);
  if (!exported) return exported.error();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = units_.find(id);
  if (it == units_.end()) return make_error("no allocation " + std::to_string(id), ENOENT);
  if (it->second.ipc)
    return make_error("allocation " + std::to_string(id) + " is itself another process's (opened through IPC)",
                      EINVAL);
  *fd = std::move(*exported);
  *va = it->second.va;
  ipc_importers_.emplace(id, importer);
  return agent::IpcOpenReply{.size = it->second.size, .device = uint32_t(it->second.device)};
}

void DeviceMemory::ipc_closed(uint64_t id, pid_t importer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = ipc_importers_.find({id, importer}); it != ipc_importers_.end()) ipc_importers_.erase(it);
}

std::vector<agent::IpcExport> DeviceMemory::ipc_exports() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<agent::IpcExport> out;
  for (const auto& [id, pid] : ipc_importers_) {
    // An importer that ended holds nothing (EPERM: alive, another user's).
    // 0: one outside our pid namespace, which we cannot look for: it holds
    // the memory until it closes it.
    if (pid != 0 && ::kill(pid, 0) != 0 && errno != EPERM) continue;
    agent::IpcExport e{.allocation = id, .importer_pid = pid};
    if (out.empty() || !(out.back() == e)) out.push_back(e);
  }
  return out;
}

bool DeviceMemory::ipc_reopen(const agent::IpcSource& src, uint64_t offset, CUdeviceptr* out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, u] : units_)
    if (u.ipc && *u.ipc == src) {
      u.ipc_opens++;
      *out = u.va + offset;
      return true;
    }
  return false;
}

CUresult DeviceMemory::ipc_import(const agent::IpcSource& src, int fd, size_t size, uint64_t offset,
                                  CUdeviceptr* out) {
  if (offset >= size) return CUDA_ERROR_INVALID_VALUE;
  CUdevice dev = 0;
  CUresult r = PHOS_REAL(cuCtxGetDevice)(&dev);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(mu_);
  Device* d = device_locked(dev, &r);
  if (!d) return r;
  CUdeviceptr va = 0;
  if (r = reserve_locked(dev, *d, size, &va); r != CUDA_SUCCESS) return r;
  CUmemGenericAllocationHandle h = 0;
  r = PHOS_REAL(cuMemImportFromShareableHandle)(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r == CUDA_SUCCESS) {
    r = map_with_access(va, size, h, access_for_locked(dev));
    if (r != CUDA_SUCCESS) PHOS_REAL(cuMemRelease)(h);
  }
  if (r != CUDA_SUCCESS) {
    stderr_line("phos: %s\n",
                cu_error(("map allocation " + std::to_string(src.owner_allocation) + " of process " +
                  std::to_string(src.owner_pid) + " (CUDA IPC)").c_str(), r).c_str());
    d->va.free(va, size);
    return r;
  }
  Unit& u = add_unit_locked(dev, va, size, h, image::kAllocIpcImported);
  // Imported memory cannot be exported again: a dump lists this fd.
  u.source_fd.reset(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  u.ipc = src;
  u.ipc_opens = 1;
  if (observer_) observer_->buffer_added(u.va, u.size, u.id);
  *out = u.va + offset;
  return CUDA_SUCCESS;
}

bool DeviceMemory::ipc_close(CUdeviceptr ptr, bool* last, agent::IpcSource* src) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, u] : units_) {
    if (!u.ipc || ptr < u.va || ptr >= u.va + u.size) continue;
    *last = --u.ipc_opens == 0;
    *src = *u.ipc;
    if (*last) {
      if (observer_) observer_->buffer_removed(u.va);
      drop_unit_locked(u);
    }
    return true;
  }
  return false;
}

Result<void> DeviceMemory::with_contexts(const std::function<Result<void>(CUdevice, Device&)>& fn) {
  for (auto& [dev, d] : devices_) PHOS_TRY(in_context(d.ctx, [&] { return fn(dev, d); }));
  return {};
}

Result<void> DeviceMemory::synchronize() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    PHOS_TRY(with_contexts([](CUdevice dev, Device&) -> Result<void> {
      CUresult r = PHOS_REAL(cuCtxSynchronize)();
      if (r != CUDA_SUCCESS) return make_error(cu_error(("device " + std::to_string(dev) + ": cuCtxSynchronize").c_str(), r), EIO);
      return {};
    }));
  }
  reclaim_deferred();
  return {};
}

Result<uint64_t> DeviceMemory::release_mappings(bool drop_handles) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t released = 0;
  PHOS_TRY(with_contexts([&](CUdevice dev, Device&) -> Result<void> {
    for (auto& [id, u] : units_) {
      if (u.device != dev) continue;
      if (u.mapped) {
        CUresult r = PHOS_REAL(cuMemUnmap)(u.va, u.size);
        if (r != CUDA_SUCCESS) return make_error(cu_error(("unmap allocation " + std::to_string(id)).c_str(), r), EIO);
        u.mapped = false;
        released += u.size;
      }
      if (drop_handles && u.handle) {
        PHOS_REAL(cuMemRelease)(u.handle);
        u.handle = 0;
      }
      // These fds are open files of the driver's device: none may be left
      // in the process when CRIU dumps it.
      if (drop_handles) u.source_fd.reset();
      // The program's own reference to its VMM memory goes too; remap
      // hands it a new one behind the same (virtual) handle value.
      auto uh = u.user_handle ? user_handles_.find(u.user_handle) : user_handles_.end();
      if (drop_handles && uh != user_handles_.end() && uh->second.held && !uh->second.dropped) {
        PHOS_REAL(cuMemRelease)(uh->second.real);
        uh->second.dropped = true;
      }
    }
    return {};
  }));
  return released;
}

Result<uint64_t> DeviceMemory::remap(std::span<const uint64_t> ids, std::vector<UniqueFd> fds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!fds.empty() && fds.size() != ids.size())
    return make_error(std::to_string(fds.size()) + " fds for " + std::to_string(ids.size()) + " allocations");
  uint64_t mapped = 0;
  PHOS_TRY(with_contexts([&](CUdevice dev, Device&) -> Result<void> {
    for (size_t i = 0; i < fds.size(); i++) {
      auto it = units_.find(ids[i]);
      if (it == units_.end()) return make_error("remap: no allocation " + std::to_string(ids[i]), ENOENT);
      Unit& u = it->second;
      if (u.device != dev) continue;
      CUmemGenericAllocationHandle h = 0;
      CUresult r = PHOS_REAL(cuMemImportFromShareableHandle)(
          &h, reinterpret_cast<void*>(static_cast<intptr_t>(fds[i].get())), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      if (r != CUDA_SUCCESS) return make_error(cu_error(("import allocation " + std::to_string(u.id)).c_str(), r), EIO);
      if (u.mapped) PHOS_REAL(cuMemUnmap)(u.va, u.size);
      if (u.handle) PHOS_REAL(cuMemRelease)(u.handle);
      u.handle = h;
      u.mapped = false;
      u.source_fd.reset(::fcntl(fds[i].get(), F_DUPFD_CLOEXEC, 0));
    }
    // With fds, the request maps exactly its allocations: the plugin sends
    // them in pages (one SCM_RIGHTS message holds at most 253 fds), and a
    // later page's allocations have no memory yet. Without, every unit
    // mapped again (a leave-running dump whose handles were kept).
    std::vector<Unit*> targets;
    if (fds.empty()) {
      for (auto& [id, u] : units_) targets.push_back(&u);
    } else {
      for (uint64_t id : ids) targets.push_back(&units_.at(id));  // each found above
    }
    for (Unit* unit : targets) {
      Unit& u = *unit;
      const uint64_t id = u.id;
      if (u.device != dev || u.mapped) continue;
      if (!u.handle) return make_error("remap: allocation " + std::to_string(id) + " has no memory to map", ENOENT);
      CUresult r = map_with_access(u.va, u.size, u.handle, u.access);
      if (r != CUDA_SUCCESS) return make_error(cu_error(("map allocation " + std::to_string(id)).c_str(), r), EIO);
      u.mapped = true;
      mapped += u.size;
      auto uh = u.user_handle ? user_handles_.find(u.user_handle) : user_handles_.end();
      if (uh != user_handles_.end() && uh->second.dropped) {
        CUmemGenericAllocationHandle program_ref = 0;
        r = PHOS_REAL(cuMemRetainAllocationHandle)(&program_ref, reinterpret_cast<void*>(u.va));
        if (r != CUDA_SUCCESS) return make_error(cu_error("retain the program's handle", r), EIO);
        uh->second.real = program_ref;
        uh->second.dropped = false;
      }
    }
    return {};
  }));
  return mapped;
}

void DeviceMemory::user_created(CUmemGenericAllocationHandle h, size_t size, CUdevice device) {
  std::lock_guard<std::mutex> lock(mu_);
  user_handles_[h] = UserHandle{h, size, device, true, false};
  any_user_handles_ = true;
}

void DeviceMemory::user_released(CUmemGenericAllocationHandle h) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = user_handles_.find(h);
  if (it == user_handles_.end()) return;
  it->second.held = false;
  for (const auto& [id, u] : units_)
    if (u.user_handle == h) return;  // still mapped: phos's own reference keeps it
  user_handles_.erase(it);
}

bool DeviceMemory::user_mapped(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h) {
  std::lock_guard<std::mutex> lock(mu_);
  auto uh = user_handles_.find(h);
  if (uh == user_handles_.end()) return true;  // memory phos does not know (imported from elsewhere)
  if (offset != 0 || size != uh->second.size) return false;
  CUmemGenericAllocationHandle own = 0;
  if (PHOS_REAL(cuMemRetainAllocationHandle)(&own, reinterpret_cast<void*>(va)) != CUDA_SUCCESS) return false;
  Unit& u = units_[next_id_];
  u.id = next_id_++;
  u.device = uh->second.device;
  u.va = va;
  u.size = size;
  u.handle = own;
  u.mapped = true;
  u.flags = image::kAllocUserVmm;
  u.user_handle = h;
  if (observer_) observer_->buffer_added(va, size, u.id);
  return true;
}

void DeviceMemory::user_unmapped(CUdeviceptr va, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = units_.begin(); it != units_.end();) {
    Unit& u = it->second;
    if (u.user_handle && u.va >= va && u.va + u.size <= va + size) {
      if (u.handle) PHOS_REAL(cuMemRelease)(u.handle);
      if (observer_) observer_->buffer_removed(u.va);
      if (unit_dropped_) unit_dropped_(u.va);
      CUmemGenericAllocationHandle h = u.user_handle;
      it = units_.erase(it);
      auto uh = user_handles_.find(h);
      if (uh != user_handles_.end() && !uh->second.held) {
        bool mapped_elsewhere = false;
        for (const auto& [id, other] : units_) mapped_elsewhere |= other.user_handle == h;
        if (!mapped_elsewhere) user_handles_.erase(uh);
      }
    } else {
      ++it;
    }
  }
}

void DeviceMemory::user_access(CUdeviceptr va, size_t size, const CUmemAccessDesc* desc, size_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, u] : units_)
    if (u.user_handle && u.va >= va && u.va + u.size <= va + size) u.access.assign(desc, desc + count);
}

CUmemGenericAllocationHandle DeviceMemory::translate(CUmemGenericAllocationHandle h) {
  if (!any_user_handles_.load(std::memory_order_acquire)) return h;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = user_handles_.find(h);
  return it == user_handles_.end() ? h : it->second.real;
}

CUmemGenericAllocationHandle DeviceMemory::virtual_of(CUmemGenericAllocationHandle real) {
  if (!any_user_handles_.load(std::memory_order_acquire)) return real;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [virt, uh] : user_handles_)
    if (uh.real == real) return virt;
  return real;
}

}  // namespace phos::hooks
