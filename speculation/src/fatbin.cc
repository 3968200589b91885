// The fatbin container and its entries, and the kernels of a module image.
//
// Layout, all little-endian, as nvcc 13 writes it (checked against -fatbin
// output for every --compress-mode, -rdc, lto_XX, -G and several archs):
//
//   fatbin header (16 bytes): u32 magic 0xBA55ED50, u16 version (1),
//     u16 header size (16), u64 size of what follows the header.
//   entries, back to back up to that size, each a header then its payload:
//     0x00 u16 kind: 1 PTX, 2 ELF, 8 LTO IR (NVVM bitcode)
//     0x02 u16 (0x0101 always)
//     0x04 u32 header size: 0x40, more where a string follows (PTX: ptxas
//              options; -G: the source file name)
//     0x08 u64 payload size, padded to 8 bytes
//     0x10 u32 compressed size: the payload's bytes without the padding, 0
//              where not compressed
//     0x14 u32 (0 for ELF, 0x40 for PTX and LTO IR)
//     0x18 u16 minor, u16 major version (ELF 1.8, PTX the ISA version)
//     0x1c u32 arch (90 for sm_90 / compute_90)
//     0x20 u32 identifier offset from the entry's start, u32 its length
//     0x28 u64 flags: 0x1 64-bit, 0x2 debug, 0x10 Linux host, 0x2000 LZ4,
//              0x8000 ZSTD, 0x100000 arch-specific (sm_90a)
//     0x30 u64 (0)
//     0x38 u64 uncompressed size, 0 where not compressed
//   LZ4 payloads are one raw LZ4 block (no frame), ZSTD payloads zstd
//   frames; both are zero-padded to 8 bytes. --compress-mode=speed gives
//   LZ4, default, size and balance ZSTD; nvcc compresses PTX, and ELF only
//   with -Xfatbin -compress-all or --compress-mode=size.
//
// An executable's .nv_fatbin section holds one fatbin per translation unit
// back to back, each registered on its own (cudart's wrapper points at it);
// nvcc -fatbin, -rdc included, writes one.
#include <lz4.h>
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_decompressBound; zstd is linked statically
#include <zstd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>

#include "binary_reader.h"
#include "phos/speculation/fatbin.h"

