#include "module_image.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace phos::hooks {
namespace {

// No image we accept is larger: a bigger size is a damaged header.
constexpr uint64_t kMaxImageBytes = 16ull << 30;

struct FatbinHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t header_size;
  uint64_t fat_size;
};

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

ModuleImage hashed(ModuleKind kind, const void* data, uint64_t size) {
  return {kind, size, content_hash(data, size)};
}

ModuleImage fatbin(const unsigned char* p) {
  FatbinHeader h;
  std::memcpy(&h, p, sizeof(h));
  uint64_t size = uint64_t(h.header_size) + h.fat_size;
  if (h.header_size < sizeof(h) || size > kMaxImageBytes) return {};
  return hashed(ModuleKind::kFatbin, p, size);
}

ModuleImage cubin(const unsigned char* p) {
  Elf64_Ehdr eh;
  std::memcpy(&eh, p, sizeof(eh));
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr)) return {ModuleKind::kCubin, 0, 0};
  uint64_t end = std::max<uint64_t>(sizeof(eh), eh.e_phoff + uint64_t(eh.e_phnum) * eh.e_phentsize);
  end = std::max<uint64_t>(end, eh.e_shoff + uint64_t(eh.e_shnum) * eh.e_shentsize);
  if (eh.e_shoff > kMaxImageBytes || end > kMaxImageBytes) return {ModuleKind::kCubin, 0, 0};
  for (uint16_t i = 0; i < eh.e_shnum; i++) {
    Elf64_Shdr sh;
    std::memcpy(&sh, p + eh.e_shoff + uint64_t(i) * sizeof(sh), sizeof(sh));
    if (sh.sh_type != SHT_NOBITS) end = std::max<uint64_t>(end, sh.sh_offset + sh.sh_size);
  }
  if (end > kMaxImageBytes) return {ModuleKind::kCubin, 0, 0};
  return hashed(ModuleKind::kCubin, p, end);
}

}  // namespace

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

uint64_t content_hash(const void* data, size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) h = (h ^ mix(load64(p + i))) * 0x9e3779b97f4a7c15ull;
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  return mix(h ^ mix(tail ^ (n - i)));
}

ModuleImage identify_image(const void* data) {
  if (!data) return {};
  auto* p = static_cast<const unsigned char*>(data);
  uint32_t magic;
  std::memcpy(&magic, p, sizeof(magic));
  if (magic == kFatbinWrapperMagic) {
    // __fatBinC_Wrapper_t: int magic, int version, const unsigned long long* data, ...
    const unsigned char* inner;
    std::memcpy(&inner, p + 8, sizeof(inner));
    if (!inner) return {};
    std::memcpy(&magic, inner, sizeof(magic));
    return magic == kFatbinMagic ? fatbin(inner) : ModuleImage{};
  }
  if (magic == kFatbinMagic) return fatbin(p);
  if (std::memcmp(p, ELFMAG, SELFMAG) == 0) return cubin(p);
  // PTX: text, NUL-terminated.
  size_t n = std::strlen(reinterpret_cast<const char*>(p));
  return hashed(ModuleKind::kPtx, p, n);
}

ModuleImage identify_file(const char* path) {
  int fd = path ? ::open(path, O_RDONLY | O_CLOEXEC) : -1;
  if (fd < 0) return {};
  struct stat st {};
  std::vector<unsigned char> bytes;
  if (::fstat(fd, &st) == 0 && uint64_t(st.st_size) <= kMaxImageBytes) bytes.resize(size_t(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r <= 0) break;
    got += size_t(r);
  }
  ::close(fd);
  if (got != bytes.size() || bytes.empty()) return {};
  return hashed(ModuleKind::kFile, bytes.data(), bytes.size());
}

}  // namespace phos::hooks
