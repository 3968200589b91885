// What a module image handed to the driver is, and how far it goes: the one
// place that sizes fatbins, cudart's fatbin wrappers, cubins and PTX held in
// memory without a length (fatbin.h says how each kind is sized), for the
// hooks' module registry and for the readers of module_kernels/module_ptx.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "binary_reader.h"
#include "phos/speculation/fatbin.h"

namespace phos::speculation {
namespace {

using namespace detail;

// cudart's __fatBinC_Wrapper_t, as __cudaRegisterFatBinary gets it: version
// 1, or 2 for relocatable code (the fourth field then lists the fatbins to
// link, which are not needed here).
struct FatbinWrapper {
  int32_t magic;
  int32_t version;
  const void* data;
  void* filename_or_fatbins;
};

// An image handed over by pointer: what may be read of it before its
// headers say how long it is (readers check every size against this bound
// before it is used, and fail with kTooLarge beyond it).
Bytes unbounded(const void* p) { return Bytes(static_cast<const std::byte*>(p), kMaxImageSize); }

// The fatbin or cubin at the start of `bytes`; kUnrecognized for anything
// else (cudart's wrapper included: its pointer is not followed here).
ImageResult<ImageExtent> extent_in(Bytes bytes) {
  uint32_t magic = fits(bytes, 0, 4) ? load_le<uint32_t>(bytes, 0) : 0;
  if (magic == kFatbinMagic) {
    auto end = fatbin_end(bytes, 0);
    if (!end) return end.error();
    return ImageExtent{ModuleKind::kFatbin, bytes.first(*end)};
  }
  if (magic == kElfMagic) {
    auto end = elf_extent(bytes);
    if (!end) return end.error();
    return ImageExtent{ModuleKind::kCubin, bytes.first(*end)};
  }
  return failure(ImageFault::kUnrecognized, "module image: magic %#x is none of fatbin, fatbin wrapper, ELF", magic);
}

// The fatbin cudart's wrapper at `p` points at.
ImageResult<ImageExtent> wrapped_fatbin(const std::byte* p) {
  FatbinWrapper w;
  std::memcpy(&w, p, sizeof w);
  if (w.version != 1 && w.version != 2)
    return failure(ImageFault::kUnsupportedVersion, "fatbin wrapper: unknown version %d", w.version);
  if (!w.data) return failure(ImageFault::kMalformed, "fatbin wrapper: null fatbin pointer");
  uint32_t magic = load_le<uint32_t>(static_cast<const std::byte*>(w.data));
  if (magic != kFatbinMagic)
    return failure(ImageFault::kMalformed, "fatbin wrapper: data has magic %#x, not a fatbin's", magic);
  auto fatbin = extent_in(unbounded(w.data));
  if (!fatbin) return within(fatbin.error(), "fatbin wrapper: ");
  return fatbin;
}

// PTX text: up to its NUL, which must lie inside `bytes`.
ImageResult<ImageExtent> ptx_extent(Bytes bytes) {
  const void* nul = std::memchr(bytes.data(), 0, bytes.size());
  if (!nul)
    return failure(ImageFault::kUnrecognized, "module image: no NUL-terminated text in %zu bytes", bytes.size());
  return ImageExtent{ModuleKind::kPtx, bytes.first(size_t(static_cast<const std::byte*>(nul) - bytes.data()))};
}

bool has_binary_magic(uint32_t magic) {
  return magic == kFatbinMagic || magic == kFatbinWrapperMagic || magic == kElfMagic;
}

ModuleImage hashed(ModuleKind kind, Bytes bytes) {
  return {kind, bytes.size(), content_hash(bytes.data(), bytes.size())};
}

uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

}  // namespace

namespace detail {

ImageResult<ImageExtent> binary_extent(const void* image) {
  if (!image) return failure(ImageFault::kUnrecognized, "module image: null pointer");
  auto p = static_cast<const std::byte*>(image);
  if (load_le<uint32_t>(p) == kFatbinWrapperMagic) return wrapped_fatbin(p);
  return extent_in(unbounded(image));
}

}  // namespace detail

const char* module_kind_name(ModuleKind k) {
  switch (k) {
    case ModuleKind::kFatbin: return "fatbin";
    case ModuleKind::kCubin: return "cubin";
    case ModuleKind::kPtx: return "ptx";
    case ModuleKind::kFile: return "file";
    case ModuleKind::kUnknown: break;
  }
  return "unknown";
}

ImageResult<ImageExtent> image_extent(const void* image) {
  if (!image) return failure(ImageFault::kUnrecognized, "module image: null pointer");
  // The driver takes anything else for PTX text, which it requires to end in a NUL.
  if (!has_binary_magic(load_le<uint32_t>(static_cast<const std::byte*>(image)))) return ptx_extent(unbounded(image));
  return binary_extent(image);
}

ImageResult<ImageExtent> image_extent(std::span<const std::byte> bytes) {
  uint32_t magic = fits(bytes, 0, 4) ? load_le<uint32_t>(bytes, 0) : 0;
  if (magic == kFatbinWrapperMagic)
    return failure(ImageFault::kUnrecognized,
                   "module image: cudart's fatbin wrapper, whose pointer leads outside the bytes");
  return has_binary_magic(magic) ? extent_in(bytes) : ptx_extent(bytes);
}

uint64_t content_hash(const void* data, size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) h = (h ^ mix(load64(p + i))) * 0x9e3779b97f4a7c15ull;
  uint64_t tail = 0;
  if (n > i) std::memcpy(&tail, p + i, n - i);
  return mix(h ^ mix(tail ^ (n - i)));
}

ModuleImage identify_image(const void* image) {
  auto extent = image_extent(image);
  if (!extent) return {};
  return hashed(extent->kind, extent->bytes);
}

ModuleImage identify_file(const char* path) {
  int fd = path ? ::open(path, O_RDONLY | O_CLOEXEC) : -1;
  if (fd < 0) return {};
  struct stat st {};
  std::vector<std::byte> bytes;
  if (::fstat(fd, &st) == 0 && uint64_t(st.st_size) <= kMaxImageSize) bytes.resize(size_t(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r <= 0) break;
    got += size_t(r);
  }
  ::close(fd);
  if (got != bytes.size() || bytes.empty()) return {};
  return hashed(ModuleKind::kFile, bytes);
}

}  // namespace phos::speculation
