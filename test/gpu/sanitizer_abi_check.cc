// Compiled on the GPU host (suite.sh sanitizer_abi) against the toolkit's
// sanitizer.h: phos declares the Sanitizer API it uses itself
// (cuda_hooks/include/phos/hooks/sass_validation.h) and writes its patch without the
// header (cuda_hooks/sass/sass_patch.cu), so CI can build both; this checks
// that every value and shape they rely on is the header's.
#include <sanitizer.h>

#include <cstdint>
#include <type_traits>

#include "phos/hooks/sass_validation.h"

namespace s = phos::hooks::sanitizer;

static_assert(sizeof(SanitizerResult) == sizeof(s::Result) && SANITIZER_SUCCESS == s::kSuccess);
static_assert(sizeof(Sanitizer_InstructionId) == sizeof(int));
static_assert(SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS == s::kGlobalMemoryAccess);
static_assert(SANITIZER_INSTRUCTION_BULK_COPY_SHARED_TO_GLOBAL == s::kBulkCopySharedToGlobal);
static_assert(SANITIZER_INSTRUCTION_BULK_REDUCTION_SHARED_TO_GLOBAL == s::kBulkReductionSharedToGlobal);
static_assert(sizeof(Sanitizer_SubscriberHandle) == sizeof(s::Subscriber));
static_assert(sizeof(Sanitizer_CallbackDomain) == sizeof(int) && sizeof(Sanitizer_CallbackId) == sizeof(uint32_t));

// The functions phos resolves with dlsym: the same parameters, up to the
// enum and handle types checked above.
static_assert(std::is_same_v<decltype(&sanitizerAddPatches), SanitizerResult (*)(const void*, CUcontext)>);
static_assert(std::is_same_v<decltype(&sanitizerPatchInstructions),
                             SanitizerResult (*)(Sanitizer_InstructionId, CUmodule, const char*)>);
static_assert(std::is_same_v<decltype(&sanitizerPatchModule), SanitizerResult (*)(CUmodule)>);
static_assert(std::is_same_v<decltype(&sanitizerUnpatchModule), SanitizerResult (*)(CUmodule)>);
static_assert(std::is_same_v<decltype(&sanitizerSetCallbackData), SanitizerResult (*)(CUfunction, const void*)>);
static_assert(std::is_same_v<decltype(&sanitizerSubscribe),
                             SanitizerResult (*)(Sanitizer_SubscriberHandle*, Sanitizer_CallbackFunc, void*)>);
static_assert(std::is_same_v<decltype(&sanitizerGetResultString), SanitizerResult (*)(SanitizerResult, const char**)>);

// The patch's signatures and the values it uses (sass_patch.cu).
static_assert(std::is_same_v<SanitizerCallbackMemoryAccess,
                             SanitizerPatchResult (*)(void*, uint64_t, void*, uint32_t, uint32_t, const void*)>);
static_assert(std::is_same_v<SanitizerCallbackBulkCopySharedToGlobal,
                             SanitizerPatchResult (*)(void*, uint64_t, uint64_t, uint32_t, uint32_t)>);
static_assert(std::is_same_v<SanitizerCallbackBulkReductionSharedToGlobal,
                             SanitizerPatchResult (*)(void*, uint64_t, uint64_t, uint32_t, uint32_t)>);
static_assert(sizeof(SanitizerPatchResult) == sizeof(int) && SANITIZER_PATCH_SUCCESS == 0);
static_assert(SANITIZER_MEMORY_DEVICE_FLAG_WRITE == 0x2);

int main() { return 0; }
