// The code inside a CUDA module image, read without the driver: the fatbin
// container (magic 0xBA55ED50) and its entries (PTX, ELF cubins, LTO IR),
// plain or compressed (LZ4, ZSTD), and in each cubin the kernels with their
// parameters from .nv.info (EIATTR_KPARAM_INFO).
//
// Errors: every function returns false and says in *error what is wrong and
// where (offset, entry), never reads outside the bytes it is given, and
// never trusts a size field before checking it against them (the images come
// from other people's binaries).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace phos::speculation {

inline constexpr uint32_t kFatbinMagic = 0xBA55ED50;
inline constexpr uint32_t kFatbinWrapperMagic = 0x466243B1;  // cudart's __fatBinC_Wrapper_t

enum class FatbinEntryKind : uint8_t { kPtx, kElf, kLtoIr, kUnknown };
enum class Compression : uint8_t { kNone, kLz4, kZstd, kUnknown };
const char* fatbin_entry_kind_name(FatbinEntryKind k);
const char* compression_name(Compression c);

struct FatbinEntry {
  FatbinEntryKind kind = FatbinEntryKind::kUnknown;
  uint32_t arch = 0;           // SM version, e.g. 90 for sm_90 / compute_90
  uint16_t version_major = 0;  // the entry's version fields (PTX ISA version for PTX)
  uint16_t version_minor = 0;
  Compression compression = Compression::kNone;
  uint64_t offset = 0;         // of the payload, from the start of the bytes read_fatbin was given
  // As stored, inside those bytes: the compressed bytes where compression
  // != kNone (without the zero padding to 8 bytes that follows them), else
  // the contents with that padding (nothing says how much there is).
  std::span<const std::byte> payload;
  uint64_t uncompressed_size = 0;  // the contents' size (payload's where not compressed)
  std::string identifier;      // the entry's name (source file, with -G) where it has one
};

// The entries of the fatbin at the start of `bytes` (bytes may extend past
// its end: the size comes from the header). Several fatbins laid end to end
// (what nvcc -fatbin writes for relocatable code, what a .nv_fatbin section
// holds) are all read.
bool read_fatbin(std::span<const std::byte> bytes, std::vector<FatbinEntry>* entries, std::string* error);

// The entry's contents, decompressed where it is compressed (exactly
// uncompressed_size bytes, at most 1 GiB).
bool entry_contents(const FatbinEntry& entry, std::vector<std::byte>* out, std::string* error);

struct CubinParam {
  uint32_t ordinal = 0;
  uint32_t offset = 0;  // in the argument buffer
  uint32_t size = 0;
  uint32_t log_alignment = 0;  // "Pointee's logAlignment" in cuobjdump's words
  // Whether the cubin says the parameter is a pointer. It says so only for a
  // pointer the PTX declared `.ptr` (nvcc 13 does for sm_100 and newer, not
  // for sm_90 and older; hand-written PTX and other compilers may): then
  // both are true. It never says a parameter is not one (a pointer without
  // `.ptr`, an integer, a struct holding pointers all look the same), so
  // is_pointer is never false where pointer_known is true.
  bool pointer_known = false;
  bool is_pointer = false;
  bool operator==(const CubinParam&) const = default;
};

struct CubinKernel {
  std::string name;  // as in the symbol table: mangled, or plain for extern "C"
  std::vector<CubinParam> params;  // by ordinal
  uint32_t param_bytes = 0;        // EIATTR_PARAM_CBANK / CBANK_PARAM_SIZE, 0 if absent
};

// The kernels (STO_CUDA_ENTRY functions, in symbol table order) of an ELF
// cubin (64-bit, EM_CUDA) and their parameters, by ordinal, from each
// kernel's .nv.info.<name> section; a kernel without one has none.
bool read_cubin_kernels(std::span<const std::byte> elf, std::vector<CubinKernel>* kernels, std::string* error);

// SM version of an ELF cubin (from e_flags), 0 if not a cubin.
uint32_t cubin_arch(std::span<const std::byte> elf);

// The kernels of a module image as a program hands it to the driver: a
// fatbin, cudart's fatbin wrapper (pointer to the fatbin inside), or an ELF
// cubin; from the cubin for `arch` (the newest one not newer than arch of the
// same major version where there is no exact match). false where the image
// has no cubin that runs on arch (PTX only: the kernels list stays empty and
// error says so).
//
// The image has no length: a fatbin's comes from its header, a cubin's from
// its ELF header and tables. Only the one fatbin at `image` is read, not what
// may follow it: in an executable's .nv_fatbin section the next one is
// another translation unit's, registered as a module of its own.
bool module_kernels(const void* image, uint32_t arch, std::vector<CubinKernel>* kernels, std::string* error);

// The PTX of a module image (a fatbin, or cudart's wrapper of one) that a
// GPU of SM version `arch` can JIT: the newest compute_XX entry with
// XX <= arch, decompressed, as text. false where there is none.
bool module_ptx(const void* image, uint32_t arch, std::string* ptx, std::string* error);

}  // namespace phos::speculation
