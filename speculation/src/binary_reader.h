// Helpers of the fatbin and cubin readers (not part of the interface): bounds
// checks and little-endian loads over bytes that come from other people's
// binaries, and the printf-style error text both readers write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace phos::speculation::detail {

using Bytes = std::span<const std::byte>;
using ull = unsigned long long;  // what %llx prints

// No fatbin or cubin comes near: a size beyond it in an image that has no
// length of its own (one handed over by pointer) is taken for garbage.
inline constexpr uint64_t kMaxImageSize = uint64_t(4) << 30;

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

// Sets *error (where there is one) and returns false, so that every error
// path is one statement.
bool fail(std::string* error, std::string message);

// The start of an ELF cubin held in memory without a length (what a program
// hands cuModuleLoadData): its size, from the ELF header and the section and
// program header tables, the only places that say where its bytes end.
bool elf_image_size(const std::byte* image, uint64_t* size, std::string* error);

}  // namespace phos::speculation::detail