namespace phos::speculation {

namespace detail {
namespace {

std::string vformat(const char* fmt, va_list args) {
  va_list again;
  va_copy(again, args);
  int n = std::vsnprintf(nullptr, 0, fmt, args);
  std::string out(n > 0 ? size_t(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  va_end(again);
  return out;
}

}  // namespace

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string out = vformat(fmt, args);
  va_end(args);
  return out;
}

ImageError failure(ImageFault fault, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string message = vformat(fmt, args);
  va_end(args);
  return make_image_error(fault, std::move(message));
}

ImageError within(ImageError e, const std::string& context) {
  if (e.fault == ImageFault::kUnrecognized) e.fault = ImageFault::kMalformed;
  e.message = context + e.message;
  return e;
}

std::string describe(const FatbinEntry& e) {
  const char* prefix = e.kind == FatbinEntryKind::kElf ? "sm_" : "compute_";
  return format("%s%u %s", prefix, e.arch, fatbin_entry_kind_name(e.kind));
}

std::string list_entries(const std::vector<FatbinEntry>& entries) {
  std::string out;
  for (const FatbinEntry& e : entries) out += (out.empty() ? "" : ", ") + describe(e);
  return out.empty() ? "no entries" : out;
}

}  // namespace detail

namespace {

using namespace detail;

constexpr size_t kEntryHeaderSize = 0x40;
constexpr uint16_t kKindPtx = 1, kKindElf = 2, kKindLtoIr = 8;
constexpr uint64_t kFlagLz4 = 0x2000, kFlagZstd = 0x8000;

bool has_fatbin_magic(Bytes b, uint64_t offset) {
  return fits(b, offset, 4) && load_le<uint32_t>(b, offset) == kFatbinMagic;
}

FatbinEntryKind kind_of(uint16_t kind) {
  switch (kind) {
    case kKindPtx: return FatbinEntryKind::kPtx;
    case kKindElf: return FatbinEntryKind::kElf;
    case kKindLtoIr: return FatbinEntryKind::kLtoIr;
    default: return FatbinEntryKind::kUnknown;
  }
}

Compression compression_of(uint64_t flags) {
  bool lz4 = flags & kFlagLz4, zstd = flags & kFlagZstd;
  if (lz4 && zstd) return Compression::kUnknown;
  return lz4 ? Compression::kLz4 : zstd ? Compression::kZstd : Compression::kNone;
}

// The identifier string lies inside the entry (in the header extension as
// nvcc writes it); trailing NULs are padding.
ImageResult<std::string> read_identifier(Bytes entry) {
  uint32_t offset = load_le<uint32_t>(entry, 0x20), length = load_le<uint32_t>(entry, 0x24);
  if (length == 0) return std::string();
  if (!fits(entry, offset, length))
    return failure(ImageFault::kMalformed, "identifier (offset %#x, length %u) lies outside the entry's %zu bytes",
                   offset, length, entry.size());
  std::string out(reinterpret_cast<const char*>(entry.data()) + offset, length);
  out.resize(strnlen(out.c_str(), out.size()));
  return out;
}

// The payload as stored: the compressed bytes without their padding where
// the entry is compressed.
ImageResult<void> read_payload(Bytes entry, uint32_t header_size, uint64_t size, FatbinEntry* e) {
  e->payload = entry.subspan(header_size, size);
  e->uncompressed_size = size;
  if (e->compression == Compression::kNone) return {};
  uint32_t compressed = load_le<uint32_t>(entry, 0x10);
  e->uncompressed_size = load_le<uint64_t>(entry, 0x38);
  if (compressed == 0 || compressed > size)
    return failure(ImageFault::kMalformed, "%s compressed size %u, payload %llu bytes",
                   fatbin_compression_name(e->compression), compressed, ull(size));
  e->payload = e->payload.first(compressed);
  return {};
}

// The entry at `at` (its offset in `fatbin`, which ends where the fatbin
// ends); *next is where the following one starts.
ImageResult<FatbinEntry> read_entry(Bytes fatbin, uint64_t at, uint64_t* next) {
  if (!fits(fatbin, at, kEntryHeaderSize))
    return failure(ImageFault::kMalformed, "header truncated: %llu bytes left", ull(fatbin.size() - at));
  Bytes header = fatbin.subspan(at, kEntryHeaderSize);
  uint32_t header_size = load_le<uint32_t>(header, 0x04);
  uint64_t size = load_le<uint64_t>(header, 0x08);
  if (header_size < kEntryHeaderSize || !fits(fatbin, at, header_size))
    return failure(ImageFault::kMalformed, "header size %u (minimum %zu, %llu bytes left)", header_size,
                   kEntryHeaderSize, ull(fatbin.size() - at));
  if (!fits(fatbin, at + header_size, size))
    return failure(ImageFault::kMalformed, "payload size %#llx runs past the fatbin's end (%llu bytes left)",
                   ull(size), ull(fatbin.size() - at - header_size));
  Bytes entry = fatbin.subspan(at, header_size + size);
  FatbinEntry e;
  e.kind = kind_of(load_le<uint16_t>(header, 0x00));
  e.version_minor = load_le<uint16_t>(header, 0x18);
  e.version_major = load_le<uint16_t>(header, 0x1a);
  e.arch = load_le<uint32_t>(header, 0x1c);
  e.compression = compression_of(load_le<uint64_t>(header, 0x28));
  *next = at + header_size + size;
  auto identifier = read_identifier(entry);
  if (!identifier) return identifier.error();
  e.identifier = std::move(*identifier);
  PHOS_TRY(read_payload(entry, header_size, size, &e));
  return e;
}

// The fatbin at `start` of `bytes`: its entries appended to *entries (their
// offsets from the start of `bytes`); where it ends.
ImageResult<uint64_t> read_one_fatbin(Bytes bytes, uint64_t start, std::vector<FatbinEntry>* entries) {
  auto end = fatbin_end(bytes, start);
  if (!end) return end;
  Bytes fatbin = bytes.first(*end);
  for (uint64_t at = start + load_le<uint16_t>(bytes, start + 6), next = 0; at < fatbin.size(); at = next) {
    auto e = read_entry(fatbin, at, &next);
    if (!e) return within(e.error(), format("fatbin entry %zu at offset %#llx: ", entries->size(), ull(at)));
    e->offset = uint64_t(e->payload.data() - bytes.data());
    entries->push_back(std::move(*e));
  }
  return end;
}

ImageResult<std::vector<std::byte>> decompress_lz4(const FatbinEntry& e) {
  // LZ4 expands at most 255 to 1: a larger claim is corrupt, whatever the data.
  if (e.uncompressed_size > uint64_t(e.payload.size()) * 255 + 16)
    return failure(ImageFault::kMalformed, "uncompressed size beyond what LZ4 can expand to");
  if (e.payload.size() > size_t(std::numeric_limits<int>::max()))
    return failure(ImageFault::kTooLarge, "%zu compressed bytes, more than LZ4 takes", e.payload.size());
  std::vector<std::byte> out(e.uncompressed_size);
  int n = LZ4_decompress_safe(reinterpret_cast<const char*>(e.payload.data()), reinterpret_cast<char*>(out.data()),
                              int(e.payload.size()), int(out.size()));
  if (n < 0) return failure(ImageFault::kMalformed, "corrupt LZ4 data (error %d)", n);
  if (uint64_t(n) != e.uncompressed_size)
    return failure(ImageFault::kMalformed, "LZ4 data holds %d bytes, the header says %llu", n,
                   ull(e.uncompressed_size));
  return out;
}

ImageResult<std::vector<std::byte>> decompress_zstd(const FatbinEntry& e) {
  // The frames' own headers bound their contents: checked before allocating.
  unsigned long long bound = ZSTD_decompressBound(e.payload.data(), e.payload.size());
  if (bound == ZSTD_CONTENTSIZE_ERROR) return failure(ImageFault::kMalformed, "not zstd frames");
  if (e.uncompressed_size > bound) return failure(ImageFault::kMalformed, "zstd frames hold at most %llu bytes", bound);
  std::vector<std::byte> out(e.uncompressed_size);
  size_t n = ZSTD_decompress(out.data(), out.size(), e.payload.data(), e.payload.size());
  if (ZSTD_isError(n)) return failure(ImageFault::kMalformed, "corrupt zstd data: %s", ZSTD_getErrorName(n));
  if (n != e.uncompressed_size)
    return failure(ImageFault::kMalformed, "zstd data holds %zu bytes, the header says %llu", n,
                   ull(e.uncompressed_size));
  return out;
}

ImageResult<std::vector<std::byte>> decompress(const FatbinEntry& e) {
  if (e.uncompressed_size > kMaxEntryContentSize)
    return failure(ImageFault::kTooLarge, "uncompressed size %llu beyond the %llu limit", ull(e.uncompressed_size),
                   ull(kMaxEntryContentSize));
  switch (e.compression) {
    case Compression::kNone: return std::vector<std::byte>(e.payload.begin(), e.payload.end());
    case Compression::kLz4: return decompress_lz4(e);
    case Compression::kZstd: return decompress_zstd(e);
    case Compression::kUnknown: break;
  }
  return failure(ImageFault::kUnsupportedCompression, "both LZ4 and ZSTD flags set");
}

bool same_major_not_newer(uint32_t have, uint32_t want) { return have / 10 == want / 10 && have <= want; }

// The ELF entry for `arch`: exact, else the newest of the same major version
// not newer than arch (what the driver would load); nullptr where none.
const FatbinEntry* pick_cubin(const std::vector<FatbinEntry>& entries, uint32_t arch) {
  const FatbinEntry* best = nullptr;
  for (const FatbinEntry& e : entries) {
    if (e.kind != FatbinEntryKind::kElf || !same_major_not_newer(e.arch, arch)) continue;
    if (!best || e.arch > best->arch) best = &e;
  }
  return best;
}

// The newest PTX entry a GPU of `arch` can JIT; nullptr where none.
const FatbinEntry* pick_ptx(const std::vector<FatbinEntry>& entries, uint32_t arch) {
  const FatbinEntry* best = nullptr;
  for (const FatbinEntry& e : entries)
    if (e.kind == FatbinEntryKind::kPtx && e.arch <= arch && (!best || e.arch > best->arch)) best = &e;
  return best;
}

bool has_cubin(const std::vector<FatbinEntry>& entries) {
  for (const FatbinEntry& e : entries)
    if (e.kind == FatbinEntryKind::kElf) return true;
  return false;
}

ImageResult<std::vector<CubinKernel>> fatbin_kernels(Bytes fatbin, uint32_t arch) {
  auto entries = read_fatbin(fatbin);
  if (!entries) return entries.error();
  const FatbinEntry* e = pick_cubin(*entries, arch);
  if (!e)
    return failure(has_cubin(*entries) ? ImageFault::kNoEntryForArch : ImageFault::kPtxOnly,
                   "fatbin: no cubin for sm_%u (has %s)", arch, list_entries(*entries).c_str());
  auto elf = entry_contents(*e);
  if (!elf) return elf.error();
  auto kernels = read_cubin_kernels(*elf);
  if (kernels) return kernels;
  return within(kernels.error(), format("fatbin: %s at offset %#llx: ", describe(*e).c_str(), ull(e->offset)));
}

}  // namespace

namespace detail {

ImageResult<uint64_t> fatbin_end(Bytes bytes, uint64_t start) {
  if (!fits(bytes, start, kFatbinHeaderSize))
    return failure(ImageFault::kMalformed, "fatbin at offset %#llx: header truncated (%llu bytes left)", ull(start),
                   ull(bytes.size() - std::min<uint64_t>(start, bytes.size())));
  if (!has_fatbin_magic(bytes, start))
    return failure(ImageFault::kUnrecognized, "fatbin at offset %#llx: bad magic", ull(start));
  uint16_t version = load_le<uint16_t>(bytes, start + 4), header_size = load_le<uint16_t>(bytes, start + 6);
  uint64_t size = load_le<uint64_t>(bytes, start + 8);
  if (version != kFatbinVersion)
    return failure(ImageFault::kUnsupportedVersion, "fatbin at offset %#llx: unsupported version %u", ull(start),
                   version);
  if (header_size < kFatbinHeaderSize)
    return failure(ImageFault::kMalformed, "fatbin at offset %#llx: header size %u (minimum %zu)", ull(start),
                   header_size, kFatbinHeaderSize);
  if (size > kMaxImageSize - header_size)
    return failure(ImageFault::kTooLarge, "fatbin at offset %#llx: size %#llx beyond the %llu-byte limit", ull(start),
                   ull(size), ull(kMaxImageSize));
  if (!fits(bytes, start, header_size + size))
    return failure(ImageFault::kMalformed,
                   "fatbin at offset %#llx: header size %u and size %#llx run past the %zu bytes", ull(start),
                   header_size, ull(size), bytes.size());
  return start + header_size + size;
}

}  // namespace detail

const char* image_fault_name(ImageFault f) {
  switch (f) {
    case ImageFault::kUnrecognized: return "unrecognized";
    case ImageFault::kNoEntryForArch: return "no entry for this GPU";
    case ImageFault::kPtxOnly: return "PTX only";
    case ImageFault::kMalformed: return "malformed";
    case ImageFault::kUnsupportedVersion: return "unsupported version";
    case ImageFault::kUnsupportedCompression: return "unsupported compression";
    case ImageFault::kTooLarge: return "too large";
  }
  return "invalid";
}

const char* fatbin_entry_kind_name(FatbinEntryKind k) {
  switch (k) {
    case FatbinEntryKind::kPtx: return "PTX";
    case FatbinEntryKind::kElf: return "ELF";
    case FatbinEntryKind::kLtoIr: return "LTO IR";
    case FatbinEntryKind::kUnknown: break;
  }
  return "unknown";
}

const char* fatbin_compression_name(Compression c) {
  switch (c) {
    case Compression::kNone: return "none";
    case Compression::kLz4: return "LZ4";
    case Compression::kZstd: return "ZSTD";
    case Compression::kUnknown: break;
  }
  return "unknown";
}

ImageResult<std::vector<FatbinEntry>> read_fatbin(std::span<const std::byte> bytes) {
  std::vector<FatbinEntry> entries;
  uint64_t at = 0;
  do {
    auto end = read_one_fatbin(bytes, at, &entries);
    if (!end) return end.error();
    at = *end;
  } while (has_fatbin_magic(bytes, at));
  return entries;
}

ImageResult<std::vector<std::byte>> entry_contents(const FatbinEntry& entry) {
  auto contents = decompress(entry);
  if (contents) return contents;
  return within(contents.error(), format("fatbin entry at offset %#llx (%s, %s): ", ull(entry.offset),
                                         describe(entry).c_str(), fatbin_compression_name(entry.compression)));
}

ImageResult<std::vector<CubinKernel>> module_kernels(const void* image, uint32_t arch) {
  auto extent = binary_extent(image);
  if (!extent) return extent.error();
  if (extent->kind == ModuleKind::kFatbin) return fatbin_kernels(extent->bytes, arch);
  uint32_t have = cubin_arch(extent->bytes);
  if (!same_major_not_newer(have, arch))
    return failure(ImageFault::kNoEntryForArch, "module image: cubin for sm_%u, which sm_%u cannot run", have, arch);
  return read_cubin_kernels(extent->bytes);
}

ImageResult<std::string> module_ptx(const void* image, uint32_t arch) {
  auto extent = binary_extent(image);
  if (!extent) return extent.error();
  if (extent->kind != ModuleKind::kFatbin) return failure(ImageFault::kUnrecognized, "module image: not a fatbin");
  auto entries = read_fatbin(extent->bytes);
  if (!entries) return entries.error();
  const FatbinEntry* best = pick_ptx(*entries, arch);
  if (!best)
    return failure(ImageFault::kNoEntryForArch, "fatbin: no PTX that sm_%u can run (has %s)", arch,
                   list_entries(*entries).c_str());
  auto text = entry_contents(*best);
  if (!text) return text.error();
  // Stored plain, the text keeps the entry's zero padding: up to the first NUL.
  const char* chars = reinterpret_cast<const char*>(text->data());
  return std::string(chars, strnlen(chars, text->size()));
}

}  // namespace phos::speculation
