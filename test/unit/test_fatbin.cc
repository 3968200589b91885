// The fatbin and cubin readers: on what the machine's nvcc builds from
// fatbin/kernels.cu (test/unit/meson.build; skipped where there is no nvcc),
// and on synthetic and broken inputs (fatbin_builders.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <span>

#include "fatbin_builders.h"
#include "phos/speculation/fatbin.h"

using namespace phos::speculation;
using namespace phos::test;
using Catch::Matchers::Contains;

namespace {

// ---- nvcc's fixtures

// Where meson put the fixtures, or nullptr (with a warning) where nvcc was
// not found at configure time.
const char* fixture_dir() {
  const char* dir = std::getenv("PHOS_TEST_FATBIN_DIR");
  if (!dir) WARN("nvcc was not found when configuring: the fatbins it builds are not tested");
  return dir;
}

ByteVec load(const char* dir, const std::string& name) {
  std::ifstream in(std::string(dir) + "/kernels-" + name, std::ios::binary);
  INFO("fixture " << name);
  REQUIRE(in.good());
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ByteVec out(raw.size());
  std::transform(raw.begin(), raw.end(), out.begin(), [](char c) { return std::byte(c); });
  return out;
}

// read_ok: what a reader read, the test failing with its error where it
// fails; refused: its error where it must fail.
template <class T>
T read_ok(ImageResult<T> read) {
  INFO((read ? std::string() : read.error().message));
  REQUIRE(read.ok());
  return std::move(read).value();
}
template <class T>
ImageError refused(const ImageResult<T>& read) {
  REQUIRE_FALSE(read.ok());
  return read.error();
}

using Kernels = std::vector<CubinKernel>;

// The entries point into `fatbin`, which must outlive them.
std::vector<FatbinEntry> entries_of(const ByteVec& fatbin) { return read_ok(read_fatbin(fatbin)); }

ByteVec contents_of(const FatbinEntry& entry) { return read_ok(entry_contents(entry)); }

ByteVec payload_of(const FatbinEntry& e) { return ByteVec(e.payload.begin(), e.payload.end()); }

// A compressed entry's contents against the same uncompressed entry's: the
// latter keeps the zero padding to 8 bytes (nothing in its header says how
// much there is), the former not: equal ELF (a multiple of 8 bytes long),
// PTX text up to the padding.
bool same_contents(const ByteVec& compressed, const ByteVec& plain) {
  if (compressed.size() > plain.size() || plain.size() - compressed.size() >= 8) return false;
  auto padding = plain.begin() + long(compressed.size());
  return std::equal(compressed.begin(), compressed.end(), plain.begin()) &&
         std::all_of(padding, plain.end(), [](std::byte b) { return b == std::byte{0}; });
}

struct ExpectedKernel {
  std::string name;
  std::vector<std::pair<uint32_t, uint32_t>> params;  // offset, size, by ordinal
  uint32_t param_bytes;
};

// kernels.cu's kernels, worked out from their signatures by the C++ ABI
// (each parameter at the next multiple of its alignment).
const std::vector<ExpectedKernel>& expected_kernels() {
  static const std::vector<ExpectedKernel> k = {
      {"copy_ptrs", {{0, 8}, {8, 8}}, 16},
      // char, short (aligned 2), int, long long, pointer
      {"scalars", {{0, 1}, {2, 2}, {4, 4}, {8, 8}, {16, 8}}, 24},
      // char, pointer (aligned 8), short, int
      {"mixed", {{0, 1}, {8, 8}, {16, 2}, {20, 4}}, 24},
      // Span 16 (align 8), Triple 12 (align 4) at 16, InOut 24 at 28 -> 32, Five 40 at 56
      {"_Z7structs4Span6Triple5InOut4Five", {{0, 16}, {16, 12}, {32, 24}, {56, 40}}, 96},
      {"_Z4fillIfEvPT_S0_", {{0, 8}, {8, 4}}, 12},
      {"_Z4fillIdEvPT_S0_", {{0, 8}, {8, 8}}, 16},
      {"_Z5applyIZ12launch_applyPfEUlvE_EvT_", {{0, 8}}, 8},  // the closure holds one pointer
      // ten ints, four pointers from 40, a char at 72, a double at 80, a pointer at 88
      {"many",
       {{0, 4}, {4, 4}, {8, 4}, {12, 4}, {16, 4}, {20, 4}, {24, 4}, {28, 4}, {32, 4}, {36, 4},
        {40, 8}, {48, 8}, {56, 8}, {64, 8}, {72, 1}, {80, 8}, {88, 8}},
       96},
      {"big_param", {{0, 5000}, {5000, 8}}, 5008},  // 5000 is a multiple of 8
      {"no_params", {}, 0},
  };
  return k;
}

const CubinKernel* find_kernel(const Kernels& ks, const std::string& name) {
  for (const CubinKernel& k : ks)
    if (k.name == name) return &k;
  return nullptr;
}

std::set<std::string> names_of(const Kernels& ks) {
  std::set<std::string> out;
  for (const CubinKernel& k : ks) out.insert(k.name);
  return out;
}

void check_kernels(const Kernels& ks) {
  std::set<std::string> want;
  for (const ExpectedKernel& e : expected_kernels()) want.insert(e.name);
  CHECK(names_of(ks) == want);
  CHECK(ks.size() == want.size());
  for (const ExpectedKernel& e : expected_kernels()) {
    INFO("kernel " << e.name);
    const CubinKernel* k = find_kernel(ks, e.name);
    REQUIRE(k);
    CHECK(k->param_bytes == e.param_bytes);
    REQUIRE(k->params.size() == e.params.size());
    for (size_t i = 0; i < e.params.size(); i++) {
      INFO("parameter " << i);
      CHECK(k->params[i].ordinal == i);
      CHECK(k->params[i].offset == e.params[i].first);
      CHECK(k->params[i].size == e.params[i].second);
    }
  }
}

Kernels cubin_kernels(const ByteVec& elf) { return read_ok(read_cubin_kernels(elf)); }

Kernels image_kernels(const void* image, uint32_t arch) { return read_ok(module_kernels(image, arch)); }

std::string image_error(const void* image, uint32_t arch) { return refused(module_kernels(image, arch)).message; }

ImageFault image_fault(const void* image, uint32_t arch) { return refused(module_kernels(image, arch)).fault; }

bool starts_with(const ByteVec& b, const std::string& prefix) {
  return b.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), b.begin(),
                                                 [](char c, std::byte x) { return std::byte(c) == x; });
}

