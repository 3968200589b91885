// Helpers of the fatbin, cubin and module image readers (not part of the
// interface): bounds checks and little-endian loads over bytes that come
// from other people's binaries, the printf-style errors the readers return,
// and what one reader needs of another.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "phos/speculation/fatbin.h"

namespace phos::speculation::detail {

using Bytes = std::span<const std::byte>;
using ull = unsigned long long;  // what %llx prints

constexpr uint32_t kElfMagic = 0x464c457f;  // "\x7f" "ELF", little-endian
constexpr size_t kFatbinHeaderSize = 16;
constexpr uint16_t kFatbinVersion = 1;

// Whether [offset, offset + size) lies inside `bytes`, without overflowing.
inline bool fits(Bytes bytes, uint64_t offset, uint64_t size) {
  return offset <= bytes.size() && size <= bytes.size() - offset;
}

// Unchecked: callers check fits() for the whole structure first.
template <class T>
T load_le(const std::byte* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); i++) v = T(v | T(T(uint8_t(p[i])) << (8 * i)));
  return v;
}
template <class T>
T load_le(Bytes bytes, uint64_t offset) {
  return load_le<T>(bytes.data() + offset);
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// An ImageError of `fault` whose message is printf-formatted: every error
// path is one statement.
ImageError failure(ImageFault fault, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// `e` with `context` (where it happened) before its message. A part that is
// no fatbin or cubin inside one that said it holds one is a malformed whole,
// not an unrecognized one.
ImageError within(ImageError e, const std::string& context);

// Where the fatbin whose header is at `start` of `bytes` ends (header size +
// fat size, checked against the bytes and kMaxImageSize).
ImageResult<uint64_t> fatbin_end(Bytes bytes, uint64_t start);

// The size of the ELF cubin at the start of `bytes` (which may extend past
// its end: an image held in memory without a length, what a program hands
// cuModuleLoadData), from the ELF header and the section and program header
// tables, the only places that say where its bytes end.
ImageResult<uint64_t> elf_extent(Bytes bytes);

// "sm_90 ELF", "compute_90 PTX": how errors name an entry; and all of them.
std::string describe(const FatbinEntry& e);
std::string list_entries(const std::vector<FatbinEntry>& entries);

// The extent of a fatbin (direct or through cudart's wrapper) or ELF cubin
// at `image`; kUnrecognized for anything else, the null pointer included.
ImageResult<ImageExtent> binary_extent(const void* image);

}  // namespace phos::speculation::detail
