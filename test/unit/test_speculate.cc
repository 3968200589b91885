#include <catch2/catch.hpp>

#include <cstring>

#include "phos/speculation/speculate.h"

using namespace phos::speculation;
using K = ParamKind;

namespace {

BufferIndex three_buffers() {
  BufferIndex index;
  REQUIRE(index.insert(0x7f0000000000, 1 << 20, 1));
  REQUIRE(index.insert(0x7f0000100000, 1 << 20, 2));
  REQUIRE(index.insert(0x7f0000200000, 1 << 20, 3));
  return index;
}

KernelLayout layout_of(std::vector<ParamLayout> params, TypeSource types = TypeSource::kName) {
  KernelLayout l;
  l.params = std::move(params);
  l.slots_known = true;
  l.types = types;
  return l;
}

ParamLayout P(uint32_t offset, uint32_t size, K kind) {
  ParamLayout p;
  p.offset = offset;
  p.size = size;
  p.kind = kind;
  return p;
}

CubinParam cubin_param(uint32_t ordinal, uint32_t offset, uint32_t size) {
  CubinParam p;
  p.ordinal = ordinal;
  p.offset = offset;
  p.size = size;
  return p;
}

uint8_t access_of(const AccessSet& s, uint64_t id) {
  const BufferAccess* a = s.find(id);
  return a ? a->access : 0;
}

}  // namespace

TEST_CASE("speculate: const pointers are read, mutable pointers read and written, scalars skipped") {
  BufferIndex index = three_buffers();
  // k(float const* a, float* b, unsigned long n): n holds an address, but a scalar is never a pointer.
  KernelLayout l = layout_of({P(0, 8, K::kConstPointer), P(8, 8, K::kPointer), P(16, 8, K::kScalar)});
  uint64_t a = 0x7f0000000010, b = 0x7f0000100000, n = 0x7f0000200000;
  void* params[] = {&a, &b, &n};
  AccessSet set;
  speculate_kernel(l, LaunchArgs{params}, index, &set);
  CHECK(set.kind == SetKind::kSpeculated);
  CHECK(set.count == 2);
  CHECK(access_of(set, 1) == kRead);
  CHECK(access_of(set, 2) == (kRead | kWrite));
  CHECK(access_of(set, 3) == 0);
  CHECK(set.reads() == 2);
  CHECK(set.writes() == 1);
}

TEST_CASE("speculate: two pointers into one buffer give one entry with both accesses") {
  BufferIndex index = three_buffers();
  KernelLayout l = layout_of({P(0, 8, K::kConstPointer), P(8, 8, K::kPointer)});
  uint64_t a = 0x7f0000000000, b = 0x7f00000ffff8;
  void* params[] = {&a, &b};
  AccessSet set;
  speculate_kernel(l, LaunchArgs{params}, index, &set);
  CHECK(set.count == 1);
  CHECK(access_of(set, 1) == (kRead | kWrite));
}

TEST_CASE("speculate: a pointer outside every buffer names none") {
  BufferIndex index = three_buffers();
  KernelLayout l = layout_of({P(0, 8, K::kPointer), P(8, 8, K::kPointer)});
  uint64_t host = 0x555555554000, null = 0;
  void* params[] = {&host, &null};
  AccessSet set;
  speculate_kernel(l, LaunchArgs{params}, index, &set);
  CHECK(set.kind == SetKind::kSpeculated);
  CHECK(set.count == 0);
  CHECK(set.lookups == 1);  // null is not even looked up
}

TEST_CASE("speculate: an aggregate without known fields has every aligned word tried as a written pointer") {
  BufferIndex index = three_buffers();
  // k(int n, Closure c) with Closure{int x; const float* in; float* out;} at offset 8, 24 bytes.
  KernelLayout l = layout_of({P(0, 4, K::kScalar), P(8, 24, K::kAggregate)});
  int n = 5;
  struct {
    int x;
    uint64_t in, out;
  } closure{1, 0x7f0000000100, 0x7f0000200100};
  void* params[] = {&n, &closure};
  AccessSet set;
  speculate_kernel(l, LaunchArgs{params}, index, &set);
  CHECK(set.count == 2);
  CHECK(access_of(set, 1) == (kRead | kWrite));  // const-ness unknown inside
  CHECK(access_of(set, 3) == (kRead | kWrite));
}

