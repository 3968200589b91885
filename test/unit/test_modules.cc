// Module images and the module registry: kinds, sizes and hashes of
// synthetic images as the one reader (identify_image, image_extent in
// phos/speculation/fatbin.h) gives them to the hooks' module registry
// (phos/hooks/module_registry.h).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fatbin_builders.h"
#include "phos/hooks/module_registry.h"
#include "phos/speculation/fatbin.h"

using namespace phos::hooks;
using namespace phos::test;
using phos::speculation::content_hash;
using phos::speculation::kFatbinWrapperMagic;

namespace {

// Bytes after an image are not part of it.
ByteVec followed_by_junk(ByteVec b) {
  b.resize(b.size() + 64, std::byte{0xee});
  return b;
}

// cudart's __fatBinC_Wrapper_t.
struct Wrapper {
  int magic, version;
  const void* data;
  void* filename;
};

const ByteVec kElfish = to_bytes("\x7f" "ELF not really, but the container does not look inside");

}  // namespace

TEST_CASE("module image: a fatbin's size is header size plus fat size", "[modules]") {
  ByteVec exact = make_fatbin({plain_entry(kTestKindElf, 90, kElfish), plain_entry(kTestKindPtx, 90, kElfish)});
  ByteVec b = followed_by_junk(exact);
  ModuleImage m = identify_image(b.data());
  CHECK(m.kind == ModuleKind::kFatbin);
  CHECK(m.size == exact.size());
  CHECK(m.hash == content_hash(exact.data(), exact.size()));
}

TEST_CASE("module image: cudart's wrapper leads to its fatbin", "[modules]") {
  ByteVec exact = make_fatbin({plain_entry(kTestKindElf, 90, kElfish)});
  ByteVec b = followed_by_junk(exact);
  Wrapper w{int(kFatbinWrapperMagic), 1, b.data(), nullptr};
  ModuleImage m = identify_image(&w);
  CHECK(m.kind == ModuleKind::kFatbin);
  CHECK(m.size == exact.size());
  CHECK(m.hash == identify_image(b.data()).hash);
  auto extent = phos::speculation::image_extent(&w);
  REQUIRE(extent);
  CHECK(extent->bytes.data() == b.data());
}

TEST_CASE("module image: the hash follows the content, not the address", "[modules]") {
  ByteVec a = make_fatbin({plain_entry(kTestKindElf, 90, kElfish)}), b = a, c = a;
  c.back() = std::byte{1};
  CHECK(identify_image(a.data()).hash == identify_image(b.data()).hash);
  CHECK(identify_image(a.data()).hash != identify_image(c.data()).hash);
}

TEST_CASE("module image: a cubin ends at the end of its furthest table or section", "[modules]") {
  ByteVec exact = make_cubin({});  // the section headers last, as nvcc places them
  ByteVec b = followed_by_junk(exact);
  ModuleImage m = identify_image(b.data());
  CHECK(m.kind == ModuleKind::kCubin);
  CHECK(m.size == exact.size());
  CHECK(m.hash == content_hash(exact.data(), exact.size()));

  // A section placed after the table extends the image to its end.
  ByteVec longer = exact;
  longer.resize(exact.size() + 100, std::byte{0x11});
  patch_le(&longer, exact.size() - 64 + 24, exact.size() + 36, 8);  // the last section's sh_offset
  patch_le(&longer, exact.size() - 64 + 32, 64, 8);                 // and sh_size
  CHECK(identify_image(longer.data()).size == exact.size() + 100);
}

TEST_CASE("module image: a cubin with its section count in section 0 (e_shnum 0)", "[modules]") {
  // Past 0xff00 sections ELF keeps the count in section 0's sh_size; the
  // image must still reach its last section header.
  ByteVec exact = make_cubin({});
  uint64_t shoff = 0, shnum = 0;
  std::memcpy(&shoff, exact.data() + 40, 8);
  std::memcpy(&shnum, exact.data() + 60, 2);
  ByteVec b = exact;
  patch_le(&b, 60, 0, 2);                // e_shnum
  patch_le(&b, shoff + 32, shnum, 8);    // section 0's sh_size
  b = followed_by_junk(b);
  ModuleImage m = identify_image(b.data());
  CHECK(m.kind == ModuleKind::kCubin);
  CHECK(m.size == exact.size());
}

TEST_CASE("module image: PTX is its text up to the NUL", "[modules]") {
  const char* ptx = ".version 8.0\n.target sm_90\n";
  ModuleImage m = identify_image(ptx);
  CHECK(m.kind == ModuleKind::kPtx);
  CHECK(m.size == std::strlen(ptx));
  CHECK(m.hash == content_hash(ptx, std::strlen(ptx)));
}