// cudart's __fatBinC_Wrapper_t.
struct Wrapper {
  int magic;
  int version;
  const void* data;
  void* filename_or_fatbins;
};

}  // namespace

TEST_CASE("fatbin: nvcc's uncompressed fatbin holds an sm_90 cubin and compute_90 PTX") {
  const char* dir = fixture_dir();
  if (!dir) return;
  ByteVec fatbin = load(dir, "plain.fatbin");
  auto es = entries_of(fatbin);
  REQUIRE(es.size() == 2);
  CHECK(es[0].kind == FatbinEntryKind::kElf);
  CHECK(es[0].arch == 90);
  CHECK(es[0].compression == Compression::kNone);
  CHECK(es[0].version_major == 1);
  CHECK(es[1].kind == FatbinEntryKind::kPtx);
  CHECK(es[1].arch == 90);
  CHECK(es[1].compression == Compression::kNone);
  CHECK(es[1].version_major >= 8);  // the PTX ISA version
  for (const FatbinEntry& e : es) {
    // The payload is where the offset says, inside the file.
    REQUIRE(e.offset + e.payload.size() <= fatbin.size());
    CHECK(e.payload.data() == reinterpret_cast<const std::byte*>(fatbin.data()) + e.offset);
    CHECK(e.uncompressed_size == e.payload.size());
  }
  ByteVec elf = contents_of(es[0]);
  CHECK(starts_with(elf, "\x7f" "ELF"));
  CHECK(cubin_arch(elf) == 90);
  CHECK(elf == load(dir, "sm90.cubin"));  // the same compilation
  check_kernels(cubin_kernels(elf));
  std::string ptx(reinterpret_cast<const char*>(es[1].payload.data()), es[1].payload.size());
  CHECK_THAT(ptx, Contains(".target sm_90"));
  CHECK_THAT(ptx, Contains(".entry copy_ptrs"));
}

TEST_CASE("fatbin: LZ4 and ZSTD entries decompress to the uncompressed fatbin's bytes") {
  const char* dir = fixture_dir();
  if (!dir) return;
  ByteVec plain_fatbin = load(dir, "plain.fatbin");
  auto plain = entries_of(plain_fatbin);
  REQUIRE(plain.size() == 2);
  const std::pair<const char*, Compression> cases[] = {{"lz4.fatbin", Compression::kLz4},
                                                       {"zstd.fatbin", Compression::kZstd}};
  for (auto [name, compression] : cases) {
    INFO(name);
    ByteVec fatbin = load(dir, name);
    auto es = entries_of(fatbin);
    REQUIRE(es.size() == 2);
    for (size_t i = 0; i < 2; i++) {
      CHECK(es[i].kind == plain[i].kind);
      CHECK(es[i].arch == 90);
      CHECK(es[i].compression == compression);
      CHECK(es[i].payload.size() < plain[i].payload.size());
      CHECK(same_contents(contents_of(es[i]), payload_of(plain[i])));
    }
    CHECK(contents_of(es[0]) == payload_of(plain[0]));  // the ELF, byte for byte
    CHECK(es[0].uncompressed_size == plain[0].payload.size());
    // ZSTD payloads are zstd frames (magic 28 b5 2f fd); LZ4 ones raw blocks.
    CHECK(starts_with(payload_of(es[0]), "\x28\xb5\x2f\xfd") == (compression == Compression::kZstd));
    check_kernels(image_kernels(fatbin.data(), 90));
  }
}

TEST_CASE("cubin: kernels and parameter layouts of nvcc's sm_90 cubin") {
  const char* dir = fixture_dir();
  if (!dir) return;
  ByteVec elf = load(dir, "sm90.cubin");
  CHECK(cubin_arch(elf) == 90);
  auto ks = cubin_kernels(elf);
  check_kernels(ks);
  // sm_90 cubins do not say which parameters are pointers (cubin.cc).
  for (const CubinKernel& k : ks)
    for (const CubinParam& p : k.params) CHECK_FALSE(p.pointer_known);
}

TEST_CASE("cubin: nvcc's sm_120 cubin says which parameters are pointers") {
  const char* dir = fixture_dir();
  if (!dir) return;
  ByteVec elf = load(dir, "sm120.cubin");
  CHECK(cubin_arch(elf) == 120);
  auto ks = cubin_kernels(elf);
  check_kernels(ks);
  auto pointers = [&](const std::string& name) {
    const CubinKernel* k = find_kernel(ks, name);
    REQUIRE(k);
    std::vector<int> out;  // 1 a pointer, 0 unknown
    for (const CubinParam& p : k->params) {
      CHECK(p.pointer_known == p.is_pointer);
      out.push_back(p.is_pointer);
    }
    return out;
  };
  CHECK(pointers("copy_ptrs") == std::vector<int>{1, 1});
  CHECK(pointers("scalars") == std::vector<int>{0, 0, 0, 0, 1});  // the long long is not one
  CHECK(pointers("mixed") == std::vector<int>{0, 1, 0, 0});
  CHECK(pointers("_Z7structs4Span6Triple5InOut4Five") == std::vector<int>{0, 0, 0, 0});  // structs say nothing
  CHECK(pointers("_Z4fillIdEvPT_S0_") == std::vector<int>{1, 0});
  CHECK(pointers("big_param") == std::vector<int>{0, 1});  // through EIATTR_KPARAM_INFO_V2
}

