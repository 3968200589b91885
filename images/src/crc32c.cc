#include "phos/images/crc32c.h"

#include <array>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace phos {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ kPolyReflected : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kTable = make_table();

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const unsigned char* p, size_t n) {
  uint64_t c = ~crc;
  while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
    c = _mm_crc32_u8(uint32_t(c), *p++);
    n--;
  }
  while (n >= 8) {
    uint64_t word;
    __builtin_memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  while (n--) c = _mm_crc32_u8(uint32_t(c), *p++);
  return ~uint32_t(c);
}
#endif

}  // namespace

uint32_t crc32c_portable(uint32_t crc, const void* data, size_t size) {
  auto p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (size--) c = kTable[(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  static const bool have_sse42 = __builtin_cpu_supports("sse4.2");
  if (have_sse42) return crc32c_sse42(crc, static_cast<const unsigned char*>(data), size);
#endif
  return crc32c_portable(crc, data, size);
}

}  // namespace phos
