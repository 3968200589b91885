// The code inside a CUDA module image, read without the driver: the fatbin
// container (magic 0xBA55ED50) and its entries (PTX, ELF cubins, LTO IR),
// plain or compressed (LZ4, ZSTD), and in each cubin the kernels with their
// parameters from .nv.info (EIATTR_KPARAM_INFO); and what a module image
// handed to the driver is (its kind, size and content hash), for the hooks'
// module registry. The one reader of these formats in phos.
//
// Errors: every reading function returns an ImageResult: the value, or an
// ImageError whose fault says what kind of failure it is (callers decide on
// that, never on the text) and whose message says what is wrong and where
// (offset, entry). The reader never reads outside the bytes it is given, and
// never trusts a size field before checking it against them (the images come
// from other people's binaries).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "phos/support/result.h"

namespace phos::speculation {

inline constexpr uint32_t kFatbinMagic = 0xBA55ED50;
inline constexpr uint32_t kFatbinWrapperMagic = 0x466243B1;  // cudart's __fatBinC_Wrapper_t
// No fatbin or cubin comes near: a size beyond it in an image that has no
// length of its own (one handed over by pointer) is taken for a damaged
// header, and a module file beyond it is not read.
inline constexpr uint64_t kMaxImageSize = uint64_t(4) << 30;
// Larger than any real entry's contents (a cubin of hundreds of MB is
// already rare); bounds what a corrupt uncompressed size can make the reader
// allocate.
inline constexpr uint64_t kMaxEntryContentSize = uint64_t(1) << 30;

// Why an image, fatbin, entry or cubin was not read.
enum class ImageFault : uint8_t {
  kUnrecognized,            // not what the function reads: PTX text, a null pointer, other bytes
  kNoEntryForArch,          // has code, but none for this GPU (cubins or PTX for other SM versions)
  kPtxOnly,                 // a fatbin without any cubin (PTX or LTO IR only: code the driver JITs)
  kMalformed,               // headers, tables, records or compressed data that do not hold together
  kUnsupportedVersion,      // a fatbin or wrapper version this reader does not know
  kUnsupportedCompression,  // an entry flagged both LZ4 and ZSTD
  kTooLarge,                // sizes beyond kMaxImageSize or kMaxEntryContentSize
};
const char* image_fault_name(ImageFault f);

struct ImageError : Error {
  ImageFault fault = ImageFault::kMalformed;
};
inline ImageError make_image_error(ImageFault fault, std::string message) {
  ImageError e;
  e.message = std::move(message);
  e.fault = fault;
  return e;
}
template <class T>
using ImageResult = Result<T, ImageError>;

enum class FatbinEntryKind : uint8_t { kPtx, kElf, kLtoIr, kUnknown };
enum class Compression : uint8_t { kNone, kLz4, kZstd, kUnknown };
const char* fatbin_entry_kind_name(FatbinEntryKind k);
// How a fatbin entry is compressed: none, LZ4, ZSTD. Not an image chunk's
// (image::chunk_compression_name).
const char* fatbin_compression_name(Compression c);

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
// holds) are all read. Bytes that do not start with one are kUnrecognized.
ImageResult<std::vector<FatbinEntry>> read_fatbin(std::span<const std::byte> bytes);

// The entry's contents, decompressed where it is compressed (exactly
// uncompressed_size bytes, at most kMaxEntryContentSize).
ImageResult<std::vector<std::byte>> entry_contents(const FatbinEntry& entry);

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
// kernel's .nv.info.<name> section; a kernel without one has none. Bytes
// that are no such ELF file are kUnrecognized.
ImageResult<std::vector<CubinKernel>> read_cubin_kernels(std::span<const std::byte> elf);

// SM version of an ELF cubin (from e_flags), 0 if not a cubin.
uint32_t cubin_arch(std::span<const std::byte> elf);

// ---- module images, as a program hands them to the driver

enum class ModuleKind : uint8_t { kUnknown, kFatbin, kCubin, kPtx, kFile };
const char* module_kind_name(ModuleKind k);

// Where a module image's bytes are. The image has no length of its own; by
// kind: a fatbin's comes from its header (header size + fat size), reached
// directly or through cudart's wrapper (__fatBinC_Wrapper_t, magic
// 0x466243B1, pointing at the fatbin); an ELF cubin's is the end of the
// furthest of its ELF header, program and section header tables and
// sections with contents (what the headers say; no section is read); PTX is
// text up to its NUL (the driver requires one). Only the one fatbin at the
// image is covered, not what may follow it: in an executable's .nv_fatbin
// section the next one is another translation unit's, registered as a
// module of its own.
struct ImageExtent {
  ModuleKind kind = ModuleKind::kUnknown;  // kFatbin, kCubin or kPtx
  // The image: for cudart's wrapper the fatbin it points at; PTX without its NUL.
  std::span<const std::byte> bytes;
};
// Anything that is neither a fatbin, cudart's wrapper nor an ELF file is
// taken for PTX; a null image is kUnrecognized.
ImageResult<ImageExtent> image_extent(const void* image);
// The image at the start of `bytes`, which may extend past its end; nothing
// outside them is read. cudart's wrapper is kUnrecognized here (its pointer
// leads outside the bytes), and so is text without a NUL in them.
ImageResult<ImageExtent> image_extent(std::span<const std::byte> bytes);

// What a module load records: kind, size and a 64-bit content hash, so that
// a checkpoint can say which code a process had loaded and a restore can
// tell whether it is the same.
struct ModuleImage {
  ModuleKind kind = ModuleKind::kUnknown;
  uint64_t size = 0;
  uint64_t hash = 0;
};
// The image at `image` (given to cuModuleLoadData and the like, or cudart's
// fatbin wrapper): its extent and the hash of its bytes; kUnknown, without
// size or hash, where image_extent refuses it.
ModuleImage identify_image(const void* image);
// A module file (cuModuleLoad, cuLibraryLoadFromFile): kind kFile, the
// file's size and the hash of its bytes; kUnknown where it cannot be read or
// is larger than kMaxImageSize.
ModuleImage identify_file(const char* path);

// 64-bit hash of `n` bytes, eight at a time (fast enough for the hundreds of
// MiB of fatbins a PyTorch process registers).
uint64_t content_hash(const void* data, size_t n);

// The kernels of a module image (a fatbin, cudart's wrapper of one, or an
// ELF cubin; image_extent says how far each goes), from the cubin for `arch`
// (the newest one not newer than arch of the same major version where there
// is no exact match). kNoEntryForArch where the image has cubins, none that
// runs on arch; kPtxOnly where a fatbin has none at all; kUnrecognized for
// PTX text and anything else that is no fatbin or cubin.
ImageResult<std::vector<CubinKernel>> module_kernels(const void* image, uint32_t arch);

// The PTX of a module image (a fatbin, or cudart's wrapper of one) that a
// GPU of SM version `arch` can JIT: the newest compute_XX entry with
// XX <= arch, decompressed, as text. kNoEntryForArch where there is none,
// kUnrecognized where the image is no fatbin.
ImageResult<std::string> module_ptx(const void* image, uint32_t arch);

}  // namespace phos::speculation