TEST_CASE("module_kernels: fatbin, cudart's wrapper, raw cubin, by the device's arch") {
  const char* dir = fixture_dir();
  if (!dir) return;
  ByteVec fatbin = load(dir, "plain.fatbin");
  check_kernels(image_kernels(fatbin.data(), 90));

  Wrapper w{int(kFatbinWrapperMagic), 1, fatbin.data(), nullptr};
  check_kernels(image_kernels(&w, 90));
  w.version = 2;  // relocatable code's
  check_kernels(image_kernels(&w, 90));

  ByteVec cubin = load(dir, "sm90.cubin");
  check_kernels(image_kernels(cubin.data(), 90));
  CHECK_THAT(image_error(cubin.data(), 89), Contains("cubin for sm_90"));

  // sm_80 and sm_86 cubins: the exact one, else the newest older one of the major.
  ByteVec multi = load(dir, "sm80-sm86.fatbin");
  auto es = entries_of(multi);
  REQUIRE(es.size() == 2);
  CHECK(es[0].arch == 80);
  CHECK(es[1].arch == 86);
  for (uint32_t arch : {80u, 86u, 87u, 89u}) check_kernels(image_kernels(multi.data(), arch));
  CHECK_THAT(image_error(multi.data(), 75), Contains("no cubin for sm_75 (has sm_80 ELF, sm_86 ELF)"));
  CHECK(image_fault(multi.data(), 75) == ImageFault::kNoEntryForArch);
  CHECK_THAT(image_error(multi.data(), 90), Contains("no cubin for sm_90"));
  CHECK_THAT(image_error(fatbin.data(), 100), Contains("no cubin for sm_100"));
}

TEST_CASE("module_kernels: a PTX-only fatbin has no cubin to read") {
  const char* dir = fixture_dir();
  if (!dir) return;
  ByteVec fatbin = load(dir, "ptx.fatbin");
  auto es = entries_of(fatbin);
  REQUIRE(es.size() == 1);
  CHECK(es[0].kind == FatbinEntryKind::kPtx);
  CHECK(image_error(fatbin.data(), 90) == "fatbin: no cubin for sm_90 (has compute_90 PTX)");
  CHECK(image_fault(fatbin.data(), 90) == ImageFault::kPtxOnly);
}

TEST_CASE("fatbin: relocatable code and LTO IR") {
  const char* dir = fixture_dir();
  if (!dir) return;
  // -rdc: one fatbin as well; the __device__ function's .nv.info section
  // does not make it a kernel.
  ByteVec rdc = load(dir, "rdc.fatbin");
  auto es = entries_of(rdc);
  REQUIRE(es.size() == 2);
  CHECK(es[0].kind == FatbinEntryKind::kElf);
  CHECK(es[1].kind == FatbinEntryKind::kPtx);
  auto ks = image_kernels(rdc.data(), 90);
  check_kernels(ks);
  CHECK_FALSE(find_kernel(ks, "_Z5twicef"));

  ByteVec lto = load(dir, "lto.fatbin");
  es = entries_of(lto);
  REQUIRE(es.size() == 1);
  CHECK(es[0].kind == FatbinEntryKind::kLtoIr);
  CHECK(es[0].arch == 90);
  CHECK_THAT(image_error(lto.data(), 90), Contains("no cubin for sm_90 (has compute_90 LTO IR)"));
}

TEST_CASE("fatbin: fatbins laid end to end, as in an executable's .nv_fatbin") {
  const char* dir = fixture_dir();
  if (!dir) return;
  ByteVec first = load(dir, "plain.fatbin"), second = load(dir, "zstd.fatbin");
  ByteVec both = first;
  both.insert(both.end(), second.begin(), second.end());
  auto es = entries_of(both);
  REQUIRE(es.size() == 4);
  CHECK(es[2].compression == Compression::kZstd);
  CHECK(es[2].offset > first.size());  // offsets count from the start of all
  CHECK(contents_of(es[2]) == payload_of(es[0]));
  CHECK(same_contents(contents_of(es[3]), payload_of(es[1])));
}

// ---- synthetic fatbins

namespace {

const ByteVec kElfish = to_bytes("\x7f" "ELF not really, but the container does not look inside");

std::string fatbin_error(const ByteVec& bytes) { return refused(read_fatbin(bytes)).message; }

std::string contents_error(const FatbinEntry& entry) { return refused(entry_contents(entry)).message; }

// The single entry of `fatbin` (which must outlive it).
FatbinEntry only_entry(const ByteVec& fatbin) {
  auto es = entries_of(fatbin);
  REQUIRE(es.size() == 1);
  return es[0];
}

constexpr size_t kFirstEntry = kFatbinHeaderBytes;

}  // namespace

TEST_CASE("fatbin: synthetic entries, compressed and not, with an identifier") {
  ByteVec ptx = to_bytes(std::string(3000, 'x') + ".version 9.0");
  TestEntry named = plain_entry(kTestKindElf, 75, kElfish);
  named.identifier = "kernels.cu";
  ByteVec fatbin = make_fatbin({named, lz4_entry(kTestKindPtx, 80, ptx), zstd_entry(kTestKindElf, 86, kElfish)});
  auto es = entries_of(fatbin);
  REQUIRE(es.size() == 3);
  CHECK(es[0].identifier == "kernels.cu");
  CHECK(es[0].arch == 75);
  CHECK(es[0].version_major == 1);
  CHECK(es[0].version_minor == 8);
  CHECK(es[1].kind == FatbinEntryKind::kPtx);
  CHECK(es[1].compression == Compression::kLz4);
  CHECK(es[1].uncompressed_size == ptx.size());
  CHECK(es[2].compression == Compression::kZstd);
  // Uncompressed, the contents are the payload with its padding to 8 bytes.
  ByteVec padded = kElfish;
  padded.resize((padded.size() + 7) / 8 * 8);
  CHECK(contents_of(es[0]) == padded);
  CHECK(contents_of(es[1]) == ptx);
  CHECK(contents_of(es[2]) == kElfish);
  CHECK(std::string(fatbin_entry_kind_name(es[1].kind)) == "PTX");
  // A length that counts the NUL padding after the name too.
  patch_le(&fatbin, kFirstEntry + kEntryIdentifierField + 4, 16, 4);
  CHECK(entries_of(fatbin)[0].identifier == "kernels.cu");
  CHECK(std::string(fatbin_compression_name(es[2].compression)) == "ZSTD");
}