TEST_CASE("speculate: the widest buffer a struct's word was read as a pointer into is named, with the word") {
  BufferIndex index = three_buffers();
  REQUIRE(index.insert(0x7f1000000000, uint64_t(64) << 30, 4));  // a 64 GiB pool
  // k(Op op): two pairs of 32-bit integers; the second reads as an address
  // inside the pool (its high half is the pool's), the first inside buffer 2.
  KernelLayout l = layout_of({P(0, 4, K::kScalar), P(8, 24, K::kAggregate)});
  int n = 5;
  struct {
    uint64_t a, b, c;
  } op{0x7f0000100040, 0x00007f1012345678, 42};
  void* params[] = {&n, &op};
  AccessSet set;
  speculate_kernel(l, LaunchArgs{params}, index, &set);
  CHECK(set.count == 2);
  const GuessedWord& w = set.widest_guess;
  CHECK(w.param == 1);
  CHECK(w.offset == 8);
  CHECK(w.value == 0x00007f1012345678);
  CHECK(w.buffer_start == 0x7f1000000000);
  CHECK(w.buffer_end - w.buffer_start == uint64_t(64) << 30);
  // A typed pointer parameter is no guess.
  AccessSet typed;
  uint64_t into_pool = 0x7f1000000100;
  void* typed_params[] = {&into_pool};
  speculate_kernel(layout_of({P(0, 8, K::kPointer)}), LaunchArgs{typed_params}, index, &typed);
  CHECK(typed.count == 1);
  CHECK(typed.widest_guess.buffer_end == 0);
}

TEST_CASE("speculate: a struct's word that reads as two integers, the low one small, deep inside a buffer, is no pointer") {
  // Device memory low in the address space, as on an H200 with driver 580:
  // a 64 GiB pool from 0x6cc000000, and a buffer starting at a 4 GiB boundary.
  BufferIndex index;
  REQUIRE(index.insert(0x6cc000000, uint64_t(64) << 30, 1));
  REQUIRE(index.insert(0x2000000000, 1 << 20, 2));
  REQUIRE(index.insert(0x2100000000, 1 << 20, 3));
  KernelLayout l = layout_of({P(0, 32, K::kAggregate)});
  struct {
    uint64_t pair, at_start, near_start, interior;
  } op{0x0000000700000001,  // (1, 7): inside the pool, 832 MiB past its start
       0x2000000000,        // buffer 2's first byte
       0x2100000100,        // 256 bytes into buffer 3
       0x6cc001234};        // an interior pointer of the pool, low half not small
  void* params[] = {&op};
  AccessSet set;
  speculate_kernel(l, LaunchArgs{params}, index, &set);
  CHECK(set.integer_words == 1);
  CHECK(set.count == 3);
  CHECK(access_of(set, 1) == (kRead | kWrite));  // through the interior pointer, not the pair
  CHECK(access_of(set, 2) == (kRead | kWrite));
  CHECK(access_of(set, 3) == (kRead | kWrite));

  // Without the interior pointer the pool is not in the set.
  op.interior = 0;
  AccessSet without;
  speculate_kernel(l, LaunchArgs{params}, index, &without);
  CHECK(access_of(without, 1) == 0);
  CHECK(without.integer_words == 1);

  // A typed pointer parameter is taken as it is, whatever its value.
  uint64_t typed = 0x0000000700000001;
  void* typed_params[] = {&typed};
  AccessSet t;
  speculate_kernel(layout_of({P(0, 8, K::kPointer)}), LaunchArgs{typed_params}, index, &t);
  CHECK(access_of(t, 1) == (kRead | kWrite));
  CHECK(t.integer_words == 0);

  // The struct's one word inside the pool, alone: two integers or a pointer.
  const struct {
    uint64_t word;
    bool pointer;
  } alone[] = {
      {0x0000000bffffffff, false},  // a small negative low half: (11, -1), a max reduction's word on the 8B server
      {0x0000000bfffeffff, true},   // ... but a low half just under -64 Ki reads as an address
      {0x0000000700000000, true},   // a low half of 0: an address at a 4 GiB boundary, inside the pool
  };
  for (const auto& [word, pointer] : alone) {
    CAPTURE(word);
    op = {word, 0, 0, 0};
    AccessSet one;
    speculate_kernel(l, LaunchArgs{params}, index, &one);
    CHECK(access_of(one, 1) == (pointer ? (kRead | kWrite) : 0));
    CHECK(one.integer_words == (pointer ? 0u : 1u));
  }

  // Without a layout a packed buffer is scanned unfiltered: its words may be typed pointers.
  uint64_t packed[] = {0x0000000700000001};
  AccessSet unfiltered;
  speculate_kernel(KernelLayout{}, LaunchArgs{nullptr, reinterpret_cast<const std::byte*>(packed), sizeof(packed)},
                   index, &unfiltered);
  CHECK(access_of(unfiltered, 1) == (kRead | kWrite));
}

