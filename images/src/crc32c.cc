#include "phos/images/crc32c.h"

#include <array>

#include "phos/images/crc32c_split.h"
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

// Hand-written: Debian bookworm packages no CRC-32C library (google/crc32c is
// not there), and the images library must stay free of dependencies that the
// hosts it is loaded on may lack.
namespace phos {
namespace {

using crc32c_split::multmodp;

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; i++) t[i] = crc32c_split::table_entry(i);
  return t;
}
constexpr auto kTable = make_table();

// Polynomials over GF(2) modulo the Castagnoli polynomial (crc32c_split.h);
// the table of squares makes x8nmodp faster on the host.

// kX2n[k] = x^(2^k) mod P, for every bit of a 64-bit length in bits.
constexpr std::array<uint32_t, 64> make_x2n_table() {
  std::array<uint32_t, 64> t{};
  uint32_t p = 1u << 30;  // x^1
  t[0] = p;
  for (size_t k = 1; k < t.size(); k++) t[k] = p = multmodp(p, p);
  return t;
}
constexpr auto kX2n = make_x2n_table();

// x^(8 * bytes) mod P: what appending `bytes` zero bytes multiplies a CRC
// register by. bytes < 2^61.
uint32_t x8nmodp(uint64_t bytes) {
  uint32_t p = 1u << 31;  // x^0
  for (unsigned k = 3; bytes; bytes >>= 1, k++)
    if (bytes & 1) p = multmodp(kX2n[k], p);
  return p;
}

// The CRC register (no pre- or post-inversion) after `bytes` zero bytes more.
uint32_t shift_register(uint32_t reg, uint64_t bytes) { return multmodp(x8nmodp(bytes), reg); }

uint32_t register_portable(uint32_t reg, const unsigned char* p, size_t n) {
  while (n--) reg = kTable[(reg ^ *p++) & 0xff] ^ (reg >> 8);
  return reg;
}

#if defined(__x86_64__)
inline uint64_t load_u64(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);  // unaligned loads are fine on x86-64
  return w;
}

__attribute__((target("sse4.2"))) uint32_t register_sse42(uint32_t reg, const unsigned char* p, size_t n) {
  uint64_t c = reg;
  for (; n >= 8; p += 8, n -= 8) c = _mm_crc32_u64(c, load_u64(p));
  for (; n; n--) c = _mm_crc32_u8(uint32_t(c), *p++);
  return uint32_t(c);
}

// Below this, combining three streams costs more than it saves.
constexpr size_t kThreeStreamMin = 16 << 10;

// The crc32 instruction has a latency of 3 cycles and a throughput of 1 per
// cycle: three independent streams over the thirds of the buffer keep it
// busy, and the GF(2) algebra joins them: reg(A|B|C) = shift(reg(A), |B|+|C|)
// ^ shift(reg0(B), |C|) ^ reg0(C), reg0 starting from 0.
__attribute__((target("sse4.2"))) uint32_t register_sse42_3way(uint32_t reg, const unsigned char* p, size_t n) {
  if (n < kThreeStreamMin) return register_sse42(reg, p, n);
  const size_t third = n / 24 * 8;
  const unsigned char* pb = p + third;
  const unsigned char* pc = pb + third;
  uint64_t a = reg, b = 0, c = 0;
  for (size_t i = 0; i < third; i += 8) {
    a = _mm_crc32_u64(a, load_u64(p + i));
    b = _mm_crc32_u64(b, load_u64(pb + i));
    c = _mm_crc32_u64(c, load_u64(pc + i));
  }
  uint32_t joined = shift_register(uint32_t(a), 2 * third) ^ shift_register(uint32_t(b), third) ^ uint32_t(c);
  return register_sse42(joined, pc + third, n - 3 * third);
}

bool have_sse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t crc32c_portable(uint32_t crc, const void* data, size_t size) {
  return ~register_portable(~crc, static_cast<const unsigned char*>(data), size);
}

uint32_t crc32c_one_stream(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  if (have_sse42()) return ~register_sse42(~crc, static_cast<const unsigned char*>(data), size);
#endif
  return crc32c_portable(crc, data, size);
}

uint32_t crc32c(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  if (have_sse42()) return ~register_sse42_3way(~crc, static_cast<const unsigned char*>(data), size);
#endif
  return crc32c_portable(crc, data, size);
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b) {
  // The inversions at start and end cancel out between the two halves.
  return shift_register(crc_a, size_b) ^ crc_b;
}

}  // namespace phos