TEST_CASE("fatbin: broken containers are refused with where they break") {
  ByteVec good = make_fatbin({plain_entry(kTestKindElf, 90, kElfish)});
  REQUIRE(entries_of(good).size() == 1);

  CHECK_THAT(fatbin_error({}), Contains("fatbin at offset 0: header truncated"));
  CHECK_THAT(fatbin_error(ByteVec(good.begin(), good.begin() + 10)), Contains("header truncated"));

  ByteVec b = good;
  b[0] = std::byte{0};
  CHECK(fatbin_error(b) == "fatbin at offset 0: bad magic");

  b = good;
  patch_le(&b, 4, 2, 2);
  CHECK_THAT(fatbin_error(b), Contains("unsupported version 2"));

  b = good;
  patch_le(&b, 8, good.size(), 8);  // the size counts the header too: 16 bytes past the end
  CHECK_THAT(fatbin_error(b), Contains("run past"));

  b = good;
  patch_le(&b, 8, ~uint64_t(0) - 4, 8);  // overflows when added to the offset
  CHECK_THAT(fatbin_error(b), Contains("size 0xfffffffffffffffb beyond the 4294967296-byte limit"));

  b = good;
  patch_le(&b, 6, 8, 2);  // a header size below the header's own
  CHECK_THAT(fatbin_error(b), Contains("fatbin at offset 0: header size 8 (minimum 16)"));

  // A truncated copy: the header still claims the whole size.
  CHECK_THAT(fatbin_error(ByteVec(good.begin(), good.end() - 8)), Contains("run past"));
}

TEST_CASE("fatbin: broken entries are refused with their index and offset") {
  ByteVec good = make_fatbin({plain_entry(kTestKindElf, 90, kElfish), plain_entry(kTestKindPtx, 90, kElfish)});
  auto es = entries_of(good);
  REQUIRE(es.size() == 2);
  size_t second = es[0].offset + es[0].payload.size();

  ByteVec b = good;
  patch_le(&b, kFirstEntry + kEntrySizeField, ~uint64_t(0) - 8, 8);  // near u64 max
  CHECK_THAT(fatbin_error(b), Contains("fatbin entry 0 at offset 0x10: payload size 0xfffffffffffffff7 runs past"));

  b = good;
  patch_le(&b, second + kEntrySizeField, 4096, 8);
  char where[64];
  std::snprintf(where, sizeof where, "fatbin entry 1 at offset %#zx: payload size 0x1000 runs past", second);
  CHECK_THAT(fatbin_error(b), Contains(where));

  b = good;
  patch_le(&b, kFirstEntry + 4, 0x20, 4);  // header size below the fixed fields
  CHECK_THAT(fatbin_error(b), Contains("fatbin entry 0 at offset 0x10: header size 32"));

  b = good;
  patch_le(&b, kFirstEntry + 4, 0x10000000, 4);
  CHECK_THAT(fatbin_error(b), Contains("header size 268435456"));

  b = good;
  patch_le(&b, kFirstEntry + kEntryIdentifierField, 0x40, 4);
  patch_le(&b, kFirstEntry + kEntryIdentifierField + 4, 0x1000, 4);
  CHECK_THAT(fatbin_error(b), Contains("identifier (offset 0x40, length 4096) lies outside"));

  // An entry header cut by the fatbin's end: fewer than 0x40 bytes left.
  b = make_fatbin({});
  b.resize(b.size() + 0x20);
  patch_le(&b, 8, 0x20, 8);
  CHECK_THAT(fatbin_error(b), Contains("fatbin entry 0 at offset 0x10: header truncated: 32 bytes left"));
}

TEST_CASE("fatbin: broken compressed payloads are refused") {
  ByteVec contents = to_bytes(std::string(4000, 'a') + "tail");
  ByteVec lz4 = make_fatbin({lz4_entry(kTestKindElf, 90, contents)});
  ByteVec zstd = make_fatbin({zstd_entry(kTestKindElf, 90, contents)});

  SECTION("garbage payloads") {
    FatbinEntry e = only_entry(lz4);
    ByteVec garbage(e.payload.size(), std::byte{0xff});
    e.payload = garbage;
    CHECK_THAT(contents_error(e), Contains("corrupt LZ4 data"));
    e = only_entry(zstd);
    garbage.assign(e.payload.size(), std::byte{0xff});
    e.payload = garbage;
    CHECK_THAT(contents_error(e), Contains("not zstd frames"));
  }
  SECTION("uncompressed sizes that are not the data's") {
    for (const ByteVec* f : {&lz4, &zstd}) {
      ByteVec b = *f;
      patch_le(&b, kFirstEntry + kEntryUncompressedField, contents.size() - 1, 8);
      std::string error = contents_error(only_entry(b));
      CHECK_THAT(error, Contains("fatbin entry at offset 0x50 (sm_90 ELF, "));
      CHECK_THAT(error, Contains("corrupt"));
      patch_le(&b, kFirstEntry + kEntryUncompressedField, contents.size() + 1, 8);
      CHECK_FALSE(contents_error(only_entry(b)).empty());
    }
  }
  SECTION("sizes no data could have") {
    ByteVec b = lz4;
    patch_le(&b, kFirstEntry + kEntryUncompressedField, 1 << 24, 8);
    CHECK_THAT(contents_error(only_entry(b)), Contains("beyond what LZ4 can expand to"));
    b = zstd;
    patch_le(&b, kFirstEntry + kEntryUncompressedField, 1 << 24, 8);
    CHECK_THAT(contents_error(only_entry(b)), Contains("zstd frames hold at most"));
    patch_le(&b, kFirstEntry + kEntryUncompressedField, ~uint64_t(0), 8);
    CHECK_THAT(contents_error(only_entry(b)), Contains("beyond the 1073741824 limit"));
  }
  SECTION("compressed sizes past the payload, or none") {
    ByteVec b = zstd;
    patch_le(&b, kFirstEntry + kEntryCompressedField, 0x100000, 4);
    CHECK_THAT(fatbin_error(b), Contains("fatbin entry 0 at offset 0x10: ZSTD compressed size 1048576"));
    patch_le(&b, kFirstEntry + kEntryCompressedField, 0, 4);
    CHECK_THAT(fatbin_error(b), Contains("compressed size 0"));
  }
  SECTION("both compression flags") {
    TestEntry e = zstd_entry(kTestKindElf, 90, contents);
    e.flags |= kTestFlagLz4;
    ByteVec fatbin = make_fatbin({e});
    FatbinEntry entry = only_entry(fatbin);
    CHECK(entry.compression == Compression::kUnknown);
    CHECK_THAT(contents_error(entry), Contains("both LZ4 and ZSTD flags"));
  }
}