TEST_CASE("speculate: an aggregate with known fields looks only at them, with their const-ness") {
  BufferIndex index = three_buffers();
  ParamLayout p{0, 24, K::kAggregate, true, {{8, true}, {16, false}}, {}};
  KernelLayout l = layout_of({p}, TypeSource::kSignatureDb);
  struct {
    uint64_t not_a_pointer, in, out;
  } s{0x7f0000100000, 0x7f0000000100, 0x7f0000200100};
  void* params[] = {&s};
  AccessSet set;
  speculate_kernel(l, LaunchArgs{params}, index, &set);
  CHECK(set.count == 2);
  CHECK(access_of(set, 1) == kRead);
  CHECK(access_of(set, 2) == 0);
  CHECK(access_of(set, 3) == (kRead | kWrite));
}

TEST_CASE("speculate: the packed (extra) form reads the same parameters") {
  BufferIndex index = three_buffers();
  KernelLayout l = layout_of({P(0, 4, K::kScalar), P(8, 8, K::kConstPointer), P(16, 8, K::kPointer)});
  std::byte packed[24] = {};
  uint64_t a = 0x7f0000000000, b = 0x7f0000200000;
  std::memcpy(packed + 8, &a, 8);
  std::memcpy(packed + 16, &b, 8);
  AccessSet set;
  speculate_kernel(l, LaunchArgs{nullptr, packed, sizeof(packed)}, index, &set);
  CHECK(access_of(set, 1) == kRead);
  CHECK(access_of(set, 3) == (kRead | kWrite));
  // A packed buffer shorter than the layout says: what is there is read, nothing past it.
  AccessSet cut;
  speculate_kernel(l, LaunchArgs{nullptr, packed, 16}, index, &cut);
  CHECK(cut.count == 1);
  CHECK(access_of(cut, 1) == kRead);
}

TEST_CASE("speculate: no layout at all: a packed buffer is scanned whole, kernelParams make it unknown") {
  BufferIndex index = three_buffers();
  KernelLayout none;
  std::byte packed[16] = {};
  uint64_t a = 0x7f0000100008;
  std::memcpy(packed + 8, &a, 8);
  AccessSet set;
  speculate_kernel(none, LaunchArgs{nullptr, packed, sizeof(packed)}, index, &set);
  CHECK(set.kind == SetKind::kSpeculated);
  CHECK(access_of(set, 2) == (kRead | kWrite));
  void* params[] = {&a};
  speculate_kernel(none, LaunchArgs{params}, index, &set);
  CHECK(set.kind == SetKind::kUnknown);
}

