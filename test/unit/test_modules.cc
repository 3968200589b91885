// Module images and the module registry (cuda_hooks/src/module_image.h,
// module_registry.h): kinds, sizes and hashes of synthetic images.
#include <elf.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "module_image.h"
#include "module_registry.h"

using namespace phos::hooks;

namespace {

// A fatbin: 16-byte header (magic, version, header size, fat size) and payload.
std::vector<unsigned char> fatbin(uint64_t payload, unsigned char fill = 0x5a) {
  std::vector<unsigned char> b(16 + payload + 64, 0xee);  // bytes after the fatbin are not part of it
  uint32_t magic = kFatbinMagic;
  uint16_t version = 1, header = 16;
  std::memcpy(b.data(), &magic, 4);
  std::memcpy(b.data() + 4, &version, 2);
  std::memcpy(b.data() + 6, &header, 2);
  std::memcpy(b.data() + 8, &payload, 8);
  std::memset(b.data() + 16, fill, payload);
  return b;
}

// A minimal ELF64 cubin: header, one section of `section` bytes, the section table last.
std::vector<unsigned char> cubin(uint64_t section) {
  Elf64_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS64;
  eh.e_shentsize = sizeof(Elf64_Shdr);
  eh.e_shnum = 2;
  eh.e_shoff = sizeof(eh) + section;
  Elf64_Shdr sh[2]{};
  sh[1].sh_type = SHT_PROGBITS;
  sh[1].sh_offset = sizeof(eh);
  sh[1].sh_size = section;
  std::vector<unsigned char> b(sizeof(eh) + section + sizeof(sh) + 32, 0);
  std::memcpy(b.data(), &eh, sizeof(eh));
  std::memcpy(b.data() + eh.e_shoff, sh, sizeof(sh));
  return b;
}

}  // namespace

TEST_CASE("module image: a fatbin's size is header size plus fat size", "[modules]") {
  auto b = fatbin(1000);
  ModuleImage m = identify_image(b.data());
  CHECK(m.kind == ModuleKind::kFatbin);
  CHECK(m.size == 1016);
  CHECK(m.hash == content_hash(b.data(), 1016));
}

TEST_CASE("module image: cudart's wrapper leads to its fatbin", "[modules]") {
  auto b = fatbin(200);
  struct {
    int magic, version;
    const unsigned long long* data;
    void* filename;
  } wrapper{int(kFatbinWrapperMagic), 1, reinterpret_cast<const unsigned long long*>(b.data()), nullptr};
  ModuleImage m = identify_image(&wrapper);
  CHECK(m.kind == ModuleKind::kFatbin);
  CHECK(m.size == 216);
  CHECK(m.hash == identify_image(b.data()).hash);
}

TEST_CASE("module image: the hash follows the content, not the address", "[modules]") {
  auto a = fatbin(300), b = fatbin(300), c = fatbin(300, 0x5b);
  CHECK(identify_image(a.data()).hash == identify_image(b.data()).hash);
  CHECK(identify_image(a.data()).hash != identify_image(c.data()).hash);
}

TEST_CASE("module image: a cubin ends at its section table", "[modules]") {
  auto b = cubin(500);
  ModuleImage m = identify_image(b.data());
  CHECK(m.kind == ModuleKind::kCubin);
  CHECK(m.size == sizeof(Elf64_Ehdr) + 500 + 2 * sizeof(Elf64_Shdr));
}

TEST_CASE("module image: PTX is its text up to the NUL", "[modules]") {
  const char* ptx = ".version 8.0\n.target sm_90\n";
  ModuleImage m = identify_image(ptx);
  CHECK(m.kind == ModuleKind::kPtx);
  CHECK(m.size == std::strlen(ptx));
}

TEST_CASE("module image: a fatbin with a damaged header is unknown", "[modules]") {
  auto b = fatbin(10);
  uint16_t bad_header = 4;
  std::memcpy(b.data() + 6, &bad_header, 2);
  CHECK(identify_image(b.data()).kind == ModuleKind::kUnknown);
}

TEST_CASE("module image: a file is hashed whole; a missing one is unknown", "[modules]") {
  char path[] = "/tmp/phos-module-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  auto b = cubin(64);
  REQUIRE(::write(fd, b.data(), b.size()) == ssize_t(b.size()));
  ::close(fd);
  ModuleImage m = identify_file(path);
  ::unlink(path);
  CHECK(m.kind == ModuleKind::kFile);
  CHECK(m.size == b.size());
  CHECK(m.hash == content_hash(b.data(), b.size()));
  CHECK(identify_file(path).kind == ModuleKind::kUnknown);
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