// ---- synthetic cubins

namespace {

std::string cubin_error(const ByteVec& elf) { return refused(read_cubin_kernels(elf)).message; }

TestKernel two_params() {
  TestKernel k;
  k.name = "k";
  k.params = {{0, 0, 8, 0, 0, false}, {1, 8, 4, 0, 0, false}};
  k.cbank_param_size = 12;
  return k;
}

}  // namespace

TEST_CASE("cubin: synthetic records: both parameter record kinds, pointer spaces, parameter bank sizes") {
  TestKernel k1;
  k1.name = "_Z2k1PfS_ic";
  k1.params = {{0, 0, 8, 4, 4, false},  // .ptr .global .align 16
               {1, 8, 8, 2, 5, false},  // .ptr .align 4 (generic)
               {2, 16, 4, 0, 0, false},
               {3, 20, 1, 0, 0, false}};
  k1.cbank_param_size = 24;
  TestKernel k2;
  k2.name = "k2";
  k2.params = {{0, 0, 20000, 0, 0, true}, {1, 20000, 8, 3, 2, true}};  // KPARAM_INFO_V2; a .shared pointer
  k2.param_cbank_size = 20008;                                         // only EIATTR_PARAM_CBANK
  TestKernel device_fn;
  device_fn.name = "_Z3addii";
  device_fn.entry = false;
  auto ks = cubin_kernels(make_cubin({k1, device_fn, k2}));
  REQUIRE(ks.size() == 2);
  CHECK(ks[0].name == "_Z2k1PfS_ic");
  CHECK(ks[0].param_bytes == 24);
  REQUIRE(ks[0].params.size() == 4);
  CHECK(ks[0].params[0] == CubinParam{0, 0, 8, 4, true, true});
  CHECK(ks[0].params[1] == CubinParam{1, 8, 8, 2, true, true});
  CHECK(ks[0].params[2] == CubinParam{2, 16, 4, 0, false, false});
  CHECK(ks[0].params[3] == CubinParam{3, 20, 1, 0, false, false});
  CHECK(ks[1].name == "k2");
  CHECK(ks[1].param_bytes == 20008);
  REQUIRE(ks[1].params.size() == 2);
  CHECK(ks[1].params[0] == CubinParam{0, 0, 20000, 0, false, false});
  CHECK(ks[1].params[1] == CubinParam{1, 20000, 8, 3, true, true});
}

TEST_CASE("cubin: the SM version from e_flags, in both ELF ABI versions") {
  CHECK(cubin_arch(make_cubin({}, 0x06005a04, 8)) == 90);
  CHECK(cubin_arch(make_cubin({}, 0x06007802, 8)) == 120);
  CHECK(cubin_arch(make_cubin({}, 0x00500550, 7)) == 80);  // CUDA 12's: EF_CUDA_SM80 in the low byte
  CHECK(cubin_arch(to_bytes("\x7f" "ELF")) == 0);
  CHECK(cubin_arch(make_fatbin({})) == 0);
}

TEST_CASE("cubin: a kernel without .nv.info has no parameters") {
  CubinLayout layout;
  ByteVec elf = make_cubin({two_params()}, kTestElfFlagsSm90, 8, &layout);
  patch_le(&elf, layout.first_info_section_header + 4, 1, 4);  // no longer SHT_CUDA_INFO
  auto ks = cubin_kernels(elf);
  REQUIRE(ks.size() == 1);
  CHECK(ks[0].params.empty());
  CHECK(ks[0].param_bytes == 0);
}

TEST_CASE("cubin: broken ELF is refused with where it breaks") {
  CubinLayout layout;
  ByteVec good = make_cubin({two_params()}, kTestElfFlagsSm90, 8, &layout);
  REQUIRE(cubin_kernels(good).size() == 1);

  CHECK_THAT(cubin_error(ByteVec(good.begin(), good.begin() + 40)), Contains("shorter than an ELF header"));
  ByteVec b = good;
  b[1] = std::byte{'X'};
  CHECK(cubin_error(b) == "ELF: no ELF magic at offset 0");
  b = good;
  b[4] = std::byte{1};
  CHECK_THAT(cubin_error(b), Contains("not 64-bit little-endian"));
  b = good;
  patch_le(&b, 18, 62, 2);
  CHECK(cubin_error(b) == "ELF: e_machine 62, not EM_CUDA");

  b = good;
  patch_le(&b, 40, good.size() - 64, 8);  // e_shoff: the table runs past the end
  CHECK_THAT(cubin_error(b), Contains("section headers at offset"));
  b = good;
  patch_le(&b, 60, 0xfff0, 2);  // e_shnum
  CHECK_THAT(cubin_error(b), Contains("65520 section headers"));

  b = good;
  patch_le(&b, layout.first_info_section_header + 24, ~uint64_t(0) - 4, 8);  // sh_offset near u64 max
  CHECK_THAT(cubin_error(b), Contains("section 4 (offset 0xfffffffffffffffb, size 0x"));
  b = good;
  patch_le(&b, layout.first_info_section_header + 32, good.size(), 8);  // sh_size
  CHECK_THAT(cubin_error(b), Contains("section 4 (offset"));

  b = good;
  patch_le(&b, layout.first_info_section_header, 0x7fffffff, 4);  // sh_name
  CHECK_THAT(cubin_error(b), Contains("section 4: name offset 0x7fffffff outside"));

  b = good;
  patch_le(&b, layout.symtab_contents + 24, 0x10000, 4);  // the kernel symbol's st_name
  CHECK_THAT(cubin_error(b), Contains("symbol 1 (kernel): bad name offset 0x10000"));

  // A section name table without contents (SHT_NOBITS), its offset garbage:
  // found by fuzzing, when its offset was not checked.
  b = good;
  size_t shstrtab_header = layout.first_info_section_header - 3 * 64;
  patch_le(&b, shstrtab_header + 4, 8, 4);
  patch_le(&b, shstrtab_header + 24, ~uint64_t(0) - 0x100, 8);
  CHECK_THAT(cubin_error(b), Contains("outside the section name table"));

  b = good;
  patch_le(&b, 62, 40, 2);  // e_shstrndx
  CHECK_THAT(cubin_error(b), Contains("section name table index 40 out of range"));
}

