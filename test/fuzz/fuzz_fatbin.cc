// libFuzzer target: the fatbin and cubin readers, which read other people's
// binaries. The input is read as a fatbin (every entry's contents, and the
// kernels of every ELF entry) and as a cubin. Nothing may crash, hang, leak
// or read outside the input; what is read must hold together.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "phos/speculation/fatbin.h"

using namespace phos::speculation;

static void read_kernels(std::span<const std::byte> elf) {
  std::vector<CubinKernel> kernels;
  std::string error;
  if (!read_cubin_kernels(elf, &kernels, &error)) return;
  for (const CubinKernel& k : kernels)
    for (size_t i = 0; i < k.params.size(); i++)
      if (k.params[i].ordinal != i) __builtin_trap();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = std::span(reinterpret_cast<const std::byte*>(data), size);
  std::vector<FatbinEntry> entries;
  std::string error;
  if (read_fatbin(bytes, &entries, &error)) {
    for (const FatbinEntry& e : entries) {
      if (e.offset > size || e.payload.size() > size - e.offset || e.payload.data() != bytes.data() + e.offset)
        __builtin_trap();
      std::vector<std::byte> contents;
      if (entry_contents(e, &contents, &error) && e.kind == FatbinEntryKind::kElf) read_kernels(contents);
    }
  }
  (void)cubin_arch(bytes);
  read_kernels(bytes);
  return 0;
}
