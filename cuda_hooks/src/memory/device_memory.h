// Every device allocation of the program, made by phos: VMM memory created
// exportable as POSIX fds and mapped in a VA arena phos reserves on each
// device. Large requests get a physical unit of their own (rounded to the
// allocation granularity, as the driver rounds them); small ones are
// sub-allocated from 2 MiB slabs. A unit is what a checkpoint exports, copies
// and maps back; a block is what the program holds.
//
// Programs that use the VMM API themselves (PyTorch's expandable segments)
// keep doing so; each of their mappings becomes a unit too, backed by a
// handle reference of phos's own. The handle values such a program holds are
// virtual: equal to the driver's until a remap replaces the memory (after a
// restore), then translated, so they stay valid.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <sys/types.h>
#include <vector>

#include "phos/hooks/agent_backend.h"
#include "phos/hooks/range_allocator.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::hooks {

// Told of every buffer the program can address: its allocations (blocks)
// and its own VMM mappings; called with DeviceMemory's lock held.
class BufferObserver {
 public:
  virtual ~BufferObserver() = default;
  virtual void buffer_added(uint64_t start, uint64_t size, uint64_t unit) = 0;
  virtual void buffer_removed(uint64_t start) = 0;
};

class DeviceMemory {
 public:
  // Replays the buffers there are to `o`, then keeps it told; nullptr stops.
  void observe(BufferObserver* o);
  // Told (under the lock) whenever a unit's memory goes away from its
  // address: a concurrent dump's copy window forgets the address then. Set
  // once, before the memory is used (the runtime does, as it is made).
  using UnitDropped = std::function<void(uint64_t address)>;
  void on_unit_dropped(UnitDropped fn) { unit_dropped_ = std::move(fn); }
  // Asked when creating memory fails for lack of it: true when memory may
  // have come free (a concurrent dump's copy-on-write pool given back), and
  // the creation is tried once more. Set once, as on_unit_dropped.
  using OutOfMemory = std::function<bool(const char* call, uint64_t bytes)>;
  void on_out_of_memory(OutOfMemory fn) { out_of_memory_ = std::move(fn); }
  // Every creation of device memory, phos's own and each one forwarded to
  // the driver (`call` names it in the log): `create()`, and once more where
  // it found the GPU full and memory may have come free since.
  template <class Create>
  CUresult create(const char* call, uint64_t bytes, Create&& create) const {
    CUresult r = create();
    if (r == CUDA_ERROR_OUT_OF_MEMORY && out_of_memory_ && out_of_memory_(call, bytes)) r = create();
    return r;
  }

  static constexpr uint64_t kSlabMaxRequest = 512u << 10;  // larger requests get their own unit
  static constexpr uint64_t kBlockAlignment = 256;         // what cudaMalloc guarantees

  // On the calling thread's current context's device; `call` names the
  // program's call where the GPU is found full.
  CUresult allocate(CUdeviceptr* out, size_t size, uint32_t flags, const char* call);
  // false: not ours (the caller forwards to the driver).
  bool free(CUdeviceptr ptr, CUresult* result);
  // Frees `ptr` once the work queued on `stream` so far is done.
  bool free_after(CUdeviceptr ptr, CUstream stream, bool per_thread_stream, CUresult* result);
  void reclaim_deferred();
  bool address_range(CUdeviceptr p, CUdeviceptr* base, size_t* size);

  // The program's own VMM calls (after the driver call succeeded).
  void user_created(CUmemGenericAllocationHandle h, size_t size, CUdevice device);
  void user_released(CUmemGenericAllocationHandle h);
  // false: this mapping cannot be checkpointed (part of an allocation).
  bool user_mapped(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h);
  void user_unmapped(CUdeviceptr va, size_t size);
  void user_access(CUdeviceptr va, size_t size, const CUmemAccessDesc* desc, size_t count);
  // Peer access (cuCtxEnablePeerAccess from a context of `accessor` to one of
  // `owner`): phos's memory on `owner` is mapped for its own device only, so
  // each grant is applied to every phos mapping there, now and later, and
  // again when the memory is mapped back after a checkpoint. The program's
  // own VMM mappings keep the access the program set.
  CUresult peer_access_enabled(CUdevice owner, CUdevice accessor);
  CUresult peer_access_disabled(CUdevice owner, CUdevice accessor);
  // The driver's handle for a program's handle value, and back.
  CUmemGenericAllocationHandle translate(CUmemGenericAllocationHandle h);
  CUmemGenericAllocationHandle virtual_of(CUmemGenericAllocationHandle real);