TEST_CASE("module image: what the reader cannot size is unknown, without a hash", "[modules]") {
  ByteVec fatbin = make_fatbin({plain_entry(kTestKindElf, 90, kElfish)});
  patch_le(&fatbin, 6, 4, 2);  // a header size below the header's own 16 bytes
  ModuleImage m = identify_image(fatbin.data());
  CHECK(m.kind == ModuleKind::kUnknown);
  CHECK(m.size == 0);
  CHECK(m.hash == 0);

  ByteVec x86 = followed_by_junk(make_cubin({}));
  patch_le(&x86, 18, 62, 2);  // EM_X86_64: an ELF file, but no cubin
  CHECK(identify_image(x86.data()).kind == ModuleKind::kUnknown);

  Wrapper w{int(kFatbinWrapperMagic), 7, fatbin.data(), nullptr};
  CHECK(identify_image(&w).kind == ModuleKind::kUnknown);
  CHECK(identify_image(nullptr).kind == ModuleKind::kUnknown);
}

TEST_CASE("module image: a file is hashed whole; a missing one is unknown", "[modules]") {
  char path[] = "/tmp/phos-module-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ByteVec b = make_cubin({});
  REQUIRE(::write(fd, b.data(), b.size()) == ssize_t(b.size()));
  ::close(fd);
  ModuleImage m = identify_file(path);
  ::unlink(path);
  CHECK(m.kind == ModuleKind::kFile);
  CHECK(m.size == b.size());
  CHECK(m.hash == content_hash(b.data(), b.size()));
  CHECK(identify_file(path).kind == ModuleKind::kUnknown);
  CHECK(identify_file(nullptr).kind == ModuleKind::kUnknown);
}

TEST_CASE("module image: kind names, as phosctl shows them", "[modules]") {
  CHECK(std::string(module_kind_name(ModuleKind::kFatbin)) == "fatbin");
  CHECK(std::string(module_kind_name(ModuleKind::kCubin)) == "cubin");
  CHECK(std::string(module_kind_name(ModuleKind::kPtx)) == "ptx");
  CHECK(std::string(module_kind_name(ModuleKind::kFile)) == "file");
  CHECK(std::string(module_kind_name(ModuleKind::kUnknown)) == "unknown");
}

TEST_CASE("module image: hashes of short inputs differ by length and content", "[modules]") {
  const char z[16] = {};
  CHECK(content_hash(z, 0) != content_hash(z, 1));
  CHECK(content_hash(z, 7) != content_hash(z, 8));
  CHECK(content_hash("abc", 3) != content_hash("abd", 3));
}

TEST_CASE("module registry: functions and kernels name their module", "[modules]") {
  ModuleRegistry r;
  int mod_a = 0, mod_b = 0, f1 = 0, f2 = 0, k1 = 0, derived = 0;
  uint64_t a = r.loaded(&mod_a, {ModuleKind::kFatbin, 10, 1}, "cuLibraryLoadData");
  uint64_t b = r.loaded(&mod_b, {ModuleKind::kPtx, 20, 2}, "cuModuleLoadData");
  r.function(&mod_a, &f1, "vec_add");
  r.function(&mod_b, &f2, "scale");
  r.function(&mod_a, &k1, "reduce");
  r.same_module(&k1, &derived);
  r.global(&mod_a, "table");
  r.global(&mod_a, "table");
  CHECK(r.module_of(&f1) == a);
  CHECK(r.module_of(&f2) == b);
  CHECK(r.module_of(&derived) == a);
  CHECK(r.module_of(&mod_a) == 0);
  auto all = r.modules();
  REQUIRE(all.size() == 2);
  CHECK(all[0].functions == std::vector<std::string>{"vec_add", "reduce"});
  CHECK(all[0].globals == std::vector<std::string>{"table"});
  CHECK(all[1].source == "cuModuleLoadData");
}

TEST_CASE("module registry: a function asked for again is listed once", "[modules]") {
  ModuleRegistry r;
  int mod = 0, f = 0;
  r.loaded(&mod, {}, "x");
  r.function(&mod, &f, "k");
  r.function(&mod, &f, "k");
  CHECK(r.modules()[0].functions.size() == 1);
}

TEST_CASE("module registry: unloading forgets the module and its functions", "[modules]") {
  ModuleRegistry r;
  int mod = 0, f = 0;
  r.loaded(&mod, {}, "x");
  r.function(&mod, &f, "k");
  r.unloaded(&mod);
  CHECK(r.modules().empty());
  CHECK(r.module_of(&f) == 0);
  r.function(&mod, &f, "k");  // a module no longer loaded: ignored
  CHECK(r.module_of(&f) == 0);
}
