// Programs that use the VMM API themselves (PyTorch with expandable segments):
// their memory is created exportable, their mappings become checkpoint units,
// and their handle values are translated where phos replaced the memory.
#include "driver/driver.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;

namespace {
// What the VMM hooks use: the gate, the device memory (handles and
// mappings), the counters, the calls that make a checkpoint impossible.
struct VmmDeps : RuntimeView {
  using RuntimeView::counters;
  using RuntimeView::gate;
  using RuntimeView::memory;
  using RuntimeView::unsupported;
};
}  // namespace

extern "C" PHOS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                            const CUmemAllocationProp* prop, unsigned long long flags) {
  const VmmDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemCreate));
  auto real = PHOS_REAL(cuMemCreate);
  if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real(handle, size, prop, flags);
  // Ask for memory phos can export as an fd; fall back to what the program
  // asked for where the driver refuses the combination.
  CUmemAllocationProp exportable = *prop;
  exportable.requestedHandleTypes =
      CUmemAllocationHandleType(exportable.requestedHandleTypes | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUresult r = rt.memory().create("cuMemCreate", size, [&] { return real(handle, size, &exportable, flags); });
  if (r == CUDA_SUCCESS) {
    rt.memory().user_created(*handle, size, prop->location.id);
    rt.counters().count(Counter::kUserVmmCreates);
    return r;
  }
  // Out of memory (the pool asked back already): the same without export
  // would not fit either.
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return r;
  r = real(handle, size, prop, flags);
  if (r == CUDA_SUCCESS) rt.unsupported().note("cuMemCreate of memory that cannot be exported");
  return r;
}

extern "C" PHOS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  const VmmDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemRelease));
  CUresult r = PHOS_REAL(cuMemRelease)(rt.memory().translate(handle));
  if (r == CUDA_SUCCESS) rt.memory().user_released(handle);
  return r;
}

extern "C" PHOS_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                         unsigned long long flags) {
  const VmmDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemMap));
  CUresult r = PHOS_REAL(cuMemMap)(ptr, size, offset, rt.memory().translate(handle), flags);
  if (r == CUDA_SUCCESS && !rt.memory().user_mapped(ptr, size, offset, handle))
    rt.unsupported().note("cuMemMap of part of an allocation");
  return r;
}

extern "C" PHOS_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  const VmmDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemUnmap));
  CUresult r = PHOS_REAL(cuMemUnmap)(ptr, size);
  if (r == CUDA_SUCCESS) rt.memory().user_unmapped(ptr, size);
  return r;
}

extern "C" PHOS_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  const VmmDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemSetAccess));
  CUresult r = PHOS_REAL(cuMemSetAccess)(ptr, size, desc, count);
  if (r == CUDA_SUCCESS) rt.memory().user_access(ptr, size, desc, count);
  return r;
}

extern "C" PHOS_EXPORT CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                                             CUmemAllocationHandleType type, unsigned long long flags) {
  const VmmDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemExportToShareableHandle));
  return PHOS_REAL(cuMemExportToShareableHandle)(shareable, rt.memory().translate(handle), type, flags);
}

extern "C" PHOS_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                                       CUmemGenericAllocationHandle handle) {
  const VmmDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemGetAllocationPropertiesFromHandle));
  return PHOS_REAL(cuMemGetAllocationPropertiesFromHandle)(prop, rt.memory().translate(handle));
}

extern "C" PHOS_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  const VmmDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuMemRetainAllocationHandle));
  CUresult r = PHOS_REAL(cuMemRetainAllocationHandle)(handle, addr);
  if (r == CUDA_SUCCESS && handle) *handle = rt.memory().virtual_of(*handle);
  return r;
}
