// phos-fatbin-info: what the fatbins inside a binary hold, as phos's reader
// sees them: a shared library or executable (its .nv_fatbin section), a
// fatbin file, or a cubin. Prints the entries by kind, SM version and
// compression, and for one SM version the kernels the cubins describe (how
// many parameters, how many the metadata says are pointers), with the time
// the reading and decompression took. A tool to look at real libraries
// (cuBLAS, libtorch_cuda) with; the unit tests check the reader itself.
// --ptx DIR also writes the PTX entries for compute_SM to DIR/ptx<n>.ptx
// (up to --ptx-count of them, each at most --ptx-max-bytes long), as the
// runtime would get them: the ptx_twins test rewrites a library's PTX so.
//
// usage: phos-fatbin-info FILE [--arch SM] [--kernels] [--ptx DIR [--ptx-count N] [--ptx-max-bytes B]]
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "phos/speculation/demangle.h"
#include "phos/speculation/fatbin.h"

namespace spec = phos::speculation;

namespace {

struct Mapped {
  const std::byte* data = nullptr;
  size_t size = 0;
};

bool map_file(const char* path, Mapped* out) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::perror(path), false;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size == 0) return std::fprintf(stderr, "%s: empty or unreadable\n", path), ::close(fd), false;
  void* p = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return std::perror("mmap"), false;
  out->data = static_cast<const std::byte*>(p);
  out->size = size_t(st.st_size);
  return true;
}