TEST_CASE("speculate: more buffers than a set holds make the launch unknown") {
  BufferIndex index;
  for (uint64_t i = 0; i < 100; i++) REQUIRE(index.insert(0x10000000 + i * 0x1000, 0x1000, i + 1));
  std::vector<uint64_t> words(100);
  for (size_t i = 0; i < words.size(); i++) words[i] = 0x10000000 + i * 0x1000;
  KernelLayout l = layout_of({P(0, 800, K::kAggregate)});
  void* params[] = {words.data()};
  AccessSet set;
  speculate_kernel(l, LaunchArgs{params}, index, &set);
  CHECK(set.kind == SetKind::kUnknown);
}

TEST_CASE("exact: ranges name every buffer they overlap, with their access") {
  BufferIndex index = three_buffers();
  // A copy from the end of buffer 1 across into buffer 2, into buffer 3.
  CallRange ranges[] = {{0x7f00000ff000, 0x2000, kRead}, {0x7f0000200000, 0x2000, kWrite}};
  AccessSet set;
  exact_call(ranges, index, &set);
  CHECK(set.kind == SetKind::kExact);
  CHECK(set.count == 3);
  CHECK(access_of(set, 1) == kRead);
  CHECK(access_of(set, 2) == kRead);
  CHECK(access_of(set, 3) == kWrite);
}

TEST_CASE("exact: an unknown extent names the buffer at the address; pointer arrays make it unknown") {
  BufferIndex index = three_buffers();
  CallRange extent[] = {{0x7f0000100010, 0, kWrite, true, false}};
  AccessSet set;
  exact_call(extent, index, &set);
  CHECK(set.kind == SetKind::kExact);
  CHECK(access_of(set, 2) == kWrite);
  CallRange batched[] = {{0x7f0000000000, 64, kRead, false, true}};
  exact_call(batched, index, &set);
  CHECK(set.kind == SetKind::kUnknown);
}

TEST_CASE("layout: driver slots with kinds from the mangled name") {
  LayoutSources s;
  s.driver = std::vector<ParamSlot>{{0, 8}, {8, 8}, {16, 4}};
  s.name_kinds = std::vector<K>{K::kConstPointer, K::kPointer, K::kScalar};
  KernelLayout l = build_layout(s);
  CHECK(l.types == TypeSource::kName);
  REQUIRE(l.params.size() == 3);
  CHECK(l.params[0].kind == K::kConstPointer);
  CHECK(l.params[2].offset == 16);
  CHECK(l.note.empty());
}

TEST_CASE("layout: the signature database wins over the name, and brings struct fields") {
  LayoutSources s;
  s.driver = std::vector<ParamSlot>{{0, 24}};
  s.name_kinds = std::vector<K>{K::kAggregate};
  KernelSignature sig;
  sig.params = {ParamLayout{0, 24, K::kAggregate, true, {{0, false}, {8, true}}, {}}};
  s.signature = &sig;
  KernelLayout l = build_layout(s);
  CHECK(l.types == TypeSource::kSignatureDb);
  CHECK(l.params[0].fields_known);
  CHECK(l.params[0].pointer_fields.size() == 2);
}

TEST_CASE("layout: disagreements drop the source and say so") {
  LayoutSources s;
  s.driver = std::vector<ParamSlot>{{0, 8}, {8, 4}};
  KernelSignature sig;
  sig.params = {P(0, 8, K::kPointer)};  // one parameter: another build of the kernel
  s.signature = &sig;
  s.name_kinds = std::vector<K>{K::kPointer, K::kPointer};  // a 4-byte "pointer"
  KernelLayout l = build_layout(s);
  CHECK(l.types == TypeSource::kNone);
  CHECK(l.params[0].kind == K::kUnknown);
  CHECK_THAT(l.note, Catch::Contains("signature database has 1 parameters"));
  CHECK_THAT(l.note, Catch::Contains("parameter 1 is a pointer, its size is 4"));
}