TEST_CASE("cubin: broken .nv.info records are refused with the kernel and offset") {
  auto with_records = [](const ByteVec& records) {
    TestKernel k = two_params();
    k.extra_records = records;
    return make_cubin({k});
  };
  ByteWriter w;
  w.u8(4), w.u8(0x17), w.u16(200);  // an SVAL whose bytes run past the section
  std::string error = cubin_error(with_records(w.out));
  CHECK_THAT(error, Contains("ELF: kernel k (section 4): record at offset 0x"));
  CHECK_THAT(error, Contains("200 value bytes run past the section end"));

  w = {};
  w.u8(9), w.u8(0x17), w.u16(0);
  CHECK_THAT(cubin_error(with_records(w.out)), Contains("unknown format 9"));

  w = {};
  w.u8(4);
  CHECK_THAT(cubin_error(with_records(w.out)), Contains("truncated header"));

  w = {};
  w.u8(4), w.u8(0x17), w.u16(8), w.u64(0);  // a parameter record of 8 bytes
  CHECK_THAT(cubin_error(with_records(w.out)), Contains("8 bytes, not 12"));

  w = {};
  w.u8(4), w.u8(0x0a), w.u16(4), w.u32(0);
  CHECK_THAT(cubin_error(with_records(w.out)), Contains("EIATTR_PARAM_CBANK at offset"));

  TestKernel k = two_params();
  k.params[1].ordinal = 0;
  CHECK_THAT(cubin_error(make_cubin({k})), Contains("parameter ordinal 0 appears twice"));
  k = two_params();
  k.params[1].ordinal = 2;
  CHECK_THAT(cubin_error(make_cubin({k})), Contains("parameter ordinal 1 is missing"));
  k = two_params();
  k.cbank_param_size = 10;
  CHECK_THAT(cubin_error(make_cubin({k})), Contains("parameter 1 (offset 8, size 4) ends past the 10 parameter bytes"));
}

TEST_CASE("module_kernels: synthetic images, and what is none") {
  ByteVec elf = make_cubin({two_params()});
  CHECK(image_kernels(elf.data(), 90).size() == 1);
  CHECK(image_kernels(elf.data(), 92).size() == 1);  // same major, newer device
  CHECK(image_error(elf.data(), 100) == "module image: cubin for sm_90, which sm_100 cannot run");

  ByteVec fatbin = make_fatbin({zstd_entry(kTestKindElf, 90, elf), plain_entry(kTestKindPtx, 90, kElfish)});
  // Past the fatbin's end: what its header does not cover is never read.
  fatbin.resize(fatbin.size() + 64, std::byte{0xee});
  CHECK(image_kernels(fatbin.data(), 90).size() == 1);
  Wrapper w{int(kFatbinWrapperMagic), 1, fatbin.data(), nullptr};
  CHECK(image_kernels(&w, 90).size() == 1);

  w.version = 3;
  CHECK(image_error(&w, 90) == "fatbin wrapper: unknown version 3");
  w = {int(kFatbinWrapperMagic), 1, nullptr, nullptr};
  CHECK(image_error(&w, 90) == "fatbin wrapper: null fatbin pointer");
  w.data = elf.data();
  CHECK_THAT(image_error(&w, 90), Contains("not a fatbin's"));
  uint32_t junk[4] = {0x12345678, 0, 0, 0};
  CHECK_THAT(image_error(junk, 90), Contains("magic 0x12345678 is none of"));
  CHECK(image_error(nullptr, 90) == "module image: null pointer");

  // The cubin the device runs: the exact one, else the newest older one of
  // the same major version, wherever it is in the fatbin.
  ByteVec cubins;
  {
    std::vector<TestEntry> entries;
    for (uint32_t arch : {80, 86, 81}) {  // neither the first nor the last match is the one
      TestKernel k = two_params();
      k.name = "from_sm_" + std::to_string(arch);
      entries.push_back(plain_entry(kTestKindElf, arch, make_cubin({k})));
    }
    entries.push_back(plain_entry(kTestKindPtx, 89, kElfish));
    cubins = make_fatbin(entries);
  }
  for (auto [arch, name] : {std::pair<uint32_t, const char*>{80, "from_sm_80"}, {81, "from_sm_81"}, {85, "from_sm_81"},
                            {86, "from_sm_86"}, {89, "from_sm_86"}}) {
    INFO("sm_" << arch);
    auto ks = image_kernels(cubins.data(), arch);
    REQUIRE(ks.size() == 1);
    CHECK(ks[0].name == name);
  }

  // A cubin entry that is not one: the error says which entry.
  ByteVec bad = make_fatbin({plain_entry(kTestKindElf, 90, kElfish)});
  CHECK_THAT(image_error(bad.data(), 90), Contains("fatbin: sm_90 ELF at offset 0x50: ELF:"));
}

TEST_CASE("module_ptx: the newest PTX the GPU can run, from a fatbin or cudart's wrapper") {
  const char* dir = fixture_dir();
  if (!dir) return;
  ByteVec fatbin = load(dir, "plain.fatbin");
  std::string ptx = read_ok(module_ptx(fatbin.data(), 90));
  CHECK_THAT(ptx, Contains(".target sm_90"));
  CHECK_THAT(ptx, Contains(".entry copy_ptrs"));
  CHECK(ptx.find('\0') == std::string::npos);  // the entry's padding is not text
  Wrapper w{int(kFatbinWrapperMagic), 1, fatbin.data(), nullptr};
  CHECK(read_ok(module_ptx(&w, 100)) == ptx);  // compute_90 PTX runs on sm_100 too
  ImageError none = refused(module_ptx(fatbin.data(), 89));
  CHECK(none.fault == ImageFault::kNoEntryForArch);
  CHECK_THAT(none.message, Contains("no PTX that sm_89 can run"));
  ByteVec zstd = load(dir, "zstd.fatbin");
  CHECK(read_ok(module_ptx(zstd.data(), 90)) == ptx);
  ByteVec cubin = load(dir, "sm90.cubin");
  ImageError not_fatbin = refused(module_ptx(cubin.data(), 90));
  CHECK(not_fatbin.fault == ImageFault::kUnrecognized);
  CHECK_THAT(not_fatbin.message, Contains("not a fatbin"));
}