// The .nv_fatbin section of a host ELF file; the whole file where it is a
// fatbin or cubin itself.
bool fatbin_bytes(const Mapped& file, std::span<const std::byte>* out, bool* is_cubin) {
  *is_cubin = false;
  std::span<const std::byte> all(file.data, file.size);
  auto image = spec::image_extent(all);
  if (image && image->kind != spec::ModuleKind::kPtx) {
    *is_cubin = image->kind == spec::ModuleKind::kCubin;
    *out = all;  // fatbins laid end to end are all read
    return true;
  }
  if (!image && image.error().fault != spec::ImageFault::kUnrecognized) {
    std::fprintf(stderr, "%s\n", image.error().message.c_str());
    return false;
  }
  if (file.size < sizeof(Elf64_Ehdr) || std::memcmp(file.data, ELFMAG, SELFMAG) != 0) {
    std::fprintf(stderr, "not a fatbin, cubin or ELF file\n");
    return false;
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, file.data, sizeof(eh));
  if (eh.e_shoff == 0 || eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shstrndx >= eh.e_shnum ||
      eh.e_shoff + uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr) > file.size) {
    std::fprintf(stderr, "ELF section table out of the file\n");
    return false;
  }
  auto section = [&](size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, file.data + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof(sh));
    return sh;
  };
  Elf64_Shdr names = section(eh.e_shstrndx);
  for (size_t i = 0; i < eh.e_shnum; i++) {
    Elf64_Shdr sh = section(i);
    if (sh.sh_name >= names.sh_size || names.sh_offset + names.sh_size > file.size) continue;
    const char* name = reinterpret_cast<const char*>(file.data + names.sh_offset + sh.sh_name);
    if (std::strncmp(name, ".nv_fatbin", names.sh_size - sh.sh_name) != 0 || sh.sh_type == SHT_NOBITS) continue;
    if (sh.sh_offset + sh.sh_size > file.size) break;
    *out = {file.data + sh.sh_offset, sh.sh_size};
    return true;
  }
  std::fprintf(stderr, "no .nv_fatbin section: no device code\n");
  return false;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = nullptr;
  uint32_t arch = 90;
  bool list_kernels = false;
  const char* ptx_dir = nullptr;
  uint64_t ptx_count = UINT64_MAX, ptx_max_bytes = UINT64_MAX;
  const char* usage = "usage: phos-fatbin-info FILE [--arch SM] [--kernels] [--ptx DIR [--ptx-count N] "
                      "[--ptx-max-bytes B]]\n";
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--arch") && i + 1 < argc) arch = uint32_t(std::strtoul(argv[++i], nullptr, 10));
    else if (!std::strcmp(argv[i], "--kernels")) list_kernels = true;
    else if (!std::strcmp(argv[i], "--ptx") && i + 1 < argc) ptx_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--ptx-count") && i + 1 < argc) ptx_count = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--ptx-max-bytes") && i + 1 < argc) ptx_max_bytes = std::strtoull(argv[++i], nullptr, 10);
    else if (argv[i][0] != '-' && !path) path = argv[i];
    else return std::fprintf(stderr, "%s", usage), 2;
  }
  if (!path) return std::fprintf(stderr, "%s", usage), 2;
  Mapped file;
  std::span<const std::byte> bytes;
  bool is_cubin = false;
  if (!map_file(path, &file) || !fatbin_bytes(file, &bytes, &is_cubin)) return 1;

  auto t0 = std::chrono::steady_clock::now();
  std::vector<spec::FatbinEntry> entries;
  if (is_cubin) {
    spec::FatbinEntry e;
    e.kind = spec::FatbinEntryKind::kElf;
    e.arch = spec::cubin_arch(bytes);
    e.payload = bytes;
    e.uncompressed_size = bytes.size();
    entries.push_back(e);
  } else if (auto read = spec::read_fatbin(bytes)) {
    entries = std::move(*read);
  } else {
    std::fprintf(stderr, "%s: %s\n", path, read.error().message.c_str());
    return 1;
  }
  double read_s = seconds_since(t0);
  std::map<std::string, uint64_t> by_kind;
  uint64_t stored = 0, unpacked = 0;
  for (const spec::FatbinEntry& e : entries) {
    by_kind[std::string(spec::fatbin_entry_kind_name(e.kind)) + " sm_" + std::to_string(e.arch) + " " +
            spec::fatbin_compression_name(e.compression)]++;
    stored += e.payload.size();
    unpacked += e.uncompressed_size;
  }
  std::printf("%s: %zu bytes of fatbins, %zu entries (%.1f MiB stored, %.1f MiB unpacked), read in %.3f s\n", path,
              bytes.size(), entries.size(), stored / 1048576.0, unpacked / 1048576.0, read_s);
  for (const auto& [what, n] : by_kind) std::printf("  %6llu  %s\n", (unsigned long long)n, what.c_str());

  // The cubins for `arch`: decompressed and read.
  t0 = std::chrono::steady_clock::now();
  uint64_t cubins = 0, kernels = 0, params = 0, pointer_known = 0, pointers = 0, failed = 0, bytes_out = 0;
  std::string first_error;
  for (const spec::FatbinEntry& e : entries) {
    if (e.kind != spec::FatbinEntryKind::kElf || e.arch != arch) continue;
    auto elf = spec::entry_contents(e);
    auto ks = elf ? spec::read_cubin_kernels(*elf) : elf.error();
    if (!ks) {
      if (failed++ == 0) first_error = ks.error().message;
      continue;
    }
    cubins++;
    bytes_out += elf->size();
    for (const spec::CubinKernel& k : *ks) {
      kernels++;
      for (const spec::CubinParam& p : k.params) {
        params++;
        pointer_known += p.pointer_known;
        pointers += p.pointer_known && p.is_pointer;
      }
      if (list_kernels) {
        std::printf("  kernel %s:", spec::demangle(k.name.c_str()).c_str());
        for (const spec::CubinParam& p : k.params)
          std::printf(" %u@%u%s", p.size, p.offset, p.pointer_known ? (p.is_pointer ? "*" : "") : "?");
        std::printf("\n");
      }
    }
  }
  double cubin_s = seconds_since(t0);

  // The PTX for compute_`arch`, to files (up to its NUL: PTX in a fatbin is
  // a C string).
  uint64_t ptx_written = 0;
  for (const spec::FatbinEntry& e : entries) {
    if (!ptx_dir || ptx_written == ptx_count) break;
    if (e.kind != spec::FatbinEntryKind::kPtx || e.arch != arch || e.uncompressed_size > ptx_max_bytes) continue;
    auto contents = spec::entry_contents(e);
    if (!contents) {
      if (failed++ == 0) first_error = contents.error().message;
      continue;
    }
    const std::vector<std::byte>& text = *contents;
    size_t n = 0;
    while (n < text.size() && text[n] != std::byte{0}) n++;
    std::string out = std::string(ptx_dir) + "/ptx" + std::to_string(ptx_written++) + ".ptx";
    std::ofstream f(out, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(text.data()), std::streamsize(n));
    if (!f.flush()) return std::fprintf(stderr, "cannot write %s\n", out.c_str()), 1;
    std::printf("  ptx %s (%zu bytes)\n", out.c_str(), n);
  }
  std::printf("sm_%u: %llu cubins (%.1f MiB) read in %.3f s (%.0f MiB/s), %llu kernels, %llu parameters, "
              "%llu with pointer information (%llu pointers); %llu cubins unreadable%s%s\n",
              arch, (unsigned long long)cubins, bytes_out / 1048576.0, cubin_s,
              cubin_s > 0 ? bytes_out / 1048576.0 / cubin_s : 0.0, (unsigned long long)kernels,
              (unsigned long long)params, (unsigned long long)pointer_known, (unsigned long long)pointers,
              (unsigned long long)failed, failed ? ": " : "", first_error.c_str());
  return failed ? 1 : 0;
}