TEST_CASE("layout: cubin offsets that differ from the driver's are noted, the driver's kept") {
  LayoutSources s;
  s.driver = std::vector<ParamSlot>{{0, 8}};
  CubinKernel k;
  k.params = {cubin_param(0, 8, 4)};
  s.cubin = &k;
  KernelLayout l = build_layout(s);
  CHECK(l.params[0].size == 8);
  CHECK(l.cubin_checked);
  CHECK_THAT(l.note, Catch::Contains("cubin parameter offsets differ"));
}

TEST_CASE("layout: without the driver, the cubin gives the slots") {
  LayoutSources s;
  CubinKernel k;
  k.params = {cubin_param(0, 0, 8), cubin_param(1, 8, 4)};
  s.cubin = &k;
  s.name_kinds = std::vector<K>{K::kPointer, K::kScalar};
  KernelLayout l = build_layout(s);
  CHECK(l.slots_known);
  CHECK(l.types == TypeSource::kName);
  CHECK(l.params[1].offset == 8);
}

TEST_CASE("layout: the signature database alone does not make kernelParams readable") {
  // No driver, no cubin: a name-only match must not decide how many
  // kernelParams entries a launch reads.
  LayoutSources s;
  KernelSignature sig;
  sig.params = {P(0, 8, K::kPointer), P(8, 8, K::kPointer)};
  s.signature = &sig;
  KernelLayout l = build_layout(s);
  CHECK(l.types == TypeSource::kSignatureDb);
  CHECK_FALSE(l.slots_known);
  BufferIndex index = three_buffers();
  uint64_t a = 0x7f0000000000;
  void* params[] = {&a};  // the kernel really has one parameter
  AccessSet set;
  speculate_kernel(l, LaunchArgs{params}, index, &set);
  CHECK(set.kind == SetKind::kUnknown);
}

TEST_CASE("speculate: an IntDivider's (m1, shift) in a closure, its divisor before it, is no pointer") {
  // The 8B server: a 64 GiB KV pool from 0x6cc000000; an elementwise mul's
  // closure holds an OffsetCalculator whose divider of the vocabulary
  // (128256: m1 0x059eea08, shift 17) reads as 0x11059eea08, in the pool.
  BufferIndex index;
  REQUIRE(index.insert(0x6cc000000, uint64_t(64) << 30, 1));
  REQUIRE(index.insert(0x2000000000, 1 << 20, 2));
  // {int dims; IntDivider<uint32_t> sizes_[2] ({divisor, m1, shift});
  //  uint32_t pad; char* data[1]}, packed as the closure lays it out.
  struct __attribute__((packed)) Closure {
    int32_t dims;
    uint32_t d0, m0, s0;
    uint32_t d1, m1, s1;
    uint32_t pad;
    uint64_t data;
  };
  static_assert(sizeof(Closure) == 40);
  KernelLayout l = layout_of({P(0, sizeof(Closure), K::kUnknown)});
  Closure c{2, 128256, 0x059eea08, 17, 7, 0x24924925, 3, 0, 0x2000000040};
  void* params[] = {&c};
  AccessSet set;
  speculate_kernel(l, LaunchArgs{params}, index, &set);
  CHECK(access_of(set, 1) == 0);  // the pool is not in the set
  CHECK(access_of(set, 2) == (kRead | kWrite));
  CHECK(set.integer_words == 1);

  // Control: the same word without its divisor before it reads as an address.
  const uint32_t divisors[] = {128255, 128257, 0};
  for (uint32_t d : divisors) {
    CAPTURE(d);
    c.d0 = d;
    AccessSet other;
    speculate_kernel(l, LaunchArgs{params}, index, &other);
    CHECK(access_of(other, 1) == (kRead | kWrite));
    CHECK(other.integer_words == 0);
  }

  // A divisor of 1 (shift 0, m1 1) and a power of two (8: shift 3, m1 1):
  // words (1, 0) and (1, 3) are below 4 GiB or small-integer pairs anyway;
  // the check itself accepts them.
  c = Closure{2, 8, 1, 3, 1, 1, 0, 0, 0};
  AccessSet small;
  speculate_kernel(l, LaunchArgs{params}, index, &small);
  CHECK(small.count == 0);
}

