// The probe's patch: checks each global access against a phos range table
// (ptx/range_table.h's layout: count, violations, first_address,
// first_instruction, then [start, end) pairs), counting writes outside it.
#include <sanitizer_patching.h>
#include <cstdint>

extern "C" __device__ __noinline__ SanitizerPatchResult probe_global_access(void* userdata, uint64_t pc, void* ptr,
                                                                            uint32_t size, uint32_t flags,
                                                                            const void* /*new_value*/) {
  auto* table = static_cast<unsigned long long*>(userdata);
  if (table == nullptr) return SANITIZER_PATCH_SUCCESS;
  // Probe only: words 62 and 63 gather the flags seen and count the calls.
  atomicOr(&table[62], (unsigned long long)flags);
  atomicAdd(&table[63], 1ull);
  if (!(flags & SANITIZER_MEMORY_DEVICE_FLAG_WRITE)) return SANITIZER_PATCH_SUCCESS;
  unsigned long long start = reinterpret_cast<uintptr_t>(ptr), end = start + size, n = table[0];
  for (unsigned long long i = 0; i < n; ++i)
    if (start >= table[4 + 2 * i] && end <= table[5 + 2 * i]) return SANITIZER_PATCH_SUCCESS;
  if (atomicAdd(&table[1], 1ull) == 0) {
    table[2] = start;
    table[3] = pc;
  }
  return SANITIZER_PATCH_SUCCESS;
}
