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

std::string format(const char* fmt, ...) {
  va_list args, again;
  va_start(args, fmt);
  va_copy(again, args);
  int n = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string out(n > 0 ? size_t(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  va_end(again);
  return out;
}

bool fail(std::string* error, std::string message) {
  if (error) *error = std::move(message);
  return false;
}

}  // namespace detail

namespace {

using namespace detail;

constexpr size_t kFatbinHeaderSize = 16;
constexpr uint16_t kFatbinVersion = 1;
constexpr size_t kEntryHeaderSize = 0x40;
constexpr uint16_t kKindPtx = 1, kKindElf = 2, kKindLtoIr = 8;
constexpr uint64_t kFlagLz4 = 0x2000, kFlagZstd = 0x8000;
// Larger than any real entry (a cubin of hundreds of MB is already rare);
// bounds what a corrupt uncompressed size can make us allocate.
constexpr uint64_t kMaxContentSize = uint64_t(1) << 30;

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

// "sm_90 ELF", "compute_90 PTX": how errors name an entry.
std::string describe(const FatbinEntry& e) {
  const char* prefix = e.kind == FatbinEntryKind::kElf ? "sm_" : "compute_";
  return format("%s%u %s", prefix, e.arch, fatbin_entry_kind_name(e.kind));
}

// The identifier string lies inside the entry (in the header extension as
// nvcc writes it); trailing NULs are padding.
bool read_identifier(Bytes entry, std::string* out, std::string* error) {
  uint32_t offset = load_le<uint32_t>(entry, 0x20), length = load_le<uint32_t>(entry, 0x24);
  if (length == 0) return true;
  if (!fits(entry, offset, length))
    return fail(error, format("identifier (offset %#x, length %u) lies outside the entry's %zu bytes", offset, length,
                              entry.size()));
  out->assign(reinterpret_cast<const char*>(entry.data()) + offset, length);
  out->resize(strnlen(out->c_str(), out->size()));
  return true;
}

// The payload as stored: the compressed bytes without their padding where
// the entry is compressed.
bool read_payload(Bytes entry, uint32_t header_size, uint64_t size, FatbinEntry* e, std::string* error) {
  e->payload = entry.subspan(header_size, size);
  e->uncompressed_size = size;
  if (e->compression == Compression::kNone) return true;
  uint32_t compressed = load_le<uint32_t>(entry, 0x10);
  e->uncompressed_size = load_le<uint64_t>(entry, 0x38);
  if (compressed == 0 || compressed > size)
    return fail(error, format("%s compressed size %u, payload %llu bytes", compression_name(e->compression), compressed,
                              ull(size)));
  e->payload = e->payload.first(compressed);
  return true;
}

// The entry at `at` (its offset in `fatbin`, which ends where the fatbin
// ends); *next is where the following one starts.
bool read_entry(Bytes fatbin, uint64_t at, FatbinEntry* e, uint64_t* next, std::string* error) {
  if (!fits(fatbin, at, kEntryHeaderSize))
    return fail(error, format("header truncated: %llu bytes left", ull(fatbin.size() - at)));
  Bytes header = fatbin.subspan(at, kEntryHeaderSize);
  uint32_t header_size = load_le<uint32_t>(header, 0x04);
  uint64_t size = load_le<uint64_t>(header, 0x08);
  if (header_size < kEntryHeaderSize || !fits(fatbin, at, header_size))
    return fail(error, format("header size %u (minimum %zu, %llu bytes left)", header_size, kEntryHeaderSize,
                              ull(fatbin.size() - at)));
  if (!fits(fatbin, at + header_size, size))
    return fail(error, format("payload size %#llx runs past the fatbin's end (%llu bytes left)", ull(size),
                              ull(fatbin.size() - at - header_size)));
  Bytes entry = fatbin.subspan(at, header_size + size);
  e->kind = kind_of(load_le<uint16_t>(header, 0x00));
  e->version_minor = load_le<uint16_t>(header, 0x18);
  e->version_major = load_le<uint16_t>(header, 0x1a);
  e->arch = load_le<uint32_t>(header, 0x1c);
  e->compression = compression_of(load_le<uint64_t>(header, 0x28));
  *next = at + header_size + size;
  return read_identifier(entry, &e->identifier, error) && read_payload(entry, header_size, size, e, error);
}

// The fatbin at `start` of `bytes`: its entries appended to *entries (their
// offsets from the start of `bytes`), *end where it ends.
bool read_one_fatbin(Bytes bytes, uint64_t start, std::vector<FatbinEntry>* entries, uint64_t* end,
                     std::string* error) {
  if (!fits(bytes, start, kFatbinHeaderSize))
    return fail(error, format("fatbin at offset %#llx: header truncated (%llu bytes left)", ull(start),
                              ull(bytes.size() - std::min<uint64_t>(start, bytes.size()))));
  if (!has_fatbin_magic(bytes, start)) return fail(error, format("fatbin at offset %#llx: bad magic", ull(start)));
  uint16_t version = load_le<uint16_t>(bytes, start + 4), header_size = load_le<uint16_t>(bytes, start + 6);
  uint64_t size = load_le<uint64_t>(bytes, start + 8);
  if (version != kFatbinVersion)
    return fail(error, format("fatbin at offset %#llx: unsupported version %u", ull(start), version));
  if (header_size < kFatbinHeaderSize || !fits(bytes, start, header_size) || !fits(bytes, start + header_size, size))
    return fail(error, format("fatbin at offset %#llx: header size %u and size %#llx run past the %zu bytes",
                              ull(start), header_size, ull(size), bytes.size()));
  Bytes fatbin = bytes.subspan(0, start + header_size + size);
  for (uint64_t at = start + header_size, next = 0; at < fatbin.size(); at = next) {
    FatbinEntry& e = entries->emplace_back();
    std::string inner;
    if (!read_entry(fatbin, at, &e, &next, &inner))
      return fail(error, format("fatbin entry %zu at offset %#llx: %s", entries->size() - 1, ull(at), inner.c_str()));
    e.offset = uint64_t(e.payload.data() - bytes.data());
  }
  *end = fatbin.size();
  return true;
}

bool decompress_lz4(const FatbinEntry& e, std::vector<std::byte>* out, std::string* error) {
  // LZ4 expands at most 255 to 1: a larger claim is corrupt, whatever the data.
  if (e.uncompressed_size > uint64_t(e.payload.size()) * 255 + 16)
    return fail(error, "uncompressed size beyond what LZ4 can expand to");
  if (e.payload.size() > size_t(std::numeric_limits<int>::max()))
    return fail(error, format("%zu compressed bytes, more than LZ4 takes", e.payload.size()));
  out->resize(e.uncompressed_size);
  int n = LZ4_decompress_safe(reinterpret_cast<const char*>(e.payload.data()), reinterpret_cast<char*>(out->data()),
                              int(e.payload.size()), int(out->size()));
  if (n < 0) return fail(error, format("corrupt LZ4 data (error %d)", n));
  if (uint64_t(n) != e.uncompressed_size)
    return fail(error, format("LZ4 data holds %d bytes, the header says %llu", n, ull(e.uncompressed_size)));
  return true;
}

bool decompress_zstd(const FatbinEntry& e, std::vector<std::byte>* out, std::string* error) {
  // The frames' own headers bound their contents: checked before allocating.
  unsigned long long bound = ZSTD_decompressBound(e.payload.data(), e.payload.size());
  if (bound == ZSTD_CONTENTSIZE_ERROR) return fail(error, "not zstd frames");
  if (e.uncompressed_size > bound) return fail(error, format("zstd frames hold at most %llu bytes", bound));
  out->resize(e.uncompressed_size);
  size_t n = ZSTD_decompress(out->data(), out->size(), e.payload.data(), e.payload.size());
  if (ZSTD_isError(n)) return fail(error, format("corrupt zstd data: %s", ZSTD_getErrorName(n)));
  if (n != e.uncompressed_size)
    return fail(error, format("zstd data holds %zu bytes, the header says %llu", n, ull(e.uncompressed_size)));
  return true;
}

bool decompress(const FatbinEntry& e, std::vector<std::byte>* out, std::string* error) {
  if (e.uncompressed_size > kMaxContentSize)
    return fail(error, format("uncompressed size %llu beyond the %llu limit", ull(e.uncompressed_size),
                              ull(kMaxContentSize)));
  switch (e.compression) {
    case Compression::kNone: out->assign(e.payload.begin(), e.payload.end()); return true;
    case Compression::kLz4: return decompress_lz4(e, out, error);
    case Compression::kZstd: return decompress_zstd(e, out, error);
    case Compression::kUnknown: break;
  }
  return fail(error, "both LZ4 and ZSTD flags set");
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

std::string list_entries(const std::vector<FatbinEntry>& entries) {
  std::string out;
  for (const FatbinEntry& e : entries) out += (out.empty() ? "" : ", ") + describe(e);
  return out.empty() ? "no entries" : out;
}

bool fatbin_kernels(Bytes fatbin, uint32_t arch, std::vector<CubinKernel>* kernels, std::string* error) {
  std::vector<FatbinEntry> entries;
  if (!read_fatbin(fatbin, &entries, error)) return false;
  const FatbinEntry* e = pick_cubin(entries, arch);
  if (!e)
    return fail(error, format("fatbin: no cubin for sm_%u (has %s)", arch, list_entries(entries).c_str()));
  std::vector<std::byte> elf;
  std::string inner;
  if (!entry_contents(*e, &elf, error)) return false;
  if (read_cubin_kernels(elf, kernels, &inner)) return true;
  return fail(error, format("fatbin: %s at offset %#llx: %s", describe(*e).c_str(), ull(e->offset), inner.c_str()));
}

// A fatbin handed over by pointer has no length but its header's.
bool fatbin_at(const std::byte* p, Bytes* fatbin, std::string* error) {
  uint64_t header_size = load_le<uint16_t>(p + 6), size = load_le<uint64_t>(p + 8);
  if (size > detail::kMaxImageSize) return fail(error, format("fatbin: implausible size %#llx", ull(size)));
  *fatbin = Bytes(p, header_size + size);
  return true;
}

// cudart's __fatBinC_Wrapper_t, as __cudaRegisterFatBinary gets it: version
// 1, or 2 for relocatable code (the fourth field then lists the fatbins to
// link, which are not needed here).
struct FatbinWrapper {
  int32_t magic;
  int32_t version;
  const void* data;
  void* filename_or_fatbins;
};

}  // namespace

const char* fatbin_entry_kind_name(FatbinEntryKind k) {
  switch (k) {
    case FatbinEntryKind::kPtx: return "PTX";
    case FatbinEntryKind::kElf: return "ELF";
    case FatbinEntryKind::kLtoIr: return "LTO IR";
    case FatbinEntryKind::kUnknown: break;
  }
  return "unknown";
}

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::kNone: return "none";
    case Compression::kLz4: return "LZ4";
    case Compression::kZstd: return "ZSTD";
    case Compression::kUnknown: break;
  }
  return "unknown";
}

