// Little-endian encoding of the fixed headers of image files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace phos::bytes {

inline void put_u32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = std::byte(v >> (8 * i));
}
inline void put_u64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = std::byte(v >> (8 * i));
}
inline uint32_t get_u32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
inline uint64_t get_u64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= uint64_t(p[i]) << (8 * i);
  return v;
}
inline bool has_magic(std::span<const std::byte> b, const char (&magic)[8]) {
  return b.size() >= 8 && std::memcmp(b.data(), magic, 8) == 0;
}

}  // namespace phos::bytes
