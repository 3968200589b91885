// Programs that use the VMM API themselves (PyTorch with expandable segments):
// their memory is created exportable, their mappings become checkpoint units,
// and their handle values are translated where phos replaced the memory.
#include "driver/driver.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;

extern "C" PHOS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                            const CUmemAllocationProp* prop, unsigned long long flags) {
  GatePass pass(runtime().gate);
  auto real = PHOS_REAL(cuMemCreate);
  if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return real(handle, size, prop, flags);
  // Ask for memory phos can export as an fd; fall back to what the program
  // asked for where the driver refuses the combination.
  CUmemAllocationProp exportable = *prop;
  exportable.requestedHandleTypes =
      CUmemAllocationHandleType(exportable.requestedHandleTypes | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUresult r = real(handle, size, &exportable, flags);
  if (r == CUDA_SUCCESS) {
    runtime().memory.user_created(*handle, size, prop->location.id);
    runtime().count(Counter::kUserVmmCreates);
    return r;
  }
  r = real(handle, size, prop, flags);
  if (r == CUDA_SUCCESS) runtime().note_unsupported("cuMemCreate of memory that cannot be exported");
  return r;
}

extern "C" PHOS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  GatePass pass(runtime().gate);
  CUresult r = PHOS_REAL(cuMemRelease)(runtime().memory.translate(handle));
  if (r == CUDA_SUCCESS) runtime().memory.user_released(handle);
  return r;
}

extern "C" PHOS_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                         unsigned long long flags) {
  GatePass pass(runtime().gate);
  CUresult r = PHOS_REAL(cuMemMap)(ptr, size, offset, runtime().memory.translate(handle), flags);
  if (r == CUDA_SUCCESS && !runtime().memory.user_mapped(ptr, size, offset, handle))
    runtime().note_unsupported("cuMemMap of part of an allocation");
  return r;
}

extern "C" PHOS_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  GatePass pass(runtime().gate);
  CUresult r = PHOS_REAL(cuMemUnmap)(ptr, size);
  if (r == CUDA_SUCCESS) runtime().memory.user_unmapped(ptr, size);
  return r;
}

extern "C" PHOS_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  GatePass pass(runtime().gate);
  CUresult r = PHOS_REAL(cuMemSetAccess)(ptr, size, desc, count);
  if (r == CUDA_SUCCESS) runtime().memory.user_access(ptr, size, desc, count);
  return r;
}

extern "C" PHOS_EXPORT CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                                             CUmemAllocationHandleType type, unsigned long long flags) {
  GatePass pass(runtime().gate);
  return PHOS_REAL(cuMemExportToShareableHandle)(shareable, runtime().memory.translate(handle), type, flags);
}

extern "C" PHOS_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                                       CUmemGenericAllocationHandle handle) {
  GatePass pass(runtime().gate);
  return PHOS_REAL(cuMemGetAllocationPropertiesFromHandle)(prop, runtime().memory.translate(handle));
}

extern "C" PHOS_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  GatePass pass(runtime().gate);
  CUresult r = PHOS_REAL(cuMemRetainAllocationHandle)(handle, addr);
  if (r == CUDA_SUCCESS && handle) *handle = runtime().memory.virtual_of(*handle);
  return r;
}