bool read_fatbin(std::span<const std::byte> bytes, std::vector<FatbinEntry>* entries, std::string* error) {
  entries->clear();
  uint64_t at = 0;
  do {
    if (!read_one_fatbin(bytes, at, entries, &at, error)) {
      entries->clear();
      return false;
    }
  } while (has_fatbin_magic(bytes, at));
  return true;
}

bool entry_contents(const FatbinEntry& entry, std::vector<std::byte>* out, std::string* error) {
  out->clear();
  std::string inner;
  if (decompress(entry, out, &inner)) return true;
  out->clear();
  return fail(error, format("fatbin entry at offset %#llx (%s, %s): %s", ull(entry.offset), describe(entry).c_str(),
                            compression_name(entry.compression), inner.c_str()));
}

namespace {

enum class ImageFatbin { kNotOne, kFound, kBroken };

// The fatbin a module image is, or points at through cudart's wrapper
// (kBroken, with *error, where the wrapper or header is unusable).
ImageFatbin image_fatbin(const std::byte* p, Bytes* fatbin, std::string* error) {
  if (load_le<uint32_t>(p) == kFatbinWrapperMagic) {
    FatbinWrapper w;
    std::memcpy(&w, p, sizeof w);
    if (w.version != 1 && w.version != 2)
      return fail(error, format("fatbin wrapper: unknown version %d", w.version)), ImageFatbin::kBroken;
    if (!w.data) return fail(error, "fatbin wrapper: null fatbin pointer"), ImageFatbin::kBroken;
    p = static_cast<const std::byte*>(w.data);
    if (load_le<uint32_t>(p) != kFatbinMagic)
      return fail(error, format("fatbin wrapper: data has magic %#x, not a fatbin's", load_le<uint32_t>(p))),
             ImageFatbin::kBroken;
  }
  if (load_le<uint32_t>(p) != kFatbinMagic) return ImageFatbin::kNotOne;
  return fatbin_at(p, fatbin, error) ? ImageFatbin::kFound : ImageFatbin::kBroken;
}

}  // namespace