// ---- typed errors: each fault from an input made to have it

namespace {

ImageFault fatbin_fault(const ByteVec& bytes) { return refused(read_fatbin(bytes)).fault; }
ImageFault contents_fault(const FatbinEntry& entry) { return refused(entry_contents(entry)).fault; }
ImageFault cubin_fault(const ByteVec& elf) { return refused(read_cubin_kernels(elf)).fault; }

// A fatbin holding one cubin for `arch` whose only kernel is two_params().
ByteVec fatbin_with_cubin(uint32_t arch) {
  return make_fatbin({plain_entry(kTestKindElf, arch, make_cubin({two_params()}))});
}

}  // namespace

TEST_CASE("image faults: what is not a fatbin or cubin is kUnrecognized") {
  const char* ptx = ".version 9.0\n.target sm_90\n";
  CHECK(image_fault(ptx, 90) == ImageFault::kUnrecognized);
  CHECK(image_fault(nullptr, 90) == ImageFault::kUnrecognized);
  CHECK(fatbin_fault(to_bytes(ptx)) == ImageFault::kUnrecognized);
  ByteVec x86 = make_cubin({two_params()});
  patch_le(&x86, 18, 62, 2);  // EM_X86_64
  CHECK(cubin_fault(x86) == ImageFault::kUnrecognized);
  CHECK(image_fault(x86.data(), 90) == ImageFault::kUnrecognized);
  ByteVec cubin = make_cubin({two_params()});
  CHECK(refused(module_ptx(cubin.data(), 90)).fault == ImageFault::kUnrecognized);
  CHECK(refused(module_ptx(ptx, 90)).fault == ImageFault::kUnrecognized);
}

TEST_CASE("image faults: code for other GPUs is kNoEntryForArch, PTX alone kPtxOnly") {
  ByteVec sm80 = fatbin_with_cubin(80);
  CHECK(image_kernels(sm80.data(), 86).size() == 1);
  ImageError other = refused(module_kernels(sm80.data(), 90));
  CHECK(other.fault == ImageFault::kNoEntryForArch);
  CHECK(other.message == "fatbin: no cubin for sm_90 (has sm_80 ELF)");
  ByteVec cubin = make_cubin({two_params()});  // sm_90
  CHECK(image_fault(cubin.data(), 100) == ImageFault::kNoEntryForArch);
  CHECK(image_fault(cubin.data(), 89) == ImageFault::kNoEntryForArch);

  ByteVec ptx_only = make_fatbin({plain_entry(kTestKindPtx, 90, kElfish), plain_entry(8, 90, kElfish)});
  ImageError ptx = refused(module_kernels(ptx_only.data(), 90));
  CHECK(ptx.fault == ImageFault::kPtxOnly);
  CHECK(ptx.message == "fatbin: no cubin for sm_90 (has compute_90 PTX, compute_90 LTO IR)");
  ByteVec empty = make_fatbin({});
  CHECK(image_fault(empty.data(), 90) == ImageFault::kPtxOnly);

  ByteVec newer_ptx = make_fatbin({plain_entry(kTestKindPtx, 100, kElfish)});
  ImageError no_ptx = refused(module_ptx(newer_ptx.data(), 90));
  CHECK(no_ptx.fault == ImageFault::kNoEntryForArch);
  CHECK(no_ptx.message == "fatbin: no PTX that sm_90 can run (has compute_100 PTX)");
}

TEST_CASE("image faults: broken containers, entries and cubins are kMalformed") {
  ByteVec good = fatbin_with_cubin(90);
  CHECK(fatbin_fault(ByteVec(good.begin(), good.end() - 8)) == ImageFault::kMalformed);
  ByteVec b = good;
  patch_le(&b, kFirstEntry + 4, 0x20, 4);  // entry header size
  CHECK(fatbin_fault(b) == ImageFault::kMalformed);
  CHECK(image_fault(b.data(), 90) == ImageFault::kMalformed);

  CubinLayout layout;
  ByteVec elf = make_cubin({two_params()}, kTestElfFlagsSm90, 8, &layout);
  patch_le(&elf, 62, 40, 2);  // e_shstrndx out of range
  CHECK(cubin_fault(elf) == ImageFault::kMalformed);

  // An ELF entry that is no cubin makes the fatbin malformed, not unrecognized.
  ByteVec not_cubin = make_fatbin({plain_entry(kTestKindElf, 90, kElfish)});
  CHECK(image_fault(not_cubin.data(), 90) == ImageFault::kMalformed);
  ByteVec x86 = make_cubin({two_params()});
  patch_le(&x86, 18, 62, 2);
  ByteVec with_x86 = make_fatbin({plain_entry(kTestKindElf, 90, x86)});
  ImageError e = refused(module_kernels(with_x86.data(), 90));
  CHECK(e.fault == ImageFault::kMalformed);
  CHECK(e.message == "fatbin: sm_90 ELF at offset 0x50: ELF: e_machine 62, not EM_CUDA");

  ByteVec contents = to_bytes(std::string(4000, 'a'));
  ByteVec lz4 = make_fatbin({lz4_entry(kTestKindElf, 90, contents)});
  FatbinEntry entry = only_entry(lz4);
  ByteVec garbage(entry.payload.size(), std::byte{0xff});
  entry.payload = garbage;
  CHECK(contents_fault(entry) == ImageFault::kMalformed);

  // cudart's wrapper: null data, data that is no fatbin.
  Wrapper w{int(kFatbinWrapperMagic), 1, nullptr, nullptr};
  CHECK(image_fault(&w, 90) == ImageFault::kMalformed);
  w.data = elf.data();
  CHECK(image_fault(&w, 90) == ImageFault::kMalformed);
}