namespace {
// An elementwise kernel's closure: PyTorch's OffsetCalculator<3>
// ({int dims; IntDivider sizes_[25]; uint32_t strides_[25][3]}, 604 bytes)
// and 3 data pointers, at `calc` and `data`; the rest stale stack words,
// two of them reading as addresses in the 64 GiB pool at 0x6cc000000.
std::vector<std::byte> elementwise_closure(uint32_t calc, uint32_t data, uint32_t size, int32_t dims) {
  std::vector<std::byte> c(size);
  auto put32 = [&](uint32_t at, uint32_t v) { std::memcpy(c.data() + at, &v, 4); };
  auto put64 = [&](uint32_t at, uint64_t v) { std::memcpy(c.data() + at, &v, 8); };
  for (uint32_t at = 0; at + 8 <= size; at += 8) put64(at, 0x0000000600000042 + at);  // stale, outside buffers
  put32(calc, uint32_t(dims));
  const uint32_t dividers[][3] = {{128, 1, 7}, {128256, 0x059eea08, 17}};  // (divisor, m1, shift)
  for (uint32_t k = 0; k < 2; k++)
    for (uint32_t f = 0; f < 3; f++) put32(calc + 4 + 12 * k + 4 * f, dividers[k][f]);
  for (uint32_t k = 0; k < 2; k++)
    for (uint32_t a = 0; a < 3; a++) put32(calc + 304 + 12 * k + 4 * a, 2 * (a + 1));
  put64(calc + 264, 0x0000000a00000000);  // sizes_[21..22], stale: in the pool
  put64(calc + 400, 0x00000007cc001000);  // strides_[8], stale: in the pool
  for (uint32_t t = 0; t < 3; t++) put64(data + 8 * t, 0x2000000000 + 0x1000 * t);
  return c;
}
}  // namespace

TEST_CASE("speculate: an offset calculator in a closure, its stale entries too, holds no pointer") {
  BufferIndex index;
  REQUIRE(index.insert(0x6cc000000, uint64_t(64) << 30, 1));
  REQUIRE(index.insert(0x2000000000, 1 << 20, 2));
  const struct {
    const char* layout;
    uint32_t calc, data, size;
  } cases[] = {
      {"the calculator first (the lambda uses it first), then the pointers, then a 1-byte functor", 0, 608, 640},
      {"the pointers first", 24, 632, 640},
  };
  for (const auto& k : cases) {
    CAPTURE(k.layout);
    KernelLayout l = layout_of({P(0, 4, K::kScalar), P(8, k.size, K::kUnknown)});
    int n = 1 << 20;
    std::vector<std::byte> closure = elementwise_closure(k.calc, k.calc ? 0 : k.data, k.size, 2);
    void* params[] = {&n, closure.data()};
    AccessSet set;
    speculate_kernel(l, LaunchArgs{params}, index, &set);
    CHECK(access_of(set, 1) == 0);  // neither stale word takes the pool in
    CHECK(access_of(set, 2) == (kRead | kWrite));
    CHECK(set.calculator_words >= 604 / 8);

    // Controls: no dims, or a divider the constructor would not make, and
    // the stale words are scanned as before.
    for (auto spoil : {0, 1}) {
      CAPTURE(spoil);
      std::vector<std::byte> other = closure;
      if (spoil == 0) std::memset(other.data() + k.calc, 0, 4);                   // dims 0
      if (spoil == 1) std::memset(other.data() + k.calc + 4 + 12 + 4, 0x55, 4);  // sizes_[1].m1 wrong
      void* other_params[] = {&n, other.data()};
      AccessSet scanned;
      speculate_kernel(l, LaunchArgs{other_params}, index, &scanned);
      CHECK(access_of(scanned, 1) == (kRead | kWrite));
      CHECK(scanned.calculator_words == 0);
    }
  }
}