bool module_kernels(const void* image, uint32_t arch, std::vector<CubinKernel>* kernels, std::string* error) {
  kernels->clear();
  if (!image) return fail(error, "module image: null pointer");
  auto p = static_cast<const std::byte*>(image);
  Bytes fatbin;
  switch (image_fatbin(p, &fatbin, error)) {
    case ImageFatbin::kFound: return fatbin_kernels(fatbin, arch, kernels, error);
    case ImageFatbin::kBroken: return false;
    case ImageFatbin::kNotOne: break;
  }
  uint64_t size = 0;
  if (load_le<uint32_t>(p) != 0x464c457f)
    return fail(error, format("module image: magic %#x is none of fatbin, fatbin wrapper, ELF", load_le<uint32_t>(p)));
  if (!detail::elf_image_size(p, &size, error)) return false;
  Bytes elf(p, size);
  if (!same_major_not_newer(cubin_arch(elf), arch))
    return fail(error, format("module image: cubin for sm_%u, which sm_%u cannot run", cubin_arch(elf), arch));
  return read_cubin_kernels(elf, kernels, error);
}

bool module_ptx(const void* image, uint32_t arch, std::string* ptx, std::string* error) {
  ptx->clear();
  if (!image) return fail(error, "module image: null pointer");
  Bytes fatbin;
  switch (image_fatbin(static_cast<const std::byte*>(image), &fatbin, error)) {
    case ImageFatbin::kFound: break;
    case ImageFatbin::kBroken: return false;
    case ImageFatbin::kNotOne: return fail(error, "module image: not a fatbin");
  }
  std::vector<FatbinEntry> entries;
  if (!read_fatbin(fatbin, &entries, error)) return false;
  const FatbinEntry* best = nullptr;
  for (const FatbinEntry& e : entries)
    if (e.kind == FatbinEntryKind::kPtx && e.arch <= arch && (!best || e.arch > best->arch)) best = &e;
  if (!best) return fail(error, format("fatbin: no PTX that sm_%u can run (has %s)", arch, list_entries(entries).c_str()));
  std::vector<std::byte> text;
  if (!entry_contents(*best, &text, error)) return false;
  // Stored plain, the text keeps the entry's zero padding: up to the first NUL.
  const char* chars = reinterpret_cast<const char*>(text.data());
  ptx->assign(chars, strnlen(chars, text.size()));
  return true;
}

}  // namespace phos::speculation