TEST_CASE("image faults: unknown versions are kUnsupportedVersion") {
  ByteVec b = fatbin_with_cubin(90);
  patch_le(&b, 4, 2, 2);
  CHECK(fatbin_fault(b) == ImageFault::kUnsupportedVersion);
  CHECK(image_fault(b.data(), 90) == ImageFault::kUnsupportedVersion);
  ByteVec good = fatbin_with_cubin(90);
  Wrapper w{int(kFatbinWrapperMagic), 3, good.data(), nullptr};
  ImageError e = refused(module_kernels(&w, 90));
  CHECK(e.fault == ImageFault::kUnsupportedVersion);
  CHECK(e.message == "fatbin wrapper: unknown version 3");
}

TEST_CASE("image faults: both compression flags are kUnsupportedCompression") {
  TestEntry both = zstd_entry(kTestKindElf, 90, make_cubin({two_params()}));
  both.flags |= kTestFlagLz4;
  ByteVec fatbin = make_fatbin({both});
  CHECK(contents_fault(only_entry(fatbin)) == ImageFault::kUnsupportedCompression);
  ImageError e = refused(module_kernels(fatbin.data(), 90));
  CHECK(e.fault == ImageFault::kUnsupportedCompression);
  CHECK_THAT(e.message, Contains("fatbin entry at offset 0x50 (sm_90 ELF, unknown): both LZ4 and ZSTD flags set"));
}

TEST_CASE("image faults: sizes beyond the limits are kTooLarge") {
  ByteVec b = fatbin_with_cubin(90);
  patch_le(&b, 8, kMaxImageSize, 8);
  CHECK(fatbin_fault(b) == ImageFault::kTooLarge);
  CHECK(image_fault(b.data(), 90) == ImageFault::kTooLarge);

  ByteVec zstd = make_fatbin({zstd_entry(kTestKindElf, 90, to_bytes(std::string(4000, 'a')))});
  patch_le(&zstd, kFirstEntry + kEntryUncompressedField, kMaxEntryContentSize + 1, 8);
  CHECK(contents_fault(only_entry(zstd)) == ImageFault::kTooLarge);

  // A cubin handed over by pointer has no length: a section said to lie past
  // the limit is a damaged header, never read.
  CubinLayout layout;
  ByteVec elf = make_cubin({two_params()}, kTestElfFlagsSm90, 8, &layout);
  patch_le(&elf, layout.first_info_section_header + 24, kMaxImageSize, 8);
  ImageError e = refused(module_kernels(elf.data(), 90));
  CHECK(e.fault == ImageFault::kTooLarge);
  CHECK_THAT(e.message, Contains("ELF: section 4 (offset 0x100000000, size 0x"));
  CHECK(refused(image_extent(elf.data())).fault == ImageFault::kTooLarge);
}

TEST_CASE("image faults: every fault has a name") {
  for (ImageFault f : {ImageFault::kUnrecognized, ImageFault::kNoEntryForArch, ImageFault::kPtxOnly,
                       ImageFault::kMalformed, ImageFault::kUnsupportedVersion,
                       ImageFault::kUnsupportedCompression, ImageFault::kTooLarge})
    CHECK(std::string(image_fault_name(f)) != "invalid");
  CHECK(std::string(image_fault_name(ImageFault::kPtxOnly)) == "PTX only");
}

// ---- image extents within bytes (what the fuzzer reads)

TEST_CASE("image_extent over bytes: each kind ends where its headers say, never past the bytes") {
  ByteVec fatbin = fatbin_with_cubin(90);
  ByteVec more = fatbin;
  more.resize(more.size() + 40, std::byte{0xee});
  auto f = read_ok(image_extent(std::span<const std::byte>(more)));
  CHECK(f.kind == ModuleKind::kFatbin);
  CHECK(f.bytes.size() == fatbin.size());
  CHECK(f.bytes.data() == more.data());
  ImageError cut = refused(image_extent(std::span<const std::byte>(fatbin.data(), fatbin.size() - 1)));
  CHECK(cut.fault == ImageFault::kMalformed);
  CHECK_THAT(cut.message, Contains("run past"));

  ByteVec elf = make_cubin({two_params()});
  auto c = read_ok(image_extent(std::span<const std::byte>(elf)));
  CHECK(c.kind == ModuleKind::kCubin);
  CHECK(c.bytes.size() == elf.size());
  ImageError short_elf = refused(image_extent(std::span<const std::byte>(elf.data(), elf.size() - 1)));
  CHECK(short_elf.fault == ImageFault::kMalformed);
  CHECK_THAT(short_elf.message, Contains("ELF: section header table (offset 0x"));

  // No section table (e_shoff 0) whatever e_shnum says: the header alone,
  // for the extent and the kernel reader alike (found by fuzzing, when the
  // reader took the ELF header for a section header).
  ByteVec bare = make_cubin({});
  patch_le(&bare, 40, 0, 8);  // e_shoff
  auto header_only = read_ok(image_extent(std::span<const std::byte>(bare)));
  CHECK(header_only.bytes.size() == 64);
  CHECK(cubin_kernels(bare).empty());
  CHECK(cubin_kernels(ByteVec(bare.begin(), bare.begin() + 64)).empty());

  ByteVec text = to_bytes(std::string(".version 9.0") + '\0' + "after");
  auto p = read_ok(image_extent(std::span<const std::byte>(text)));
  CHECK(p.kind == ModuleKind::kPtx);
  CHECK(p.bytes.size() == 12);
  CHECK(refused(image_extent(std::span<const std::byte>(to_bytes("no NUL")))).fault == ImageFault::kUnrecognized);

  Wrapper w{int(kFatbinWrapperMagic), 1, fatbin.data(), nullptr};
  auto raw = std::as_bytes(std::span(&w, 1));
  CHECK(refused(image_extent(raw)).fault == ImageFault::kUnrecognized);
  CHECK(read_ok(image_extent(&w)).bytes.size() == fatbin.size());  // through the pointer, it is followed
}
