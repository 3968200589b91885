// What a module image handed to the driver is, without the driver: its kind,
// its size and a 64-bit content hash, so that a checkpoint can say which
// code a process had loaded and a restore can tell whether it is the same.
//
// Sizes, by kind: a fatbin's comes from its header (magic 0xBA55ED50,
// header size + fat size), reached directly or through cudart's wrapper
// (__fatBinC_Wrapper_t, magic 0x466243B1); an ELF cubin's is the end of the
// furthest of its headers, section table and sections (what the ELF headers
// say; no section is read); PTX is NUL-terminated text, the API requires it.
// Anything else is recorded as unknown, without a hash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace phos::hooks {

enum class ModuleKind : uint8_t { kUnknown, kFatbin, kCubin, kPtx, kFile };
const char* module_kind_name(ModuleKind k);

struct ModuleImage {
  ModuleKind kind = ModuleKind::kUnknown;
  uint64_t size = 0;
  uint64_t hash = 0;
};

inline constexpr uint32_t kFatbinMagic = 0xBA55ED50;
inline constexpr uint32_t kFatbinWrapperMagic = 0x466243B1;

// The image at `data` (an image given to cuModuleLoadData and the like, or
// cudart's fatbin wrapper).
ModuleImage identify_image(const void* data);
// A module file (cuModuleLoad, cuLibraryLoadFromFile): kind kFile, the
// file's size and the hash of its bytes; kUnknown where it cannot be read.
ModuleImage identify_file(const char* path);

// 64-bit hash of `n` bytes, eight at a time (fast enough for the hundreds of
// MiB of fatbins a PyTorch process registers).
uint64_t content_hash(const void* data, size_t n);

}  // namespace phos::hooks