  // CUDA IPC served by phos (hooks/ipc.cc). The exporter's side: the block
  // that holds `ptr` (its unit, where it starts in it, its size); nothing
  // for memory that is not a phos block.
  struct IpcBlock {
    uint64_t unit = 0, offset = 0, size = 0;
  };
  std::optional<IpcBlock> ipc_block(CUdeviceptr ptr) const;
  // An fd of unit `id` for process `importer`, which is recorded as holding
  // it until ipc_closed (or its end); *va = the unit's start.
  Result<agent::IpcOpenReply> ipc_export(uint64_t id, pid_t importer, UniqueFd* fd, CUdeviceptr* va);
  void ipc_closed(uint64_t id, pid_t importer);
  // The units live importers hold.
  std::vector<agent::IpcExport> ipc_exports() const;
  // The importer's side: the unit `src` names mapped here (imported from
  // `fd`, `size` bytes) on the current context's device; *out = its start +
  // `offset`. A unit opened before is opened again (counted), fd unused.
  CUresult ipc_import(const agent::IpcSource& src, int fd, size_t size, uint64_t offset, CUdeviceptr* out);
  // Whether `src` is mapped here already: then *out as ipc_import gives it.
  bool ipc_reopen(const agent::IpcSource& src, uint64_t offset, CUdeviceptr* out);
  // Closes the mapping that holds `ptr` (false: none); *last says whether
  // it was the last open of it, then *src names what the exporter is told.
  bool ipc_close(CUdeviceptr ptr, bool* last, agent::IpcSource* src);

  struct Stats {
    uint64_t units = 0, blocks = 0, requested_bytes = 0, physical_bytes = 0;
    uint32_t devices = 0;
    // Each device's UUID, where the driver gave it.
    std::vector<std::pair<CUdevice, std::array<uint8_t, 16>>> uuids;
  };
  Stats stats() const;
  // A device this process uses runs its contexts through MPS.
  bool mps_seen() const { return mps_seen_.load(); }

  // For the agent (its own thread; the gate is closed for the operations
  // that change mappings).
  std::vector<agent::Allocation> units() const;
  // The context of each device phos allocated on (the one current at its
  // first allocation).
  std::vector<CUcontext> contexts() const;
  Result<UniqueFd> export_unit(uint64_t id);
  Result<void> synchronize();
  Result<uint64_t> release_mappings(bool drop_handles);
  Result<uint64_t> remap(std::span<const uint64_t> ids, std::vector<UniqueFd> fds);

 private:
  struct Unit {
    uint64_t id = 0;
    CUdevice device = 0;
    CUdeviceptr va = 0;
    size_t size = 0;  // mapped bytes
    CUmemGenericAllocationHandle handle = 0;
    bool mapped = false;
    uint32_t flags = 0;
    std::unique_ptr<RangeAllocator> slab;  // for slabs: the space inside
    CUmemGenericAllocationHandle user_handle = 0;  // the program's (virtual) handle, for its mappings
    // Where the memory came from an fd (after a checkpoint): imported handles
    // cannot be exported again, so the fd itself is handed out. Dropped with
    // the memory for a checkpoint (it is an open file of /dev/nvidiactl).
    UniqueFd source_fd;
    std::vector<CUmemAccessDesc> access;            // what the program granted (its mappings)
    std::optional<agent::IpcSource> ipc;  // another process's memory (cuIpcOpenMemHandle)
    uint32_t ipc_opens = 0;               // how often the program opened it
  };
  struct UserHandle {
    CUmemGenericAllocationHandle real = 0;
    size_t size = 0;
    CUdevice device = 0;
    bool held = true;     // the program has not released it
    bool dropped = false; // phos released the program's reference for a checkpoint
  };
  struct Block {
    size_t size;
    uint64_t unit;
    size_t reserved;  // bytes taken from the slab (aligned)
  };
  struct Device {
    CUcontext ctx = nullptr;
    size_t granularity = 0;
    RangeAllocator va;
    std::optional<std::array<uint8_t, 16>> uuid;
  };
  struct Deferred {
    CUdeviceptr ptr;
    CUevent done;
  };

  Device* device_locked(CUdevice dev, CUresult* err);
  std::vector<CUmemAccessDesc> access_for_locked(CUdevice dev) const;
  CUresult set_peer_access_locked(CUdevice owner, CUdevice accessor, CUmemAccess_flags flags);
  CUresult grow_arena_locked(CUdevice dev, Device& d, size_t at_least);
  CUresult reserve_locked(CUdevice dev, Device& d, size_t size, CUdeviceptr* va);
  Unit& add_unit_locked(CUdevice dev, CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h, uint32_t flags);
  CUresult new_unit_locked(CUdevice dev, Device& d, size_t size, uint32_t flags, const char* call, Unit** out);
  void drop_unit_locked(Unit& u);
  CUresult free_locked(std::map<CUdeviceptr, Block>::iterator it);
  Result<void> with_contexts(const std::function<Result<void>(CUdevice, Device&)>& fn);

  mutable std::mutex mu_;
  std::map<CUdeviceptr, Block> blocks_;
  std::map<uint64_t, Unit> units_;
  std::map<CUdevice, Device> devices_;
  std::vector<Deferred> deferred_;
  std::map<CUmemGenericAllocationHandle, UserHandle> user_handles_;  // by virtual value
  std::map<CUdevice, std::set<CUdevice>> peers_;  // owner -> devices granted access to its memory
  std::multiset<std::pair<uint64_t, pid_t>> ipc_importers_;  // (unit, importer) per open served
  BufferObserver* observer_ = nullptr;  // under mu_
  UnitDropped unit_dropped_;
  OutOfMemory out_of_memory_;
  std::atomic<bool> any_user_handles_{false};
  std::atomic<bool> mps_seen_{false};
  uint64_t next_id_ = 1;
};

}  // namespace phos::hooks
