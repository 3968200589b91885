// The SASS-level validator's device side (sass_validation.h): patch functions
// that NVIDIA's Sanitizer patching API calls before every global-memory
// access and bulk copy to global memory of a patched kernel. Each checks the
// access against the launch's range table (ptx/range_table.h: the same
// contract as the PTX twins) and counts the writes that fall outside it.
// The access itself still happens: validation reports, it does not change
// the program.
//
// Built with `nvcc --fatbin --keep-device-functions -Xptxas
// --compile-as-tools-patch` and embedded into libphos.so. The signatures and
// values are the ones sanitizer_patching.h documents (SanitizerCallback-
// MemoryAccess, SanitizerCallbackBulkCopySharedToGlobal,
// SANITIZER_MEMORY_DEVICE_FLAG_WRITE = 0x2, SANITIZER_PATCH_SUCCESS = 0);
// the header itself is not needed to build them, and the GPU suite checks
// them against it (test/gpu/sanitizer_abi_check.cc).
#include <cstdint>

namespace {

constexpr uint32_t kFlagWrite = 0x2;  // SANITIZER_MEMORY_DEVICE_FLAG_WRITE
constexpr int kContinue = 0;          // SANITIZER_PATCH_SUCCESS

// Words of the range table (ptx/range_table.h).
constexpr int kCount = 0, kViolations = 1, kFirstAddress = 2, kFirstInstruction = 3, kRanges = 4;

__device__ __forceinline__ void check(const void* userdata, uint64_t pc, uint64_t start, uint64_t bytes) {
  // No table: the kernel is in a patched module but this launch is not
  // validated.
  if (userdata == nullptr) return;
  auto* table = static_cast<unsigned long long*>(const_cast<void*>(userdata));
  const uint64_t end = start + bytes, n = __ldg(&table[kCount]);
  for (uint64_t i = 0; i < n; ++i)
    if (start >= __ldg(&table[kRanges + 2 * i]) && end <= __ldg(&table[kRanges + 2 * i + 1])) return;
  if (atomicAdd(&table[kViolations], 1ull) == 0) {
    table[kFirstAddress] = start;
    table[kFirstInstruction] = pc;
  }
}

}  // namespace

// SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS: loads, stores and atomics to
// global memory (generic ones that resolve to it included); writes checked.
extern "C" __device__ __noinline__ int phos_sass_global_access(void* userdata, uint64_t pc, void* ptr, uint32_t size,
                                                               uint32_t flags, const void* /*new_value*/) {
  if (flags & kFlagWrite) check(userdata, pc, reinterpret_cast<uintptr_t>(ptr), size);
  return kContinue;
}

// SANITIZER_INSTRUCTION_BULK_COPY_SHARED_TO_GLOBAL and
// BULK_REDUCTION_SHARED_TO_GLOBAL (cp.async.bulk and cp.reduce.async.bulk
// from shared to global memory): `blocks` of 16 bytes written at `dst`.
// Tensor-map stores (cp.async.bulk.tensor) have no instrumentation point in
// CUDA 13.0's Sanitizer API: what a kernel writes that way is not checked.
extern "C" __device__ __noinline__ int phos_sass_bulk_to_global(void* userdata, uint64_t pc, uint64_t dst,
                                                                uint32_t /*src*/, uint32_t blocks) {
  check(userdata, pc, dst, uint64_t(blocks) * 16);
  return kContinue;
}
