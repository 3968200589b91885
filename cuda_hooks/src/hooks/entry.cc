// How programs reach the driver: cuInit, and cuGetProcAddress, through which
// cudart and the CUDA libraries get every other entry point (cudart asks it
// for cuGetProcAddress itself, so the answer must be ours too).
#include "driver/driver.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;

namespace {
// What cuInit uses: the gate, and the note that the program uses CUDA.
struct EntryDeps : RuntimeView {
  using RuntimeView::cuda_used;
  using RuntimeView::gate;
};
}  // namespace

extern "C" PHOS_EXPORT CUresult cuInit(unsigned int flags) {
  const EntryDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuInit));
  rt.cuda_used() = true;
  auto real = PHOS_REAL(cuInit);
  return real ? real(flags) : CUDA_ERROR_NO_DEVICE;
}

extern "C" PHOS_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                                                    cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  auto real = PHOS_REAL(cuGetProcAddress_v2);
  if (!real) return CUDA_ERROR_NOT_FOUND;
  CUresult r = real(symbol, pfn, cuda_version, flags, status);
  if (r == CUDA_SUCCESS && pfn) *pfn = driver::substitute(*pfn);
  return r;
}

extern "C" PHOS_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                                                 cuuint64_t flags) {
  using V1 = CUresult (*)(const char*, void**, int, cuuint64_t);
  auto real = reinterpret_cast<V1>(driver::real_gpa_v1());
  if (!real) return CUDA_ERROR_NOT_FOUND;
  CUresult r = real(symbol, pfn, cuda_version, flags);
  if (r == CUDA_SUCCESS && pfn) *pfn = driver::substitute(*pfn);
  return r;
}
